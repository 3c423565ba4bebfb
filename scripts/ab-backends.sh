#!/usr/bin/env bash
# Two te-bench builds side by side on every backend (loopback, TCP, shm, RDMA over libfabric's tcp and shm
# providers), alternating A B A B so the machine's drift hits both alike; prints each build's median GB/s
# per backend, block size and mode, and the ratio B/A per pair with its median.
# Usage: scripts/ab-backends.sh A_TE_BENCH B_TE_BENCH [pairs]   (release builds with feature rdma:
#   cargo build --release -p benches --features rdma; build A from the commit to compare against in a
#   worktree of its own)
set -euo pipefail
a=$1
b=$2
pairs=${3:-3}
out=$(mktemp)
run() { # label, binary, pair, te-bench run arguments...
  local label=$1 bin=$2 pair=$3
  shift 3
  "$bin" run "$@" --mode packetized --mode exclusive --total-bytes 512MiB --iterations 3 --json \
    2>/dev/null | sed "s/^{/{\"build\":\"$label\",\"pair\":$pair,/" >>"$out"
}
for block in 4MiB 256KiB; do
  for i in $(seq "$pairs"); do
    for backend in "--backend loopback" "--backend tcp" "--backend shm" \
      "--backend rdma --provider tcp" "--backend rdma --provider shm"; do
      # shellcheck disable=SC2086
      run A "$a" "$i" $backend --block-bytes "$block"
      # shellcheck disable=SC2086
      run B "$b" "$i" $backend --block-bytes "$block"
    done
  done
done
python3 - "$out" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = collections.defaultdict(dict)
for r in rows:
    name = r["backend"] + (":" + r["provider"] if r.get("provider") else "")
    by[(name, r["block_bytes"], r["mode"], r["pair"])][r["build"]] = r["gbps"]
keys = sorted({k[:3] for k in by})
print("| backend | block | mode | A GB/s | B GB/s | B/A per pair | median B/A |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for name, block, mode in keys:
    pairs = [v for k, v in sorted(by.items()) if k[:3] == (name, block, mode) and len(v) == 2]
    if not pairs:
        continue
    ratios = [v["B"] / v["A"] for v in pairs]
    print(f"| {name} | {block >> 10} KiB | {mode} | {statistics.median(v['A'] for v in pairs):.2f} | "
          f"{statistics.median(v['B'] for v in pairs):.2f} | {min(ratios):.3f}-{max(ratios):.3f} | "
          f"{statistics.median(ratios):.3f} |")
PY
rm -f "$out"

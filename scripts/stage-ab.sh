#!/usr/bin/env bash
# Issue 15's "here" figure: TCP through the lanes' staging buffers (host buffers: no GPU) against plain host
# memory, alternating A B A B so drift hits both alike. Prints per pair and the median ratio per block/mode.
# Usage: scripts/stage-ab.sh [pairs]   (needs a release te-bench: cargo build --release -p benches)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(bash scripts/target-dir.sh)/release/te-bench"
pairs=${1:-5}
out=$(mktemp)
for block in 4MiB 256KiB; do
  for i in $(seq "$pairs"); do
    for staged in "" --staged; do
      "$bin" run --backend tcp --mode packetized --mode exclusive --block-bytes "$block" \
        --total-bytes 1GiB --iterations 3 $staged --json 2>/dev/null | sed "s/^{/{\"pair\":$i,/" >>"$out"
    done
  done
done
python3 - "$out" <<'PY'
import collections, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(dict)
for r in rows:
    by[(r["block_bytes"], r["mode"], r["pair"])][r["backend"]] = r["gbps"]
for block in sorted({k[0] for k in by}, reverse=True):
    for mode in ("packetized", "exclusive"):
        pairs = [v for (b, m, _), v in sorted(by.items()) if b == block and m == mode and len(v) == 2]
        ratios = [v["tcp-staged"] / v["tcp"] for v in pairs]
        print(f"{block >> 10} KiB {mode}: plain {statistics.median(v['tcp'] for v in pairs):.2f} GB/s, "
              f"staged {statistics.median(v['tcp-staged'] for v in pairs):.2f} GB/s, ratio per pair "
              f"{min(ratios):.2f}-{max(ratios):.2f}, median {statistics.median(ratios):.2f}")
PY
rm -f "$out"

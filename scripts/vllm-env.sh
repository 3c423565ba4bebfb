#!/usr/bin/env bash
# Makes (or reuses) the environment with official vLLM 0.33.0 that python/tests_vllm runs in, then builds
# this checkout's package into it; prints the environment's path last.
#
# It lives outside the checkout (${KV_TRANSFER_VLLM_ENV:-~/.cache/kv-transfer/vllm-0.33}) and is made once
# per machine: vllm 0.33.0 pulls torch 2.14.0 (a CUDA build; it imports on a machine without a GPU) and
# NVIDIA's wheels, about 9.4 GB and 3-4 minutes from PyPI. Needs what scripts/python-env.sh needs.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${KV_TRANSFER_VLLM_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kv-transfer/vllm-0.33}
pins="vllm==0.33.0 maturin==1.16.0 pytest==9.2.0"

python=${PYTHON:-python3}
if ! "$python" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "vllm-env: $python is missing, older than 3.10 (vLLM 0.33 needs it), or lacks venv/ensurepip" >&2
  exit 1
fi
if [ ! -x "$env_dir/bin/python" ] || [ "$(cat "$env_dir/.pins" 2>/dev/null)" != "$pins" ]; then
  echo "vllm-env: creating $env_dir ($pins; about 9 GB)" >&2
  rm -rf "$env_dir"
  mkdir -p "$(dirname "$env_dir")"
  "$python" -m venv "$env_dir"
  # shellcheck disable=SC2086
  "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check $pins >&2
  "$env_dir/bin/python" -c 'import vllm, torch' >&2
  echo "$pins" > "$env_dir/.pins"
fi
# Built with the features the other environments' builds have (scripts/python-env.sh), so that maturin reuses
# their compiled crates instead of building them again with other features.
MATURIN_PEP517_ARGS="--features etcd,rdma" PATH="$env_dir/bin:$PATH" "$env_dir/bin/python" -m pip install --quiet \
  --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python >&2
echo "$env_dir"

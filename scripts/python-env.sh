#!/usr/bin/env bash
# Makes (or reuses) the Python environment the package's tests run in, then builds the package from this
# checkout and installs it there; prints the environment's path last.
#
# The environment lives outside the checkout (${KV_TRANSFER_PYENV:-~/.cache/kv-transfer/pyenv-test}), so a
# fresh clone on the same machine reuses it: its pinned tools are downloaded once, and only the package
# itself is rebuilt. It needs python3 (>= 3.9) with its venv module and network access to PyPI the first
# time (the pins below: aiohttp for the proxy, ruff and mypy for scripts/python-lint.sh); the build needs
# cargo (the package's native module is this workspace's Rust, built by maturin, with features etcd and
# rdma), protoc, libfabric's headers and libclang (scripts/install-deps.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${KV_TRANSFER_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kv-transfer/pyenv-test}
# What the environment holds; a change here makes it again.
pins="maturin==1.16.0 pytest==9.2.0 numpy==2.4.6 aiohttp==3.14.5 ruff==0.17.6 mypy==2.4.1"

python=${PYTHON:-python3}
if ! "$python" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
  echo "python-env: $python is missing, older than 3.9, or lacks its venv/ensurepip modules" >&2
  echo "python-env: on Debian or Ubuntu: apt-get install python3 python3-venv" >&2
  exit 1
fi
if [ ! -x "$env_dir/bin/python" ] || [ "$(cat "$env_dir/.pins" 2>/dev/null)" != "$pins" ]; then
  echo "python-env: creating $env_dir ($pins)" >&2
  rm -rf "$env_dir"
  mkdir -p "$(dirname "$env_dir")"
  "$python" -m venv "$env_dir"
  # shellcheck disable=SC2086
  "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check $pins
  echo "$pins" > "$env_dir/.pins"
fi
# The package under test, from this checkout: maturin builds the native module (release, locked).
# With the etcd registry (python/tests/test_discovery.py runs it against a real etcd server) and RDMA nodes
# (python/tests/test_transfer.py runs them on libfabric's tcp and shm providers).
MATURIN_PEP517_ARGS="--features etcd,rdma" PATH="$env_dir/bin:$PATH" "$env_dir/bin/python" -m pip install --quiet \
  --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python >&2
echo "$env_dir"

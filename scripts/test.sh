#!/usr/bin/env bash
# The project's test command: installs what the tests need, then runs every test of the workspace, then
# the Python package's tests (in the environment scripts/python-env.sh makes or reuses, with the package
# built from this checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo test --workspace --all-features --locked "$@"
pyenv=$(bash scripts/python-env.sh)
"$pyenv/bin/python" -m pytest -q python/tests

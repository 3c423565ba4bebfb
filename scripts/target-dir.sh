#!/usr/bin/env bash
# Prints the directory cargo builds this workspace into: $CARGO_TARGET_DIR, a `build.target-dir` of a
# cargo config, or ./target, as cargo itself reports it (so scripts find the binaries it built).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --no-deps --format-version 1 --locked |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'

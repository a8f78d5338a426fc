#!/usr/bin/env bash
# The README's first command: set up the host, build the six binaries (cnimesh for `ca init`), and bring up local mode
# (the demo mesh: pods as network namespaces through the real CNI chain, node agent, control plane,
# proxies, traffic and a summary). It stays up; `cnimesh-local down` removes it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Debug: on 2 cores a cold debug build of these is several times faster than a release build
# (thin LTO), and the demo's traffic does not need release speed.
cargo build --quiet -p cnimesh-local -p cnimesh-node -p cnimesh-cni -p cnimesh-proxy -p cnimesh-control -p cnimesh-mirror -p cnimesh-cli
exec "${CARGO_TARGET_DIR:-target}/debug/cnimesh-local" up "$@"

#!/usr/bin/env bash
# The README's first command: set up the host, build the four binaries, and bring up local mode
# (the demo mesh: pods as network namespaces through the real CNI chain, node agent, control plane,
# proxies, traffic and a summary). It stays up; `cnimesh-node local down` removes it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PROFILE=release
cargo build --quiet --profile "$PROFILE" -p cnimesh-node -p cnimesh-cni -p cnimesh-proxy -p cnimesh-control
exec "${CARGO_TARGET_DIR:-target}/$PROFILE/cnimesh-node" local up "$@"

#!/usr/bin/env bash
# The control plane at cluster scale, in Kubernetes mode (control/benches/scale.rs): release
# `cnimesh-control serve --kube` against the in-process API server with N Services × K endpoints
# and up to S Destination streams on real mTLS clients. Prints RSS per endpoint and per stream,
# idle CPU, fan-out latency (p50/p99/max) and server CPU per subscriber per change, and lag under
# churn; with a baseline binary, both side by side with their ratio, measured in the same run.
#
#   scripts/bench-control-scale.sh [BASELINE_BINARY]
#   CNIMESH_SCALE_SERVICES=2000 CNIMESH_SCALE_ENDPOINTS=25 CNIMESH_SCALE_STREAMS=1000,5000 \
#     CNIMESH_SCALE_CHURN_RATE=100 CNIMESH_SCALE_CHURN_SECONDS=30 scripts/bench-control-scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p cnimesh-control --bin cnimesh-control
export CNIMESH_BENCH_CONTROL=${CNIMESH_BENCH_CONTROL:-$PWD/target/release/cnimesh-control}
if [ -n "${1:-}" ]; then export CNIMESH_BENCH_BASELINE_CONTROL=$1; fi
ulimit -n "$(ulimit -Hn)"
exec cargo bench -p cnimesh-control --bench scale

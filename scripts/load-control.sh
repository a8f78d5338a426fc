#!/usr/bin/env bash
# The control plane under load: `cnimesh-control serve` (release build) on loopback
# with STREAMS Destination streams held open and RATE Certify calls a second for SECONDS, printing
# per window the process's RSS, the streams still open, and p50/p99 of Certify and of a new
# Destination Get (to its first update); then the slopes of RSS and Certify p99 over time.
# The streams share CNIMESH_LOAD_CONNECTIONS (default 100) HTTP/2 connections, as many proxies.
#
#   scripts/load-control.sh [SECONDS] [STREAMS] [RATE]      default: 600 10000 100
#   CNIMESH_LOAD_WINDOW=30 CNIMESH_LOAD_CONNECTIONS=200 scripts/load-control.sh 1800
set -euo pipefail
cd "$(dirname "$0")/.."
export CNIMESH_LOAD_SECONDS=${1:-600} CNIMESH_LOAD_STREAMS=${2:-10000} CNIMESH_LOAD_CERTIFY_RATE=${3:-100}
ulimit -n "$(ulimit -Hn)"
exec cargo bench -p cnimesh-control --bench load

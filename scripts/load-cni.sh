#!/usr/bin/env bash
# The plugin under load with a node agent restart: PODS (default 500) concurrent ADDs
# through the real chain (Debian's bridge + host-local, then cnimesh-cni asking a `cnimesh-node run`
# process), the agent SIGKILLed and started again once half of them finished, the failed ones
# retried, then PODS concurrent DELs. Every ADD must either have succeeded with rules and a record
# or failed with code 11 leaving neither; nothing may be left (records, IPAM, bridge ports, tables).
# Prints one table row. Needs root, like the e2e tests.
#
#   scripts/load-cni.sh [PODS]
set -euo pipefail
cd "$(dirname "$0")/.."
CNIMESH_LOAD_PODS=${1:-500} exec cargo nextest run -p cnimesh-e2e --test faults \
    --run-ignored only --no-capture load_adds_and_dels_with_an_agent_restart

#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for SECONDS each and prints, per target, how many
# inputs it executed and whether it crashed. Needs cargo-fuzz (`cargo install cargo-fuzz --locked`);
# its nightly flags are enabled on the stable toolchain with RUSTC_BOOTSTRAP=1.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      default: 60 s, every target
#   FUZZ_ARGS="-max_len=16384" scripts/fuzz.sh 300 proxy_detect
#
# Seeds come from fuzz/corpus/<target>/ (committed, read only); what libFuzzer learns goes to
# fuzz/work/<target>/ and crashing inputs to fuzz/artifacts/<target>/ (both ignored by git).
# Reproduce a crash with: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none <target> <file>
# Exits non-zero if any target crashed.
set -euo pipefail

cd "$(dirname "$0")/../fuzz"
seconds=${1:-60}
shift || true
export RUSTC_BOOTSTRAP=1
# Safe Rust (unsafe is forbidden in the workspace): AddressSanitizer finds little here and costs
# build time and speed; panics, overflow checks and the targets' assertions are the oracles.
flags=(--sanitizer none --codegen-units 16)

if [ $# -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
else
    targets=("$@")
fi
# Build everything first, so a build error is reported as one and not as a crash.
cargo fuzz build "${flags[@]}" >&2

failed=0
summary=()
for t in "${targets[@]}"; do
    mkdir -p "work/$t" "artifacts/$t"
    log="work/$t.log"
    touch "work/$t.start"
    echo "== $t: ${seconds}s" >&2
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of libFuzzer flags
    if cargo fuzz run "${flags[@]}" "$t" "work/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 ${FUZZ_ARGS:-} \
        >"$log" 2>&1; then
        status=ok
    else
        status=CRASH
        failed=1
    fi
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
    [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#' || true)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
    crashes=$(find "artifacts/$t" -type f -newer "work/$t.start" \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' \) | wc -l)
    summary+=("$(printf '%-26s %-6s %12s %8s %8s' "$t" "$status" "${execs:-?}" "${cov:-?}" "$crashes")")
    if [ "$status" = CRASH ]; then
        grep -m1 -E 'panicked at|ERROR: libFuzzer' "$log" >&2 || true
        echo "   log: fuzz/$log" >&2
    fi
done

printf '%-26s %-6s %12s %8s %8s\n' target status execs cov crashes
printf '%s\n' "${summary[@]}"
exit $failed

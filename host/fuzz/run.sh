#!/usr/bin/env bash
# Builds hookd's fuzz targets and runs each for SECONDS (default 60) on stable Rust; exits
# non-zero if any target crashed (the crashing input is left in artifacts/<target>/).
#
#   host/fuzz/run.sh [SECONDS]          every target
#   TARGETS="verify admin" host/fuzz/run.sh 30
#
# Stable has no sanitizers (ASan needs nightly), so the build is `--sanitizer none`: coverage
# instrumentation, debug assertions and overflow checks (see Cargo.toml), no memory checks.
# New interesting inputs go to corpus/<target>/ (ignored by git); the committed seeds in
# seeds/<target>/ are read, never written.
set -euo pipefail

seconds=${1:-60}
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz (once)"
    cargo install cargo-fuzz --locked
fi

flags=(--sanitizer none)
cargo fuzz build "${flags[@]}"
targets=${TARGETS:-$(cargo fuzz list)}

failed=()
summary=()
mkdir -p logs
for target in $targets; do
    mkdir -p "corpus/$target" "artifacts/$target"
    log="logs/$target.log"
    echo "== $target: ${seconds}s"
    status=0
    cargo fuzz run "${flags[@]}" "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -max_len=20000 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [ "$status" -ne 0 ]; then
        failed+=("$target")
        tail -n 40 "$log"
        summary+=("$target: CRASHED after ${execs:-?} executions (log: host/fuzz/$log)")
    else
        summary+=("$target: ${execs:-?} executions in ${seconds}s, 0 crashes")
    fi
done

echo
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -ne 0 ]; then
    echo "crashed: ${failed[*]} (inputs in host/fuzz/artifacts/)" >&2
    exit 1
fi

#!/usr/bin/env bash
# Build the libFuzzer targets (clang, ASan+UBSan, -Dfuzz=true) in build/fuzz
# and run each for a bounded time, from its committed corpus
# (tests/fuzz/corpus/<target>). One line per target, "PASS: fuzz_<t> ..." or
# "FAIL: fuzz_<t> ...", and a non-zero exit on any failure (.ci/test counts
# the lines).
#   bash tests/fuzz/run.sh                              # all, 30 s each
#   ACCUMD_FUZZ_SECONDS=900 bash tests/fuzz/run.sh http # one target, longer
# ACCUMD_FUZZ_JOBS (default 2) targets run at a time. New inputs collect in
# build/fuzz/corpus/<t>, crashing inputs in build/fuzz/crashes/ (never in
# the tree: a fixed crash's input is copied into tests/fuzz/corpus/<t> by hand).
set -uo pipefail
cd "$(dirname "$0")/../.."
top=$PWD
build=$top/build/fuzz
secs=${ACCUMD_FUZZ_SECONDS:-30}
jobs=${ACCUMD_FUZZ_JOBS:-2}
all=(http job_spec conf safetensors ckpt tok records jinja parquet jinja_budget tok_norm)
targets=("${@:-${all[@]}}")
[ $# -gt 0 ] || targets=("${all[@]}")

if ! command -v clang >/dev/null; then
    for t in "${targets[@]}"; do echo "FAIL: fuzz_$t (no clang)"; done
    exit 1
fi
mkdir -p "$top/build"
if [ -d "$build" ]; then setup=(--reconfigure); else setup=(); fi
if ! CC=clang meson setup "${setup[@]}" "$build" -Dfuzz=true -Dtests=false -Dcuda=disabled \
        -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized \
        >"$top/build/fuzz-setup.log" 2>&1 || ! ninja -C "$build" fuzz >"$top/build/fuzz-build.log" 2>&1; then
    tail -20 "$top/build/fuzz-setup.log" "$top/build/fuzz-build.log" 2>/dev/null
    for t in "${targets[@]}"; do echo "FAIL: fuzz_$t (build)"; done
    exit 1
fi

mkdir -p "$build/logs" "$build/crashes"
run_one() {
    local t=$1 exe=$build/tests/fuzz/fuzz_$1 log=$build/logs/$1.log
    mkdir -p "$build/corpus/$t"
    # work corpus first: libFuzzer writes new inputs to the first directory
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
        "$exe" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$build/crashes/$t-" "$build/corpus/$t" "$top/tests/fuzz/corpus/$t" >"$log" 2>&1
    local rc=$? runs
    runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
    if [ "$rc" -eq 0 ]; then
        echo "PASS: fuzz_$t (${runs:-?} runs in ${secs} s)"
    else
        echo "FAIL: fuzz_$t (exit $rc; log $log; crash inputs in $build/crashes/)"
        grep -E 'ERROR: |runtime error:|SUMMARY:|Test unit written' "$log" | head -8
    fi
    return $rc
}

failed=0
pids=()
for t in "${targets[@]}"; do
    run_one "$t" >"$build/logs/$t.result" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
    fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
for t in "${targets[@]}"; do cat "$build/logs/$t.result"; done
exit $failed

#!/usr/bin/env bash
# Stream a large Parquet file through accumd's reader (core/data/parquet.h)
# and report MB/s (file bytes per second of wall time) and the peak RSS:
# bounded memory means the peak stays near one row group's pages, far below
# the file's size.
#   bash bench/parquet.sh [SIZE_MB]      (default 1024)
# The file (tulu-shaped chat rows: id, messages list<struct<role, content>>,
# source; snappy; row groups of 16384 rows) is written once by the npm
# package parquet-wasm (bench/parquet_gen.mjs, pinned by
# tests/parquet/package-lock.json) into build/bench-parquet/. The reader runs
# as tests/support/pq_dump of a release build (build/release, made with
# -Dtests=true if missing), every row to a JSON line into /dev/null, once
# with all columns and once with `messages` alone.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
size=${1:-1024}
rel=$top/build/release
if [ ! -x "$rel/tests/pq_dump" ]; then
    [ -d "$rel" ] || meson setup "$rel" -Dbuildtype=release -Dcuda=disabled -Dtests=true >/dev/null
    ninja -C "$rel" tests/pq_dump >/dev/null
fi
here=$top/tests/parquet
. "$top/tests/support/npm_cache.sh"
npm_cache "$here" parquet
cache=$NPM_CACHE
cp "$top/bench/parquet_gen.mjs" "$cache/"
dir=$top/build/bench-parquet
file=$dir/chat-${size}mb.parquet
mkdir -p "$dir"
[ -f "$file" ] || node "$cache/parquet_gen.mjs" "$file" "$size"
bytes=$(stat -c %s "$file")
cat "$file" > /dev/null # the page cache warm: the reader is measured, not the disk
run() { # label, extra pq_dump arguments
    local label=$1 t0 t1 rss
    shift
    t0=$(date +%s.%N)
    /usr/bin/time -f '%M %U %S' -o "$dir/rss" "$rel/tests/pq_dump" "$file" "$@" > /dev/null
    t1=$(date +%s.%N)
    read -r rss usr sys < "$dir/rss"
    # MB/s of wall time, and of CPU time (what a loaded machine does not change)
    awk -v b="$bytes" -v t0="$t0" -v t1="$t1" -v rss="$rss" -v cpu="$(echo "$usr + $sys" | bc)" -v l="$label" \
        'BEGIN { printf "parquet %-14s %8.1f MB  %6.2f s  %7.1f MB/s  %6.2f CPU s  %7.1f MB/CPU s  peak RSS %6.1f MiB\n",
                 l, b / 1e6, t1 - t0, b / 1e6 / (t1 - t0), cpu, b / 1e6 / cpu, rss / 1024 }'
}
run "all columns"
run "messages" messages

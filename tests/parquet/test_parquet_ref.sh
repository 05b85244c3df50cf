#!/usr/bin/env bash
# The Parquet reader (core/data/parquet.h) against an independent writer:
# make_parquet.mjs writes, with the npm package parquet-wasm (Apache Arrow's
# Rust `parquet` crate), chat / prompt_completion / text files in every
# combination of {none, snappy, gzip, zstd} x {dictionary, plain} x {data
# page v1, v2}, several row groups and pages each, with nulls, empty lists,
# null list elements and non-ASCII text; every row pq_dump reads must equal
# the row the writer was given (compare.py), and reading a chosen column
# gives that column alone. Then damaged copies (cut, bytes flipped) must fail
# with a message naming the file (and, past the footer, the row group and
# column), never crash.
# Pinned packages (package.json + package-lock.json beside this script) are
# installed with `npm ci --ignore-scripts` into a cache outside the tree.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dump=${PQ_DUMP:?PQ_DUMP: path of the pq_dump program}
py=/usr/bin/python3
. "$here/../support/need.sh"
command -v node >/dev/null && command -v npm >/dev/null || need_missing "node/npm not installed"

. "$here/../support/npm_cache.sh"
npm_cache "$here" parquet
cache=$NPM_CACHE
# ES modules resolve packages from the script's folder: run it from the cache
cp "$here/make_parquet.mjs" "$cache/"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
node "$cache/make_parquet.mjs" "$work/pq"

fail=0
n=0
for f in "$work"/pq/*.parquet; do
    name=$(basename "$f" .parquet)
    if ! "$dump" "$f" > "$work/$name.ours" 2> "$work/$name.err"; then
        echo "FAIL $name: $(cat "$work/$name.err")"
        fail=1
        continue
    fi
    "$py" "$here/compare.py" "$work/pq/$name.jsonl" "$work/$name.ours" "$name" || fail=1
    n=$((n + 1))
done
[ "$n" -eq 48 ] || { echo "FAIL: $n of 48 files read"; fail=1; }

# a projection reads the chosen columns only
"$dump" "$work/pq/chat-zstd-dict-v2.parquet" messages > "$work/proj.ours"
"$py" "$here/compare.py" --only messages "$work/pq/chat-zstd-dict-v2.jsonl" "$work/proj.ours" projection || fail=1

# damaged files: a clear error naming the file, no crash (exit 1, not a signal)
src="$work/pq/chat-snappy-dict-v1.parquet"
size=$(stat -c %s "$src")
damaged() { # name, then the command that makes $work/bad.parquet
    local what=$1 rc=0
    shift
    cp "$src" "$work/bad.parquet"
    "$@"
    "$dump" "$work/bad.parquet" > /dev/null 2> "$work/bad.err" || rc=$?
    if [ "$rc" -ne 1 ] || ! grep -q '^bad.parquet: ' "$work/bad.err"; then
        echo "FAIL damaged ($what): exit $rc, message: $(head -c 300 "$work/bad.err")"
        fail=1
    fi
}
flip() { printf "\\x$2" | dd of="$work/bad.parquet" bs=1 seek="$1" conv=notrunc status=none; }
damaged "cut in half" truncate -s $((size / 2)) "$work/bad.parquet"
damaged "no magic" flip 0 41
damaged "footer length" flip $((size - 6)) 7f
for off in 4 40 200 1000 3000 6000; do
    damaged "byte $off" flip "$off" ff
    # a page's bytes damaged: the message names row group and column
    if [ "$off" -ge 200 ] && grep -q 'row group' "$work/bad.err" && ! grep -q 'column ' "$work/bad.err"; then
        echo "FAIL damaged (byte $off): no column named: $(cat "$work/bad.err")"
        fail=1
    fi
done
[ "$fail" -eq 0 ] && echo "parquet_ref: $n files x rows equal to the writer's input, projection and damaged files ok"
exit $fail

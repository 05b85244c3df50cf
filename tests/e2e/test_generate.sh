#!/bin/bash
# POST /v1/generate through the real daemon (issue 24), driven with curl:
#   - a tiny LLaMA-architecture model (tests/support/make_tiny_llama.py, a
#     byte-level tokenizer: tests/support/byte_tokenizer.py) answers; its
#     greedy tokens are, at every step, an argmax of the PyTorch reference's
#     logits (tests/support/llama_ref.py, float64) on the same weights;
#   - "stream": true is SSE: token events whose texts add up to the done
#     event's text and whose ids are its tokens; a seeded sampled answer is
#     the same twice; a chat (messages) answers through the template;
#   - bad inputs are a 400 naming the field: an unknown model or job, a
#     prompt longer than the model's positions, sampling values out of
#     range, unknown keys;
#   - 50 concurrent requests on one device are queued (positions > 1 seen)
#     and all answered while GET /v1/jobs keeps answering within 2 s;
#   - a client that goes away frees the device: queued behind a job it is
#     dropped; running (a larger model, a long answer) its worker is killed
#     and the device is lent to nobody and free for a job again.
# Skips (77) without torch in /usr/bin/python3.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
SUP="$ACCUMD_SRC/tests/support"
. "$SUP/need.sh"
"$PY" -c 'import torch' 2>/dev/null || need_missing "no torch in $PY"

acc_data
D=$STATE/data
printf '%s' "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}" \
    >"$ACC_TMP/chat.jinja"
"$PY" "$SUP/byte_tokenizer.py" "$ACC_TMP/tok" "$ACC_TMP/chat.jinja" || fail "byte_tokenizer"
# the tiny model (2 layers of 64 channels, 64 positions) with the byte
# tokenizer's vocabulary, and a larger one whose long answer takes seconds
# (the disconnect test)
"$PY" - "$D/tiny" "$D/slow" "$D/tiny16" <<EOF || fail "make_tiny_llama"
import sys
sys.path.insert(0, "$SUP")
import make_tiny_llama as m
c = m.make_config(["big"])
c.update(vocab_size=258)
m.save(sys.argv[1], c, m.make_params(c, 3), 1, m.torch.float32)
c16 = dict(c, torch_dtype="bfloat16")  # bf16 weights: a bf16 key/value cache
m.save(sys.argv[3], c16, m.make_params(c16, 3), 1, m.torch.bfloat16)
# positions enough for a cache larger than the device (the 400 below)
c.update(hidden_size=768, intermediate_size=1536, num_hidden_layers=8, max_position_embeddings=70000)
m.save(sys.argv[2], c, m.make_params(c, 7), 1, m.torch.float32)
EOF
for d in tiny slow tiny16; do cp "$ACC_TMP/tok/"* "$D/$d/" || fail "copying the tokenizer"; done
echo '{"bos_token_id": 0}' >"$D/slow/generation_config.json" # no eos: it runs to max_new_tokens

acc_start --set cpu_devices=1 --set cpu_device_memory=2G --set cpu_threads_per_device=1 --set generate_nice=7

gen() { acc_curl -X POST --data-binary "$1" "$BASE/v1/generate"; }

# ---- an answer, against the reference ----------------------------------------
out=$(gen '{"model":"tiny","prompt":"Hello, world","max_new_tokens":12,"temperature":0}')
echo "$out" | jq -e '.tokens | length > 0' >/dev/null || fail "no tokens: $out"
echo "$out" | jq -e '(.tokens | length) == .completion_tokens and .model == "tiny" and (.text | type) == "string"' \
    >/dev/null || fail "answer shape: $out"
echo "$out" | jq -e '.finish_reason == "length" or .finish_reason == "eos"' >/dev/null || fail "finish_reason: $out"
expect_eq "prompt ids" "$(echo "$out" | jq -c '.prompt_ids')" \
    "$("$PY" -c 'import json,sys; print(json.dumps([b + 2 for b in sys.argv[1].encode()], separators=(",", ":")))' 'Hello, world')"
echo "$out" >"$ACC_TMP/greedy.json"
"$PY" - "$D/tiny" "$ACC_TMP/greedy.json" <<EOF || fail "greedy tokens are not the reference's argmax"
import json, sys, torch
sys.path.insert(0, "$SUP")
import llama_ref as ref
cfg, P = ref.load_params(sys.argv[1], True)
a = json.load(open(sys.argv[2]))
seq = list(a["prompt_ids"])
for i, t in enumerate(a["tokens"]):
    with torch.no_grad():
        logits = ref.forward(cfg, P, torch.tensor([seq]))[0, -1, :cfg.V]
    top = logits.max().item()
    # the daemon's token is an argmax (within fp32 rounding of a tie)
    assert logits[t].item() >= top - 1e-4, f"step {i}: token {t} logit {logits[t].item()} < max {top} (id {logits.argmax().item()})"
    seq.append(t)
print("reference: %d greedy tokens agree" % len(a["tokens"]))
EOF
ok "a greedy answer matches the PyTorch reference"

# ---- streaming ---------------------------------------------------------------------
acc_curl -N -X POST --data-binary '{"model":"tiny","prompt":"Hello, world","max_new_tokens":12,"stream":true}' \
    "$BASE/v1/generate" >"$ACC_TMP/stream.txt"
grep -q '^event: started' "$ACC_TMP/stream.txt" || fail "stream: no started event: $(head -c 500 "$ACC_TMP/stream.txt")"
grep -q '^event: done' "$ACC_TMP/stream.txt" || fail "stream: no done event"
sed -n 's/^data: //p' "$ACC_TMP/stream.txt" >"$ACC_TMP/stream.data"
"$PY" - "$ACC_TMP/stream.data" "$ACC_TMP/greedy.json" <<'EOF' || fail "stream: tokens do not add up to the answer"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
toks = [e for e in ev if "text" in e and "finish_reason" not in e]
done = [e for e in ev if "finish_reason" in e][0]
assert [t["id"] for t in toks if "id" in t] == done["tokens"], (toks, done)
assert "".join(t["text"] for t in toks) == done["text"], (toks, done)
assert done["tokens"] == json.load(open(sys.argv[2]))["tokens"], "greedy differs between stream and JSON"
EOF
ok "streamed tokens add up to the answer (and equal the JSON answer's)"

# accumctl generate: the same greedy answer, printed as it comes
"$ACCUMCTL" --url "$BASE" generate tiny "Hello, world" --max-new-tokens 12 >"$ACC_TMP/ctl.txt" 2>"$ACC_TMP/ctl.err" ||
    fail "accumctl generate: $(cat "$ACC_TMP/ctl.err")"
"$PY" - "$ACC_TMP/ctl.txt" "$ACC_TMP/greedy.json" <<'EOF' || fail "accumctl generate printed another answer"
import json, sys
got = open(sys.argv[1], encoding="utf-8", errors="surrogateescape").read()
want = json.load(open(sys.argv[2]))["text"] + "\n"
assert got == want, (got, want)
EOF
"$ACCUMCTL" --url "$BASE" generate tiny "x" --temperature -1 2>"$ACC_TMP/ctl.err"
expect_eq "accumctl generate: a bad value's exit code" "$?" 3
grep -q temperature "$ACC_TMP/ctl.err" || fail "accumctl generate: the error does not name temperature: $(cat "$ACC_TMP/ctl.err")"
ok "accumctl generate prints the answer; a bad value is exit code 3 naming the key"

a=$(gen '{"model":"tiny","prompt":"abc","max_new_tokens":10,"temperature":1.0,"top_k":40,"top_p":0.9,"seed":42}' | jq -c .tokens)
b=$(gen '{"model":"tiny","prompt":"abc","max_new_tokens":10,"temperature":1.0,"top_k":40,"top_p":0.9,"seed":42}' | jq -c .tokens)
[ -n "$a" ] && [ "$a" != null ] || fail "sampled: no tokens"
expect_eq "a seeded sample, twice" "$b" "$a"
out=$(gen '{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_new_tokens":4}')
expect_eq "chat prompt ids" "$(echo "$out" | jq -c '.prompt_ids')" \
    "$("$PY" -c 'import json; print(json.dumps([b + 2 for b in "<user>Hi<assistant>".encode()], separators=(",", ":")))')"
ok "seeded sampling repeats; a conversation goes through the chat template"

# ---- bad input -----------------------------------------------------------------------
expect_error POST /v1/generate '{"model":"nope","prompt":"x"}' 400 model
expect_error POST /v1/generate '{"model":"job:j999999","prompt":"x"}' 400 model
expect_error POST /v1/generate '{"prompt":"x"}' 400 model
expect_error POST /v1/generate '{"model":"tiny","prompt":"x","temprature":1}' 400 temprature
expect_error POST /v1/generate '{"model":"tiny"}' 400 prompt
expect_error POST /v1/generate '{"model":"tiny","prompt":"x","messages":[]}' 400 messages
expect_error POST /v1/generate "{\"model\":\"tiny\",\"prompt\":\"$(printf 'x%.0s' $(seq 70))\"}" 400 prompt
expect_error POST /v1/generate '{"model":"tiny","prompt":"x","temperature":-1}' 400 temperature
expect_error POST /v1/generate '{"model":"tiny","prompt":"x","top_p":2}' 400 top_p
expect_error POST /v1/generate '{"model":"tiny","prompt":"x","top_k":-3}' 400 top_k
expect_error POST /v1/generate '{"model":"tiny","prompt":"x","max_new_tokens":0}' 400 max_new_tokens
expect_error POST /v1/generate '{"model":"tiny","prompt":"x","repetition_penalty":0}' 400 repetition_penalty
expect_error POST /v1/generate '{"model":"tiny","prompt":"x","stop":[1]}' 400 stop
expect_error POST /v1/generate '{"model":"tiny","prompt":"x","stream":"yes"}' 400 stream
expect_error POST /v1/generate '{"model":"tiny","prompt":' 400 ""
expect_error GET /v1/generate '' 405 ""
# a cache larger than the device (2G): max_new_tokens named, with the numbers and what fits
# ("go" is 2 tokens: 65538 positions; 8 layers x 2 x 4 heads x 192 x 4 bytes each)
body=$(acc_curl -X POST --data-binary '{"model":"slow","prompt":"go","max_new_tokens":65536}' "$BASE/v1/generate")
expect_eq "a cache past the device: field" "$(echo "$body" | jq -r .error.field)" max_new_tokens
msg=$(echo "$body" | jq -r .error.message)
echo "$msg" | grep -Fq "key/value cache for 65538 positions is $((8 * 2 * 4 * 192 * 65538 * 4)) bytes (8 layers x 2 x 4 key/value heads x head_dim 192 x 65538 positions x 4 bytes)" ||
    fail "the 400 does not give the cache's numbers: $msg"
echo "$msg" | grep -Fq "largest device's $((2 << 30))" || fail "the 400 does not give the device's bytes: $msg"
fit=$(echo "$msg" | sed -n 's/.*at most \([0-9]*\) new tokens fit.*/\1/p')
[ -n "$fit" ] && [ "$fit" -gt 3000 ] && [ "$fit" -lt 65536 ] || fail "no sensible count of the tokens that fit: $msg"
expect_error POST /v1/generate "{\"model\":\"slow\",\"prompt\":\"go\",\"max_new_tokens\":$((fit + 1))}" 400 max_new_tokens
ok "bad input: 400s naming the field; a cache past the device names max_new_tokens and how many fit"

# ---- device bytes: the reservation is what the worker held, to the byte (CPU) -----------------
for m in tiny tiny16; do
    for n in 3 40; do
        out=$(gen "{\"model\":\"$m\",\"prompt\":\"Hello, world\",\"max_new_tokens\":$n}")
        p=$(echo "$out" | jq .device_planned_bytes) h=$(echo "$out" | jq .device_peak_bytes)
        [ "$p" -gt 0 ] 2>/dev/null || fail "$m: no device_planned_bytes: $out"
        expect_eq "$m, $n new tokens: device bytes held (planned $p)" "$h" "$p"
    done
done
ok "a generation's device bytes: weights + key/value cache (fp32, bf16) + scratch, measured = planned"

# ---- a job's model: job:<id> (its export), and its sample answers ----------------------------
cp -r "$ACC_TMP/tok" "$D/tok"
"$PY" - "$D/chat.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"Say {i}"},
                                         {"role": "assistant", "content": f"{i} {i} {i}"}]}) + "\n")
EOF
sid=$(acc_submit '{"name":"samples","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":64,"vocab_size":258},"data":{"train":"chat.jsonl","format":"chat","tokenizer":"tok","chat_template":"chatml"},"train_batch_size":4,"max_steps":4,"eval_interval":2,"optimizer":{"lr":0.01},"eval_prompts":["Hi",[{"role":"user","content":"Say 3"}]]}')
acc_wait_state "$sid" succeeded 120
out=$(gen "{\"model\":\"job:$sid\",\"prompt\":\"Say\",\"max_new_tokens\":5}")
echo "$out" | jq -e ".completion_tokens >= 1 and .model == \"job:$sid\"" >/dev/null || fail "job:$sid: $out"
ok "job:$sid (its export) answers"
# a LoRA job's export is its adapters (PEFT's directory): applied on its base
lid=$(acc_submit '{"name":"lora","model":{"from":"tiny","seq_len":64},"lora":{"r":4},"data":{"train":"chat.jsonl","format":"chat","tokenizer":"tok","chat_template":"chatml"},"train_batch_size":4,"max_steps":2,"optimizer":{"lr":0.05}}')
acc_wait_state "$lid" succeeded 120
out=$(gen "{\"model\":\"job:$lid\",\"prompt\":\"Say\",\"max_new_tokens\":5}")
echo "$out" | jq -e ".completion_tokens >= 1 and .model == \"job:$lid\"" >/dev/null || fail "job:$lid (LoRA): $out"
ok "job:$lid (a LoRA job: adapters on its base) answers"

# ---- the dashboard's chat page in Chromium (tests/web/chat.test.mjs) -----------------------
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
WEB=$ACCUMD_SRC/tests/web
if command -v node >/dev/null && command -v npm >/dev/null && [ -x "$CHROMIUM" ]; then
    key=$(sha256sum "$WEB/package-lock.json" | cut -c1-16)
    PW=${XDG_CACHE_HOME:-$HOME/.cache}/accumd-npm/web-$key
    if [ ! -f "$PW/node_modules/playwright-core/package.json" ]; then # as test_dashboard.sh installs it
        mkdir -p "$(dirname "$PW")"
        tmp=$(mktemp -d "$PW.tmp.XXXXXX")
        cp "$WEB/package.json" "$WEB/package-lock.json" "$tmp/"
        (cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund >npm.log 2>&1) ||
            fail "npm ci in $tmp failed: $(tail -5 "$tmp/npm.log")"
        mv -T "$tmp" "$PW" 2>/dev/null || rm -rf "$tmp"
    fi
    ART=${ACCUMD_BUILD_DIR:-$ACC_TMP}/tests/dashboard
    mkdir -p "$ART"
    BASE=$BASE ART=$ART PW=$PW CHROMIUM=$CHROMIUM SAMPLE_JOB=$sid timeout 200 node "$WEB/chat.test.mjs" || fail "chat page test failed"
    ok "the chat page streams a conversation's answers; the job page shows the sample answers by step (Chromium)"
else
    echo "skip($TEST_NAME): the chat page test needs node, npm and $CHROMIUM" # the rest still runs
fi
# the web test's answers counted from here
before=$(acc_curl "$BASE/metrics" | sed -n 's/^accumd_generate_requests_total{result="completed"} //p')

# ---- 50 at once on one device, the API answering meanwhile ---------------------------------
pids=
for i in $(seq 1 50); do
    acc_curl -N -X POST --data-binary "{\"model\":\"tiny\",\"prompt\":\"request $i\",\"max_new_tokens\":16,\"stream\":true}" \
        "$BASE/v1/generate" >"$ACC_TMP/c$i.txt" &
    pids="$pids $!"
done
slow=0
for i in $(seq 1 40); do
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$BASE/v1/jobs") || slow=$((slow + 1))
    [ "$code" = 200 ] || slow=$((slow + 1))
    sleep 0.05
done
wait $pids
[ "$slow" -eq 0 ] || fail "GET /v1/jobs did not answer within 2 s $slow times of 40 under 50 generate requests"
for i in $(seq 1 50); do
    grep -q '^event: done' "$ACC_TMP/c$i.txt" || fail "request $i has no answer: $(head -c 400 "$ACC_TMP/c$i.txt")"
done
maxpos=$(cat "$ACC_TMP"/c*.txt | sed -n 's/^data: {"position":\([0-9]*\)}/\1/p' | sort -n | tail -1)
[ "${maxpos:-0}" -gt 1 ] || fail "no request was queued behind others (max position '${maxpos:-}')"
prom=$(acc_curl "$BASE/metrics")
echo "$prom" | grep -q "^accumd_generate_requests_total{result=\"completed\"} $((before + 50))\$" ||
    fail "metrics: completed: $(echo "$prom" | grep accumd_generate)"
ok "50 concurrent requests queued (positions up to $maxpos) and answered; GET /v1/jobs kept answering"

# ---- a client that goes away frees the device --------------------------------------------
# running: the slow model's long answer, the client gone after its first tokens
curl -s -N -X POST --data-binary '{"model":"slow","prompt":"go","max_new_tokens":3000,"stream":true}' \
    "$BASE/v1/generate" >"$ACC_TMP/slow.txt" & # curl itself (not a function's subshell): killed below
cpid=$!
for i in $(seq 1 300); do grep -q '^event: token' "$ACC_TMP/slow.txt" && break; sleep 0.1; done
grep -q '^event: token' "$ACC_TMP/slow.txt" || fail "the slow model sent no token"
[ "$(acc_curl "$BASE/v1/devices" | jq -r '.devices[0].generate')" != null ] || fail "the device is not lent"
# its worker: this daemon's executable (argv[0], as ps shows it), every thread generate_nice below the daemon
wpid=$(pgrep -P "$ACC_PID" -f -- '--generate gen-' | head -1)
[ -n "$wpid" ] || fail "no generate worker under the daemon"
expect_eq "worker argv[0]" "$(tr '\0' '\n' <"/proc/$wpid/cmdline" | head -1)" "$(readlink -f "$ACCUMD")"
dnice=$(sed 's/.*) //' "/proc/$ACC_PID/stat" | awk '{print $17}')
wnice=$((dnice + 7 < 19 ? dnice + 7 : 19))
nthreads=0
for t in /proc/"$wpid"/task/*; do
    expect_eq "nice of worker thread ${t##*/}" "$(sed 's/.*) //' "$t/stat" | awk '{print $17}')" "$wnice"
    nthreads=$((nthreads + 1))
done
[ "$nthreads" -ge 2 ] || fail "worker $wpid has $nthreads threads: the heartbeat thread is missing"
kill "$cpid"; wait "$cpid" 2>/dev/null
for i in $(seq 1 100); do
    [ "$(acc_curl "$BASE/v1/devices" | jq -r '.devices[0].generate')" = null ] && break
    sleep 0.1
done
expect_eq "device lent after the client left" "$(acc_curl "$BASE/v1/devices" | jq -r '.devices[0].generate')" null
grep -q '^event: done' "$ACC_TMP/slow.txt" && fail "the slow answer finished: the test proves nothing"
acc_curl "$BASE/metrics" | grep -q '^accumd_generate_requests_total{result="cancelled"} 1$' || fail "not counted cancelled"
# queued behind a job: dropped, and the job still runs alone
id=$(acc_submit "$(tiny_job hold 100000)")
acc_wait_state "$id" running
acc_curl -N -m 2 -X POST --data-binary '{"model":"tiny","prompt":"x","stream":true}' "$BASE/v1/generate" \
    >"$ACC_TMP/q.txt"
grep -q '^data: {"position":1}' "$ACC_TMP/q.txt" || fail "not queued behind the job: $(cat "$ACC_TMP/q.txt")"
for i in $(seq 1 50); do
    acc_curl "$BASE/metrics" | grep -q '^accumd_generate_queued 0$' && break
    sleep 0.1
done
acc_curl "$BASE/metrics" | grep -q '^accumd_generate_queued 0$' || fail "the queued request stayed after its client left"
acc_curl -X DELETE "$BASE/v1/jobs/$id" >/dev/null
acc_wait_state "$id" cancelled
out=$(gen '{"model":"tiny","prompt":"after","max_new_tokens":3}')
echo "$out" | jq -e '.completion_tokens >= 1' >/dev/null || fail "no answer after the disconnects: $out"
ok "a client that leaves frees its device (running: worker killed; queued: dropped); the worker ran generate_nice below the daemon"

acc_stop

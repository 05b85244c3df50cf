#!/bin/bash
# Issue 25, defect 3: a cancel is durable and reaches a job stuck in data
# preparation. From the 11th record on, every record meets a slow branch of
# the tokenizer's chat template (the submit check renders only the first 8);
# each stays inside the render budget (2 s a record, docs/data.md), so the
# preparation is long but never fails:
#   - DELETE answers 202 only once the request is stored: the view says
#     cancel_requested (with its time) and so does the stored status;
#   - a SIGTERM right after it, then a restart: the job is `cancelled` at
#     once, never requeued;
#   - a second such job, cancelled while the daemon runs, ends `cancelled`
#     (its worker killed after cancel_grace, 30 s, if it cannot stop);
#   - no two successive stored `progress` events of a job say the same
#     (a stage stuck on one record is not reported every 100 ms).
# The tokenizer: byte-level BPE, no merges (tests/support/byte_tokenizer.py).
. "$(dirname "$0")/lib.sh"

acc_data
D=$STATE/data
# the chat template: slow only for a record that says 'slow'
cat >"$ACC_TMP/slow.jinja" <<'EOF'
{% if messages[0].content == 'slow' %}{% for i in range(20000) %}{% if i < 0 %}x{% endif %}{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}
{% endfor %}
EOF
python3 "$ACCUMD_SRC/tests/support/byte_tokenizer.py" "$D/tok" "$ACC_TMP/slow.jinja" || fail "writing the tokenizer"
python3 - "$D" <<'EOF' || fail "writing the test files"
import json, sys
d = sys.argv[1]
with open(f"{d}/chat.jsonl", "w") as f:
    for i in range(400):
        q = "slow" if i >= 10 else f"question {i}?"
        f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                         {"role": "assistant", "content": f"answer {i}."}]}) + "\n")
EOF
spec() { printf '{"name":"%s","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":64,"vocab_size":258},"data":{"train":"chat.jsonl","format":"chat","tokenizer":"tok","chat_template":"auto","train_on":"all"},"train_batch_size":4,"max_steps":1000000}' "$1"; }

# started and preparing (or, where templates are fast, training)
wait_started() {
    acc_wait_state "$1" running 60
    local i
    for i in $(seq 1 300); do
        acc_events_text "$1" | grep -q '"type":"progress"' && return 0
        sleep 0.1
    done
    fail "job $1 reported no progress"
}

# no two successive progress events with the same stage, done and total
check_progress() {
    local dup
    dup=$(acc_events_text "$1" | jq -s '[.[] | select(.type == "progress") | [.stage, .done, .total]] as $p |
        [range(1; $p | length) | select($p[.] == $p[. - 1])] | length')
    [ "$dup" = 0 ] || fail "job $1: $dup progress events repeat the one before them"
}

acc_start --set shutdown_grace=5
s=$(acc_submit "$(spec stuck)")
wait_started "$s"
sleep 2
check_progress "$s" # stuck on record 11 meanwhile: nothing new to report
code=$(acc_curl -o "$ACC_TMP/del.json" -w '%{http_code}' -X DELETE "$BASE/v1/jobs/$s")
expect_eq "DELETE of the stuck job" "$code" 202
acc_curl "$BASE/v1/jobs/$s" | jq -e '.cancel_requested == true and (.cancel_requested_at | type) == "string"' \
    >/dev/null || fail "the job view does not show the cancel: $(acc_curl "$BASE/v1/jobs/$s")"
acc_db "SELECT status FROM jobs WHERE id = '$s'" | jq -e '.cancel_requested_at > 0' >/dev/null ||
    fail "the cancel is not in the stored status: $(acc_db "SELECT status FROM jobs WHERE id = '$s'")"
acc_stop 30
ok "DELETE 202 after the cancel was stored (view and store say so)"

acc_start --set shutdown_grace=5
expect_eq "the cancelled job after a restart" "$(acc_state "$s")" cancelled
sleep 3
expect_eq "the cancelled job 3 s after the restart" "$(acc_state "$s")" cancelled
acc_events_text "$s" | jq -e 'select(.type == "state" and .state == "queued" and .from == "running")' >/dev/null &&
    fail "the cancelled job was requeued"
ok "a cancel requested before a SIGTERM ends the job cancelled at the restart, not requeued"

t=$(acc_submit "$(spec stuck2)")
wait_started "$t"
code=$(acc_curl -o /dev/null -w '%{http_code}' -X DELETE "$BASE/v1/jobs/$t")
expect_eq "DELETE of the second stuck job" "$code" 202
acc_wait_state "$t" cancelled 75
ok "a job stuck in data preparation ends cancelled after DELETE"

check_progress "$s"
check_progress "$t"
ok "progress events only on progress"
acc_stop

#!/bin/bash
# Issue 16, the paths a spec reaches and what submit refuses (defects 2, 3,
# 12, 20), against the real daemon:
#  - a symlink out of the data root is refused by its name AND by a glob
#    matching it (text and tokens), and the error never quotes the target;
#  - a FIFO as data.train (by name or glob) is a quick 400 naming the field,
#    and the API (/healthz included) keeps answering; a submission whose
#    validation is held open (test hook) is not acknowledged until it ends,
#    while /healthz and GET /v1/jobs answer meanwhile;
#  - resume_from naming the output root itself, and a model whose state is
#    larger than any device, are 400s at submit (not a 201 that fails later);
#  - a symlink planted at output_root/<next id> is never followed: the id is
#    skipped and nothing is written where the symlink points.
. "$(dirname "$0")/lib.sh"

acc_data
ln -s /etc/passwd "$STATE/data/passwd-link"
mkfifo "$STATE/data/pipe.txt"
HOLD=$ACC_TMP/hold
ACCUMD_TEST_HOLD_SUBMIT=$HOLD acc_start --set cpu_devices=1 --set cpu_device_memory=256M \
    --set cpu_threads_per_device=1
export ACCUMD_TEST_HOLD_SUBMIT=

# POST with a deadline (a daemon stuck on its loop thread must fail the test,
# not hang it): prints the body, then the status on the last line
post() { acc_curl --max-time 20 -w '\n%{http_code}' -X POST --data-binary "$1" "$BASE/v1/jobs"; }
# expect_refused SPEC FIELD [TEXT_THAT_MUST_NOT_APPEAR]
expect_refused() {
    local out code body
    out=$(post "$1")
    code=${out##*$'\n'}
    body=${out%$'\n'*}
    [ "$code" = 400 ] || fail "want 400 for $1, got HTTP '$code': $body"
    expect_eq "field of $1" "$(echo "$body" | jq -r .error.field)" "$2"
    if [ -n "${3:-}" ] && echo "$body" | grep -q -- "$3"; then
        fail "the error quotes the file ('$3'): $body"
    fi
    echo "$body"
}
spec() { printf '{"model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"%s","format":"%s"},"train_batch_size":8,"max_steps":2%s}' "$1" "$2" "${3:+,$3}"; }

# ---- defect 2: a glob escapes the data roots
expect_refused "$(spec passwd-link text)" data.train >/dev/null
for fmt in text tokens; do
    body=$(expect_refused "$(spec 'passwd-l?nk' $fmt)" data.train "root:") || exit 1
    echo "$body" | grep -q "outside the allowed roots" || fail "glob ($fmt): not refused as outside the roots: $body"
    echo "$body" | grep -qE "magic [0-9-]+ " && fail "glob ($fmt): the error echoes the file's bytes: $body"
done
expect_refused "$(spec 'passwd-*' tokens)" data.train >/dev/null
ok "a symlink out of the root is refused by name and by glob, nothing of it quoted"

# ---- defect 3: a FIFO in a data root
for p in pipe.txt 'pipe.t?t'; do
    body=$(expect_refused "$(spec "$p" text)" data.train) || exit 1
    echo "$body" | grep -q FIFO || fail "FIFO $p: the message does not say what it is: $body"
done
expect_refused "$(spec 'pipe.*' tokens)" data.train >/dev/null
code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "$BASE/healthz")
expect_eq "/healthz after the FIFO submissions" "$code" 200
ok "a FIFO is a quick 400 naming data.train; the API stays up"

# a validation held open: the API answers meanwhile, the job is not
# acknowledged (nor listed) before its validation ends
touch "$HOLD"
post "$(tiny_job held 2)" >"$ACC_TMP/held.out" &
poster=$!
for i in $(seq 1 200); do
    grep -q "submission held" "$STATE/daemon.log" && break
    kill -0 $poster 2>/dev/null || fail "the submission was answered while its validation was held: $(cat "$ACC_TMP/held.out")"
    sleep 0.1
done
grep -q "submission held" "$STATE/daemon.log" || fail "the validation never started on the thread pool"
code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "$BASE/healthz")
expect_eq "/healthz during a held validation" "$code" 200
n=$(acc_curl --max-time 10 "$BASE/v1/jobs" | jq '.jobs | length')
expect_eq "jobs listed while the only submission is still being validated" "$n" 0
kill -0 $poster 2>/dev/null || fail "the held submission was answered before its validation ended"
rm -f "$HOLD"
wait $poster || fail "the held submission's curl failed: $(cat "$ACC_TMP/held.out")"
expect_eq "held submission's status" "$(tail -n 1 "$ACC_TMP/held.out")" 201
held=$(head -n -1 "$ACC_TMP/held.out" | jq -r .id)
acc_wait_state "$held" succeeded 60
ok "validation runs off the loop thread: /healthz answers during it, 201 only after it"

# ---- defect 12: specs that can never run are refused at submit
expect_refused "$(tiny_job r 2 "\"resume_from\":\"$STATE/out\"")" resume_from >/dev/null
expect_refused "$(tiny_job r 2 '"resume_from":"."')" resume_from >/dev/null
big='{"model":{"n_layer":48,"n_head":16,"n_embd":2048,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"max_steps":2}'
body=$(expect_refused "$big" model) || exit 1
echo "$body" | grep -q "can never run" || fail "too big: message does not say why: $body"
# a resume_from that is a real checkpoint of this model still works
acc_wait_state "$held" succeeded
resumed=$(acc_submit "$(tiny_job r 4 "\"resume_from\":\"$STATE/out/$held\"")") || exit 1
acc_wait_state "$resumed" succeeded 60
acc_db "SELECT json FROM events WHERE job = '$resumed'" | grep -q "resumed from" || fail "resume_from a job's output did not resume"
ok "resume_from the output root and a model larger than any device are 400s; a real resume_from runs"

# ---- defect 20: a symlink planted at output_root/<next id>
last=$(acc_curl "$BASE/v1/jobs" | jq -r '[.jobs[].id] | max')
next=$(printf 'j%06d' $((10#${last#j} + 1)))
mkdir -p "$ACC_TMP/elsewhere"
ln -s "$ACC_TMP/elsewhere" "$STATE/out/$next"
id=$(acc_submit "$(tiny_job planted 2 '"checkpoint_interval":1')") || exit 1
[ "$id" != "$next" ] || fail "the id $next behind a planted symlink was reused"
acc_wait_state "$id" succeeded 60
[ -z "$(ls -A "$ACC_TMP/elsewhere")" ] || fail "a job wrote through the planted symlink: $(ls -A "$ACC_TMP/elsewhere")"
[ -d "$STATE/out/$id" ] && [ ! -L "$STATE/out/$id" ] || fail "the job's output dir is not a real directory"
ls "$STATE/out/$id" | grep -q '^ckpt-' || fail "no checkpoint in the job's own output dir"
grep -q "skipped" "$STATE/daemon.log" || fail "the skipped id is not logged"
ok "a planted symlink at the next id is skipped, never followed"

acc_stop

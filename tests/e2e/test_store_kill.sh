#!/bin/bash
# kill -9 inside a store transaction, at chosen places (the store's test-only
# hook ACCUMD_TEST_KILL_IN_TX="PREFIX:N": the N-th transaction whose
# operation starts with PREFIX raises SIGKILL after its statements ran and
# before COMMIT). After each kill the daemon restarts on the same state: the
# database passes its integrity check (not read-only), nothing acknowledged
# is lost, nothing half-written shows, and the job that was being written
# runs to its end with its events numbered 1, 2, 3, ... without a gap.
. "$(dirname "$0")/lib.sh"

acc_data
# wait until the daemon process is gone (killed by the hook)
wait_killed() {
    local i
    for i in $(seq 1 300); do
        kill -0 "$ACC_PID" 2>/dev/null || { wait "$ACC_PID" 2>/dev/null; ACC_PID=; return 0; }
        sleep 0.1
    done
    fail "the daemon was not killed in the $1 transaction"
}
healthy() { # the restarted store: integrity checked, writable
    acc_curl "$BASE/healthz" | jq -e '.status == "ok"' >/dev/null || fail "healthz after the kill: $(acc_curl "$BASE/healthz")"
}
seq_whole() { # JOB: events 1..n, no gap, no repeat
    acc_curl "$BASE/v1/jobs/$1/events?format=ndjson" --max-time 5 | jq -se '
        [.[] | select(.type != "gap") | .seq] as $s | ($s | length) > 0 and $s == [range(1; ($s | length) + 1)]' \
        >/dev/null || fail "events of $1 not 1..n: $(acc_curl "$BASE/v1/jobs/$1/events?format=ndjson" --max-time 5 | jq -c .seq | tr '\n' ' ')"
}
start() { acc_start --set cpu_devices=1 --set cpu_device_memory=128M --set checkpoint_keep=2; }

# ---- 1. killed while a submission commits: no 201 was sent, so no job ----------
start
before=$(acc_submit "$(tiny_job before 2)")
acc_wait_state "$before" succeeded
acc_stop
export ACCUMD_TEST_KILL_IN_TX="create job:1"
start
unset ACCUMD_TEST_KILL_IN_TX
code=$(acc_curl -o /dev/null -w '%{http_code}' -X POST --data-binary "$(tiny_job lost 2)" "$BASE/v1/jobs")
[ "$code" != 201 ] || fail "a submission killed before its commit was acknowledged"
wait_killed "create job"
start
healthy
expect_eq "only the job acknowledged before" "$(acc_curl "$BASE/v1/jobs" | jq -c '[.jobs[].name]')" '["before"]'
expect_eq "the earlier job intact" "$(acc_state "$before")" succeeded
ok "killed inside 'create job': the unacknowledged job is absent, the rest intact"

# ---- 2. killed while a running job's step events commit -------------------------
acc_stop
export ACCUMD_TEST_KILL_IN_TX="append events of job:3"
start
unset ACCUMD_TEST_KILL_IN_TX
j2=$(acc_submit "$(tiny_job steps 8 '"checkpoint_interval":2')")
wait_killed "append events"
start
healthy
acc_wait_state "$j2" succeeded 120
expect_eq "all steps" "$(acc_curl "$BASE/v1/jobs/$j2" | jq .step)" 8
seq_whole "$j2"
ok "killed inside 'append events': the job resumed to its end, events 1..n"

# ---- 3. killed while a final state commits ----------------------------------------
acc_stop
# the job's state changes are running (1) and succeeded (2)
export ACCUMD_TEST_KILL_IN_TX="save state of job:2"
start
unset ACCUMD_TEST_KILL_IN_TX
j3=$(acc_submit "$(tiny_job final 3)")
wait_killed "save state"
start
healthy
s=$(acc_state "$j3")
case $s in queued | running | succeeded) ;; *) fail "job after a kill in its final commit: $s" ;; esac
acc_wait_state "$j3" succeeded 120
seq_whole "$j3"
expect_eq "every job listed" "$(acc_curl "$BASE/v1/jobs" | jq '.jobs | length')" 3
acc_stop
ok "killed inside 'save state': the job was never shown done before it was stored; it ran to its end"

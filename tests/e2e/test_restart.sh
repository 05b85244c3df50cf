#!/bin/bash
# Nothing acknowledged is lost: kill -9 the daemon with jobs queued, running
# and finished; restart on the same state dir; every job is there, queued
# ones still queued, running ones requeued (restart from step 0, said in
# an event), finished ones unchanged. Then SIGTERM with a job running: the
# daemon drains and exits 0, and the job is requeued at the next start.
. "$(dirname "$0")/lib.sh"

acc_data
acc_start --set cpu_devices=1 --set cpu_device_memory=128M
fin=$(acc_submit "$(tiny_job finished 3)") || exit 1
acc_wait_state "$fin" succeeded
run=$(acc_submit "$(tiny_job running 1000000)") || exit 1
acc_wait_state "$run" running
q1=$(acc_submit "$(tiny_job queued1 3)") || exit 1
q2=$(acc_submit "$(tiny_job queued2 3 '"priority":5')") || exit 1
can=$(acc_submit "$(tiny_job cancelled 3)") || exit 1
curl -s -o /dev/null -X DELETE "$BASE/v1/jobs/$can"
acc_wait_step "$run" 2
acc_kill9
ok "killed with 1 running, 2 queued, 1 succeeded, 1 cancelled"

# restart: q2 (priority 5) runs first, then the requeued job (the earliest
# submitted), q1 last
acc_start --set cpu_devices=1 --set cpu_device_memory=128M
expect_eq "jobs back" "$(curl -s "$BASE/v1/jobs" | jq '.jobs | length')" 5
expect_eq "finished" "$(acc_state "$fin")" succeeded
expect_eq "cancelled" "$(acc_state "$can")" cancelled
r=$(curl -s "$BASE/v1/jobs/$run")
expect_eq "requeued once" "$(echo "$r" | jq .restarts)" 1
curl -sN -m 1 "$BASE/v1/jobs/$run/events?format=ndjson" >"$ACC_TMP/ev" # a live stream: cut after 1 s
grep -q 'requeued, it resumes from its last checkpoint' "$ACC_TMP/ev" || fail "no requeue event: $(tail -3 "$ACC_TMP/ev")"
acc_wait_state "$q2" succeeded
acc_wait_state "$run" running
expect_eq "q1 still queued" "$(acc_state "$q1")" queued
# sequence numbers continue across the restart
seqs=$(jq -r .seq "$ACC_TMP/ev" | awk 'NR > 1 && $1 != prev + 1 { bad = 1 } { prev = $1 } END { print bad ? "gap" : "ok" }')
expect_eq "event numbering continuous" "$seqs" ok
ok "restart: every job back in the right state"

# SIGTERM drains: exit 0 with watchers attached, the running job requeued
# at the next start
acc_wait_step "$run" 2
curl -sN "$BASE/v1/jobs/$run/events" >"$ACC_TMP/w1" &
w1=$!
curl -sN "$BASE/v1/jobs/$run/events?format=ndjson&since=999999" >"$ACC_TMP/w2" &
w2=$!
sleep 0.3
acc_stop 20
for i in $(seq 1 50); do kill -0 $w1 2>/dev/null || kill -0 $w2 2>/dev/null || break; sleep 0.1; done
kill -0 $w1 2>/dev/null && fail "SSE watcher still connected after the daemon stopped"
grep -q '^event: step' "$ACC_TMP/w1" || fail "watcher got no steps"
acc_events_text "$run" | grep -q "stopped by daemon shutdown" || fail "no shutdown event"
acc_start --set cpu_devices=1 --set cpu_device_memory=128M
expect_eq "requeued twice" "$(curl -s "$BASE/v1/jobs/$run" | jq .restarts)" 2
curl -s -o /dev/null -X DELETE "$BASE/v1/jobs/$run"
acc_wait_state "$run" cancelled
acc_wait_state "$q1" succeeded
acc_stop
ok "SIGTERM drain and requeue"

# a queued job the new config can never place fails at start instead of
# waiting forever (here: 2 devices asked, the restart offers 1)
acc_start --set cpu_devices=2 --set cpu_device_memory=128M
blocker=$(acc_submit "$(tiny_job blocker 1000000 '"devices":2')") || exit 1
acc_wait_state "$blocker" running
two=$(acc_submit "$(tiny_job two 3 '"devices":2')") || exit 1
acc_kill9
acc_start --set cpu_devices=1 --set cpu_device_memory=128M
acc_wait_state "$two" failed
acc_curl "$BASE/v1/jobs/$two" | jq -r .error.message | grep -q 'can never be placed' || fail "no reason given"
acc_wait_state "$blocker" failed
acc_stop
ok "jobs that no longer fit fail at restart, with the reason"

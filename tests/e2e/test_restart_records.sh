#!/bin/bash
# Issue 25, defect 10: a restart never rewrites a finished job. A daemon
# (2 CPU devices) holds a job in every terminal state: succeeded (two
# devices, max_steps from num_train_epochs), failed (its worker exits at
# step 2, max_restarts 0), cancelled while running, cancelled while
# queued. Every field of every terminal job's view (GET /v1/jobs/ID: spec,
# state, steps, max_steps, loss, batch, devices, times, error, outputs,
# last_event, ...) and of the list is compared before and after a SIGTERM
# and a restart, and after a second restart with the jobs' data file gone
# (their specs no longer valid): all equal.
. "$(dirname "$0")/lib.sh"

export ACCUMD_TEST_FAULT="failing:exit:2"
acc_data
acc_start --set cpu_devices=2 --set cpu_device_memory=256M

ok_id=$(acc_submit "$(printf '{"name":"epochs","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":16,"train_micro_batch_size_per_gpu":4,"devices":2,"num_train_epochs":0.25}')")
acc_wait_state "$ok_id" succeeded 120
max=$(acc_curl "$BASE/v1/jobs/$ok_id" | jq -r .max_steps)
[ "$max" != 100 ] && [ "$max" -gt 0 ] || fail "num_train_epochs did not set max_steps (got $max)"

bad_id=$(acc_submit "$(tiny_job failing 50 '"max_restarts":0')")
acc_wait_state "$bad_id" failed 60

run_id=$(acc_submit "$(tiny_job running 100000 '"devices":2')")
acc_wait_state "$run_id" running
acc_wait_step "$run_id" 3
q_id=$(acc_submit "$(tiny_job waiting 10 '"devices":2')")
expect_eq "the second 2-device job waits" "$(acc_state "$q_id")" queued
code=$(acc_curl -o /dev/null -w '%{http_code}' -X DELETE "$BASE/v1/jobs/$q_id")
expect_eq "cancel while queued" "$code" 200
code=$(acc_curl -o /dev/null -w '%{http_code}' -X DELETE "$BASE/v1/jobs/$run_id")
expect_eq "cancel while running" "$code" 202
acc_wait_state "$run_id" cancelled 60

ids="$ok_id $bad_id $run_id $q_id"
snap() { # snap DIR: every terminal job's full view, and the list
    mkdir -p "$1"
    for id in $ids; do acc_curl "$BASE/v1/jobs/$id" | jq -S . >"$1/$id.json"; done
    acc_curl "$BASE/v1/jobs" | jq -S . >"$1/list.json"
}
snap "$ACC_TMP/before"
for id in $ids; do
    jq -e '.state | test("succeeded|failed|cancelled")' "$ACC_TMP/before/$id.json" >/dev/null ||
        fail "job $id is not final: $(cat "$ACC_TMP/before/$id.json")"
done
jq -e '.devices | length == 2' "$ACC_TMP/before/$ok_id.json" >/dev/null || fail "the 2-device job lists no devices"

for round in 1 2; do
    acc_stop
    # the second time without the data file: a finished job's record does
    # not depend on its spec being valid again
    [ "$round" = 2 ] && mv "$STATE/data/gpl.txt" "$STATE/data/gpl.txt.gone"
    acc_start --set cpu_devices=2 --set cpu_device_memory=256M
    snap "$ACC_TMP/after$round"
    for f in $ids list; do
        diff -u "$ACC_TMP/before/$f.json" "$ACC_TMP/after$round/$f.json" >&2 ||
            fail "restart $round changed the record of $f (diff above)"
    done
done
ok "4 terminal jobs (succeeded with num_train_epochs on 2 devices, failed, cancelled running/queued): every field equal after 2 restarts"
acc_stop

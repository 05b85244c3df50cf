#!/bin/bash
# The job API end to end: submit, get, list (and ?state=), stream until done
# (SSE and NDJSON, resume by Last-Event-ID and ?since=), metrics history,
# devices, dry run, precision bf16, cancel a queued and a running job.
. "$(dirname "$0")/lib.sh"

acc_data
acc_start --set cpu_devices=1 --set cpu_device_memory=256M --set event_ring=16

# submit: 201, Location, the job with its resolved batch split
out=$(curl -s -D "$ACC_TMP/h" -X POST --data-binary "$(tiny_job first 6)" "$BASE/v1/jobs")
grep -q '^HTTP/1.1 201' "$ACC_TMP/h" || fail "submit status: $(head -1 "$ACC_TMP/h")"
id=$(echo "$out" | jq -r .id)
grep -qi "^Location: /v1/jobs/$id" "$ACC_TMP/h" || fail "no Location header"
expect_eq "accum resolved" "$(echo "$out" | jq .batch.accum_steps)" 4
expect_eq "spec echoed" "$(echo "$out" | jq -r .spec.name)" first

# the stream ends by itself once the job is done, with the events in order
timeout 60 curl -sN "$BASE/v1/jobs/$id/events" >"$ACC_TMP/sse" || fail "SSE stream did not end"
grep -q '^event: done' "$ACC_TMP/sse" || fail "no done event: $(cat "$ACC_TMP/sse")"
expect_eq "step events" "$(grep -c '^event: step' "$ACC_TMP/sse")" 6
expect_eq "first id" "$(grep -m1 '^id: ' "$ACC_TMP/sse")" "id: 1"
grep '^data: ' "$ACC_TMP/sse" | sed 's/^data: //' | jq -e . >/dev/null || fail "SSE data is not JSON"
acc_wait_state "$id" succeeded
ok "submit, SSE stream to done"

job=$(curl -s "$BASE/v1/jobs/$id")
expect_eq "step" "$(echo "$job" | jq .step)" 6
echo "$job" | jq -e '.loss > 0 and .finished_at != null and .error == null' >/dev/null || fail "job body: $job"

# NDJSON and resume: ?since=N and Last-Event-ID both mean "after N"
last=$(echo "$job" | jq .last_event)
timeout 20 curl -sN "$BASE/v1/jobs/$id/events?format=ndjson" >"$ACC_TMP/nd"
jq -e . "$ACC_TMP/nd" >/dev/null || fail "NDJSON lines are not JSON"
# step events carry the device memory: accounted, held, free (CPU: held = in
# use, free = the 256 MiB budget minus in use)
jq -se '[.[] | select(.type == "step")] | length == 6 and all(.[];
        .mem_in_use[0] > 0 and .mem_reserved[0] == .mem_in_use[0] and
        .mem_free[0] == 268435456 - .mem_in_use[0])' "$ACC_TMP/nd" >/dev/null ||
    fail "step memory fields: $(grep -m1 '"step"' "$ACC_TMP/nd")"
expect_eq "ndjson lines" "$(wc -l <"$ACC_TMP/nd")" "$last"
since=$(timeout 20 curl -sN "$BASE/v1/jobs/$id/events?format=ndjson&since=$((last - 2))" | jq -r .seq | tr '\n' ' ')
expect_eq "since" "$since" "$((last - 1)) $last "
lei=$(timeout 20 curl -sN -H "Last-Event-ID: $((last - 1))" "$BASE/v1/jobs/$id/events" | grep -c '^id: ')
expect_eq "Last-Event-ID" "$lei" 1
ok "NDJSON, since, Last-Event-ID"

# metrics history
m=$(curl -s "$BASE/v1/jobs/$id/metrics")
expect_eq "history length" "$(echo "$m" | jq '.steps | length')" 6
echo "$m" | jq -e '.steps[0].loss > 0 and .steps[5].step == 6 and .steps[0].mem_peak_bytes > 0' >/dev/null ||
    fail "metrics: $m"

# devices
d=$(curl -s "$BASE/v1/devices")
echo "$d" | jq -e '.devices | length == 1' >/dev/null || fail "devices: $d"
# devices = cpu: no GPU self-test ran, so no verdict to show
echo "$d" | jq -e 'has("gpu_selftest") | not' >/dev/null || fail "gpu_selftest without GPUs: $d"
echo "$d" | jq -e '.devices[0].kind == "cpu" and .devices[0].memory_total_bytes == 268435456 and .devices[0].memory_peak_bytes > 0' \
    >/dev/null || fail "device fields: $d"
# idle: nothing held, the whole budget free
echo "$d" | jq -e '.devices[0].job == null and .devices[0].memory_in_use_bytes == 0 and .devices[0].memory_reserved_bytes == 0 and .devices[0].memory_free_bytes == 268435456' \
    >/dev/null || fail "idle device memory: $d"

# dry run: the plan, nothing queued
plan=$(curl -s -X POST --data-binary "$(tiny_job dry 10)" "$BASE/v1/jobs?dry_run=1")
echo "$plan" | jq -e '.dry_run and .batch.accum_steps == 4 and .placement.starts_now and (.predicted_peak_memory_bytes | length) == 1' \
    >/dev/null || fail "dry run: $plan"
expect_eq "jobs after dry run" "$(curl -s "$BASE/v1/jobs" | jq '.jobs | length')" 1
expect_eq "dry run precision" "$(echo "$plan" | jq -r .precision)" fp32
ok "metrics history, devices, dry run"

# precision bf16 (bf16 matmul operands, fp32 accumulation): planned, trained, shown
plan=$(curl -s -X POST --data-binary "$(tiny_job dry16 4 '"precision":"bf16"')" "$BASE/v1/jobs?dry_run=1")
echo "$plan" | jq -e '.dry_run and .precision == "bf16" and .placement.starts_now' >/dev/null ||
    fail "bf16 dry run: $plan"
b16=$(acc_submit "$(tiny_job half 4 '"precision":"bf16"')") || exit 1
acc_wait_state "$b16" succeeded
job=$(curl -s "$BASE/v1/jobs/$b16")
echo "$job" | jq -e '.precision == "bf16" and .spec.precision == "bf16" and .step == 4 and .loss > 0 and .error == null' \
    >/dev/null || fail "bf16 job: $job"
expect_eq "listed with its precision" \
    "$(curl -s "$BASE/v1/jobs" | jq -r --arg id "$b16" '.jobs[] | select(.id == $id) | .precision')" bf16
expect_eq "the fp32 job's precision" "$(curl -s "$BASE/v1/jobs/$id" | jq -r .precision)" fp32
timeout 20 curl -sN "$BASE/v1/jobs/$b16/events?format=ndjson" | grep -q 'precision bf16' ||
    fail "no precision in the start log"
# DeepSpeed's bf16.enabled means the same
ds=$(acc_submit '{"name":"ds16","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"max_steps":2,"deepspeed":{"train_batch_size":8,"train_micro_batch_size_per_gpu":2,"bf16":{"enabled":true}}}') ||
    exit 1
acc_wait_state "$ds" succeeded
expect_eq "deepspeed bf16" "$(curl -s "$BASE/v1/jobs/$ds" | jq -r .precision)" bf16
expect_eq "jobs after bf16" "$(curl -s "$BASE/v1/jobs" | jq '.jobs | length')" 3
ok "precision bf16: dry run, train, job JSON, start log, deepspeed bf16.enabled"

# cancel: a long job runs, a second one queues behind it (one device)
long=$(acc_submit "$(tiny_job long 1000000)") || exit 1
acc_wait_state "$long" running
queued=$(acc_submit "$(tiny_job waiting 5)") || exit 1
expect_eq "second job queued" "$(acc_state "$queued")" queued
expect_eq "state filter" "$(curl -s "$BASE/v1/jobs?state=queued" | jq -r '[.jobs[].id] | join(",")')" "$queued"
devs=$(curl -s "$BASE/v1/devices" | jq -r '.devices[0].job')
expect_eq "device holder" "$devs" "$long"

code=$(curl -s -o "$ACC_TMP/c1" -w '%{http_code}' -X DELETE "$BASE/v1/jobs/$queued")
expect_eq "cancel queued" "$code" 200
expect_eq "cancelled at once" "$(jq -r .state "$ACC_TMP/c1")" cancelled

acc_wait_step "$long" 3
# running: what the job's device holds, and what is left of the budget
d=$(curl -s "$BASE/v1/devices")
echo "$d" | jq -e '.devices[0] | .memory_in_use_bytes > 0 and .memory_reserved_bytes == .memory_in_use_bytes and .memory_free_bytes == .memory_total_bytes - .memory_in_use_bytes' \
    >/dev/null || fail "busy device memory: $d"
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$BASE/v1/jobs/$long")
expect_eq "cancel running" "$code" 202
acc_wait_state "$long" cancelled
expect_eq "device freed" "$(curl -s "$BASE/v1/devices" | jq -r '.devices[0].job')" null
expect_error DELETE "/v1/jobs/$long" "" 409 ""
timeout 20 curl -sN "$BASE/v1/jobs/$long/events" | grep -q '"state":"cancelled"' || fail "no cancelled event"
expect_eq "listed as cancelled" "$(curl -s "$BASE/v1/jobs?state=cancelled" | jq '.jobs | length')" 2
ok "cancel queued and running"

# a watcher later than the ring is long gets a gap event, then the rest
g=$(acc_submit "$(tiny_job gappy 30)") || exit 1
acc_wait_state "$g" succeeded
timeout 20 curl -sN "$BASE/v1/jobs/$g/events?format=ndjson" >"$ACC_TMP/gap"
expect_eq "events after a gap" "$(wc -l <"$ACC_TMP/gap")" 17
jq -e -s --arg g "$g" '.[0].type == "gap" and .[0].from == 1 and .[1].seq == .[0].to + 1 and .[16].type == "done"
    and .[0].seq == .[0].to and .[0].job == $g and (.[0].time | test("^20[0-9-]+T[0-9:.]+Z$"))' \
    "$ACC_TMP/gap" >/dev/null || fail "gap: $(head -2 "$ACC_TMP/gap")"
timeout 20 curl -sN "$BASE/v1/jobs/$g/events" | head -3 | grep -q '^event: gap' || fail "SSE gap event"
ok "slow watcher skips ahead with a gap event"

# a watcher attached before the job starts sees it live
w=$(acc_submit "$(tiny_job watched 4)") || exit 1
timeout 60 curl -sN "$BASE/v1/jobs/$w/events?format=ndjson" | jq -r .type | tr '\n' ' ' >"$ACC_TMP/types"
grep -q 'state.*step.*done' "$ACC_TMP/types" || fail "live stream: $(cat "$ACC_TMP/types")"
acc_stop
ok "live watcher, clean stop"

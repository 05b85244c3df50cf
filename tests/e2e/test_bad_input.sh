#!/bin/bash
# Every class of bad input gets its 4xx with a JSON error naming the field,
# and the daemon stays up with every other job intact: malformed JSON, wrong
# types, unknown keys, inconsistent batch triple, never-fitting device count,
# huge body, bad paths, DeepSpeed keys accumd does not support, unknown job
# id, bad query values, wrong methods, 500 concurrent requests.
. "$(dirname "$0")/lib.sh"

acc_data
acc_start --set cpu_devices=2 --set cpu_device_memory=128M --set max_body=64K
survivor=$(acc_submit "$(tiny_job survivor 1000000)") || exit 1
acc_wait_state "$survivor" running
done_job=$(acc_submit "$(tiny_job finished 3)") || exit 1
acc_wait_state "$done_job" succeeded

j() { tiny_job bad 5 "$1"; }
expect_error POST /v1/jobs '{"name":' 400 ""
expect_error POST /v1/jobs '[1,2,3]' 400 ""
expect_error POST /v1/jobs '' 400 ""
expect_error POST /v1/jobs "$(j '"bogus_key":1')" 400 bogus_key
expect_error POST /v1/jobs "$(j '"optimizer":{"lr":"fast"}')" 400 optimizer.lr
expect_error POST /v1/jobs "$(j '"optimizer":{"lr":-1}')" 400 optimizer.lr
expect_error POST /v1/jobs "$(j '"optimizer":{"momentum":0.9}')" 400 optimizer.momentum
expect_error POST /v1/jobs "$(j '"devices":"two"')" 400 devices
expect_error POST /v1/jobs "$(j '"precision":"fp8"')" 400 precision
expect_error POST /v1/jobs '{"model":{"n_layer":1,"n_head":3,"n_embd":32},"data":{"train":"gpl.txt"},"train_batch_size":8}' 400 model.n_embd
expect_error POST /v1/jobs '{"data":{"train":"gpl.txt"},"train_batch_size":64,"devices":8}' 400 devices
expect_error POST /v1/jobs '{"data":{"train":"gpl.txt"},"train_batch_size":32,"train_micro_batch_size_per_gpu":2,"gradient_accumulation_steps":16,"devices":2}' 400 train_batch_size
out=$(curl -s -X POST --data-binary '{"data":{"train":"gpl.txt"},"train_batch_size":32,"train_micro_batch_size_per_gpu":2,"gradient_accumulation_steps":16,"devices":2}' "$BASE/v1/jobs")
expect_eq "arithmetic message" "$(echo "$out" | jq -r .error.message)" "train_batch_size 32 != 2 * 16 * 2 (micro * accum * world)"
expect_error POST /v1/jobs '{"data":{"train":"/etc/passwd"},"train_batch_size":8}' 400 data.train
expect_error POST /v1/jobs '{"data":{"train":"../../../../etc/passwd"},"train_batch_size":8}' 400 data.train
expect_error POST /v1/jobs '{"data":{"train":"nope.txt"},"train_batch_size":8}' 400 data.train
expect_error POST /v1/jobs "$(j '"resume_from":"/tmp"')" 400 resume_from
expect_error POST /v1/jobs '{"data":{"train":"gpl.txt"},"deepspeed":{"train_batch_size":8,"zero_optimization":{"stage":3}}}' 400 deepspeed.zero_optimization.stage
expect_error POST /v1/jobs '{"data":{"train":"gpl.txt"},"train_batch_size":8,"devices":2,"zero_optimization":{"stage":3},"lora":{"r":4}}' 400 zero_optimization.stage
expect_error POST /v1/jobs '{"data":{"train":"gpl.txt"},"train_batch_size":8,"devices":2,"zero_optimization":{"stage":2,"offload_optimizer":{"device":"nvme"}}}' 400 zero_optimization.offload_optimizer.device
expect_error POST /v1/jobs '{"data":{"train":"gpl.txt"},"deepspeed":{"train_batch_size":8,"zero_optimization":{"stage":1,"offload_param":{"device":"cpu"}}},"devices":2}' 400 deepspeed.zero_optimization.offload_param
expect_error POST /v1/jobs '{"data":{"train":"gpl.txt"},"train_batch_size":8,"zero_optimization":{"stage":3,"offload_param":{"device":"nvme"}}}' 400 zero_optimization.offload_param.device
expect_error POST /v1/jobs '{"data":{"train":"gpl.txt"},"train_batch_size":8,"zero_optimization":{"stage":1}}' 400 zero_optimization.stage
out=$(curl -s -X POST --data-binary '{"data":{"train":"gpl.txt"},"train_batch_size":8,"devices":2,"zero_optimization":{"stage":3},"lora":{"r":4}}' "$BASE/v1/jobs")
echo "$out" | jq -r .error.message | grep -q "not supported yet" || fail "stage 3 with LoRA message: $out"
out=$(curl -s -X POST --data-binary '{"data":{"train":"gpl.txt"},"train_batch_size":8,"zero_optimization":{"stage":2}}' "$BASE/v1/jobs")
echo "$out" | jq -r .error.message | grep -q "devices >= 2" || fail "one-device ZeRO message: $out"
expect_error POST /v1/jobs '{"data":{"train":"gpl.txt"},"deepspeed":{"train_batch_size":8,"optimizer":{"type":"AdamW","params":{"lr":"x"}}}}' 400 deepspeed.optimizer.params.lr
ok "spec errors name their field"

# huge body: refused from Content-Length, and when streamed without one
head -c 200000 /dev/zero | tr '\0' ' ' >"$ACC_TMP/big"
code=$(curl -s -o "$ACC_TMP/413" -w '%{http_code}' -X POST --data-binary @"$ACC_TMP/big" "$BASE/v1/jobs")
expect_eq "huge body" "$code" 413
jq -e '.error.code == "too_large"' "$ACC_TMP/413" >/dev/null || fail "413 body: $(cat "$ACC_TMP/413")"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Transfer-Encoding: chunked' -X POST --data-binary @"$ACC_TMP/big" "$BASE/v1/jobs")
expect_eq "huge chunked body" "$code" 413

expect_error GET /v1/jobs/j999999 "" 404 ""
expect_error DELETE /v1/jobs/j999999 "" 404 ""
expect_error GET /v1/jobs/j999999/events "" 404 ""
expect_error GET "/v1/jobs/$survivor/nothing" "" 404 ""
expect_error GET "/v1/jobs?state=sleeping" "" 400 state
expect_error GET "/v1/jobs/$survivor/events?since=abc" "" 400 since
expect_error GET "/v1/jobs/$survivor/events?format=xml" "" 400 format
expect_error PUT /v1/jobs "" 405 ""
expect_error POST "/v1/jobs/$survivor/metrics" "" 405 ""
expect_error DELETE /metrics "" 405 ""
ok "413, 404, 405, bad query values"

# 500 concurrent requests: 5 curl processes with 100 transfers in flight each
for k in $(seq 1 100); do
    case $((k % 3)) in
    0) printf 'url = "%s/v1/jobs/%s"\noutput = /dev/null\n' "$BASE" "$survivor" ;;
    1) printf 'url = "%s/v1/jobs"\noutput = /dev/null\n' "$BASE" ;;
    2) printf 'url = "%s/v1/jobs/j999999"\noutput = /dev/null\n' "$BASE" ;;
    esac
done >"$ACC_TMP/urls"
pids=
for i in 1 2 3 4 5; do
    curl -s --no-progress-meter -Z --parallel-max 100 --parallel-immediate -w '%{http_code}\n' -K "$ACC_TMP/urls" >"$ACC_TMP/par.$i" 2>/dev/null &
    pids="$pids $!"
done
wait $pids # not a bare wait: the daemon is a child too
cat "$ACC_TMP"/par.* | sort | uniq -c >"$ACC_TMP/codes"
total=$(cat "$ACC_TMP"/par.* | wc -l)
expect_eq "answers" "$total" 500
grep -vqE ' (200|404)$' "$ACC_TMP/codes" && fail "unexpected codes: $(cat "$ACC_TMP/codes")"

# the daemon is up and nothing else was touched
curl -sf -o /dev/null "$BASE/healthz" || fail "daemon down"
expect_eq "survivor still running" "$(acc_state "$survivor")" running
expect_eq "finished job intact" "$(acc_state "$done_job")" succeeded
expect_eq "no stray jobs" "$(curl -s "$BASE/v1/jobs" | jq '.jobs | length')" 2
curl -s -o /dev/null -X DELETE "$BASE/v1/jobs/$survivor"
acc_wait_state "$survivor" cancelled
acc_stop
ok "500 concurrent requests, other jobs unaffected"

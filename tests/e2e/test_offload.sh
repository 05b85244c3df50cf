#!/bin/bash
# Optimizer offload through the daemon (zero_optimization.offload_optimizer,
# docs/api.md):
#  - the same job without offload, offloaded at stage 0 (top level) and
#    offloaded at stage 2 (inside "deepspeed", pin_memory and DeepSpeed's
#    tuning keys given) over 2 CPU devices: the same losses and grad norms,
#    step by step, as the API reports them;
#  - step events: no optimizer bytes on the devices with offload, the peak
#    lower by exactly the moments; the dry run predicts that peak;
#  - DeepSpeed's tuning keys are listed as ignored; "nvme" is a 400 naming
#    zero_optimization.offload_optimizer.device.
. "$(dirname "$0")/lib.sh"

acc_data
acc_start --set cpu_devices=2 --set cpu_device_memory=256M --set cpu_threads_per_device=1

job() { # NAME STEPS EXTRA
    printf '{"name":"%s","model":{"n_layer":2,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"devices":2,"max_steps":%s,"optimizer":{"grad_clip":0.5}%s}' \
        "$1" "$2" "${3:+,$3}"
}
history() { acc_curl "$BASE/v1/jobs/$1/metrics" | jq -c '[.steps[] | [.step, .loss, .grad_norm]]'; }
steps_json() { acc_events_text "$1" | jq -sc '[.[] | select(.type == "step")]'; }

OFF0='"zero_optimization":{"offload_optimizer":{"device":"cpu"}}'
OFF2='"deepspeed":{"zero_optimization":{"stage":2,"offload_optimizer":{"device":"cpu","pin_memory":true,"buffer_count":4,"fast_init":false}}}'
on=$(acc_submit "$(job on 5)") || exit 1
a=$(acc_submit "$(job off0 5 "$OFF0")") || exit 1
b=$(acc_submit "$(job off2 5 "$OFF2")") || exit 1
for j in "$on" "$a" "$b"; do acc_wait_state "$j" succeeded 120; done
h=$(history "$on")
expect_eq "5 steps" "$(echo "$h" | jq length)" 5
expect_eq "offloaded stage 0 losses and norms" "$(history "$a")" "$h"
expect_eq "offloaded stage 2 losses and norms" "$(history "$b")" "$h"
ok "offloaded at stage 0 and 2: the same losses and norms ($(echo "$h" | jq -c '[.[][1]]'))"

s0=$(steps_json "$on")
sa=$(steps_json "$a")
o0=$(echo "$s0" | jq '.[-1].mem_optimizer[0]')
[ "$o0" -gt 0 ] || fail "optimizer bytes without offload: $o0"
echo "$sa" | jq -e 'all(.[]; .mem_optimizer == [0, 0])' >/dev/null || fail "offloaded mem_optimizer: $sa"
p0=$(echo "$s0" | jq '.[-1].mem_peak[0]')
pa=$(echo "$sa" | jq '.[-1].mem_peak[0]')
expect_eq "offload peak saving" "$((p0 - pa))" "$o0"
dry=$(acc_curl -X POST --data-binary "$(job dry 5 "$OFF0")" "$BASE/v1/jobs?dry_run=1")
expect_eq "dry-run peak with offload" "$(echo "$dry" | jq '.predicted_peak_memory_bytes[0]')" "$pa"
ok "per device: optimizer bytes $o0 -> 0, peak $p0 -> $pa (the dry run's prediction)"

acc_events_text "$b" | jq -r 'select(.type == "log") | .message' | grep -q 'deepspeed.zero_optimization.offload_optimizer.buffer_count' ||
    fail "buffer_count not listed as ignored"
acc_events_text "$b" | jq -r 'select(.type == "log") | .message' | grep -q 'optimizer offloaded to host memory' ||
    fail "the start log does not say the optimizer is offloaded"
ok "DeepSpeed's offload tuning keys listed as ignored; the start log says offloaded"

out=$(acc_curl -X POST --data-binary "$(job nvme 5 '"zero_optimization":{"offload_optimizer":{"device":"nvme"}}')" "$BASE/v1/jobs")
expect_eq "nvme field" "$(echo "$out" | jq -r .error.field)" "zero_optimization.offload_optimizer.device"
echo "$out" | jq -r .error.message | grep -q "not supported yet" || fail "nvme message: $out"
ok "offload to nvme: 400 naming zero_optimization.offload_optimizer.device"
acc_stop
acc_check_log

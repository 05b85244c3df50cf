#!/bin/bash
# ZeRO through the daemon (zero_optimization, docs/api.md):
#  - the same job at stage 0, stage 1 (top level) and stage 2 (inside
#    "deepspeed") over 2 CPU devices: the same losses and grad norms, step
#    by step, as the API reports them;
#  - step events: each rank's mem_optimizer is its shard's (the two sum to
#    stage 0's, 1/2 each), mem_gradients stays whole, the peak drops by
#    exactly the moments not held; /v1/devices shows the figures too;
#  - a stage-2 job on 4 devices checkpoints the whole state: resumed on 2
#    devices at stage 2 and at stage 0 it continues with the same losses;
#  - SIGTERM checkpoints a running ZeRO-2 job (its ranks stop together) and
#    the restarted daemon resumes it with the losses of a run never stopped;
#  - stage 3 (top level, and a DeepSpeed section with stage3_* keys) gives
#    stage 0's losses at one micro-step per device without clipping.
. "$(dirname "$0")/lib.sh"

ARGS=(--set cpu_devices=4 --set cpu_device_memory=256M --set cpu_threads_per_device=1)
acc_data
acc_start "${ARGS[@]}"

job() { # NAME DEVICES STEPS EXTRA
    printf '{"name":"%s","model":{"n_layer":2,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"devices":%s,"max_steps":%s,"optimizer":{"grad_clip":0.5}%s}' \
        "$1" "$2" "$3" "${4:+,$4}"
}
history() { acc_curl "$BASE/v1/jobs/$1/metrics" | jq -c '[.steps[] | [.step, .loss, .grad_norm]]'; }
steps_json() { acc_events_text "$1" | jq -sc '[.[] | select(.type == "step")]'; }

z0=$(acc_submit "$(job z0 2 6)") || exit 1
z1=$(acc_submit "$(job z1 2 6 '"zero_optimization":{"stage":1}')") || exit 1
z2=$(acc_submit "$(job z2 2 6 '"deepspeed":{"zero_optimization":{"stage":2}}')") || exit 1
for j in "$z0" "$z1" "$z2"; do acc_wait_state "$j" succeeded 120; done
h0=$(history "$z0")
expect_eq "6 steps" "$(echo "$h0" | jq length)" 6
expect_eq "stage 1 losses and norms" "$(history "$z1")" "$h0"
expect_eq "stage 2 losses and norms" "$(history "$z2")" "$h0"
ok "stage 0, 1, 2 on 2 devices: the same losses and norms ($(echo "$h0" | jq -c '[.[][1]]'))"

s0=$(steps_json "$z0")
s2=$(steps_json "$z2")
o0=$(echo "$s0" | jq '.[-1].mem_optimizer[0]')
[ "$o0" -gt 0 ] || fail "stage 0 optimizer bytes: $o0"
echo "$s0" | jq -e --argjson o "$o0" 'all(.[]; .mem_optimizer == [$o, $o])' >/dev/null || fail "stage 0 mem_optimizer: $s0"
echo "$s2" | jq -e --argjson o "$o0" 'all(.[]; (.mem_optimizer | add) == $o and
        ((.mem_optimizer[0] - .mem_optimizer[1]) | fabs) <= 8)' >/dev/null ||
    fail "stage 2 mem_optimizer is not half of $o0: $(echo "$s2" | jq -c '.[-1].mem_optimizer')"
echo "$s2" | jq -e --argjson g "$(echo "$s0" | jq -c '.[-1].mem_gradients')" 'all(.[]; .mem_gradients == $g)' \
    >/dev/null || fail "stage 2 mem_gradients: $(echo "$s2" | jq -c '.[-1].mem_gradients')"
p0=$(echo "$s0" | jq '.[-1].mem_peak[0]')
p2=$(echo "$s2" | jq '.[-1].mem_peak[0]')
q2=$(echo "$s2" | jq '.[-1].mem_optimizer[0]')
expect_eq "stage 2 peak saving" "$((p0 - p2))" "$((o0 - q2))"
ok "per rank: optimizer bytes $o0 -> $q2 (stage 2), peak $p0 -> $p2"

# ---- /v1/devices while a ZeRO job holds them
zl=$(acc_submit "$(job zl 2 400 '"zero_optimization":{"stage":1}')") || exit 1
acc_wait_step "$zl" 2 60
d=$(acc_curl "$BASE/v1/devices")
echo "$d" | jq -e --arg j "$zl" --argjson o "$o0" '[.devices[] | select(.job == $j)] | length == 2 and
        (map(.memory_optimizer_bytes) | add) == $o and all(.[]; .memory_gradient_bytes > 0)' >/dev/null ||
    fail "/v1/devices under ZeRO 1: $d"
acc_curl -X DELETE "$BASE/v1/jobs/$zl" >/dev/null
acc_wait_state "$zl" cancelled 60
d=$(acc_curl "$BASE/v1/devices")
echo "$d" | jq -e 'all(.devices[]; .memory_optimizer_bytes == 0)' >/dev/null || fail "idle devices: $d"
ok "/v1/devices: memory_optimizer_bytes per rank while a ZeRO job runs, 0 once released"

# ---- a stage-2 checkpoint at w = 4 resumes at w = 2 (stage 2 and stage 0)
w4=$(acc_submit "$(job w4 4 3 '"zero_optimization":{"stage":2}')") || exit 1
acc_wait_state "$w4" succeeded 120
ck=$STATE/out/$w4/ckpt-00000003
[ -f "$ck/state.safetensors" ] || fail "no checkpoint at $ck: $(ls "$STATE/out/$w4")"
r2=$(acc_submit "$(job r2 2 6 "\"zero_optimization\":{\"stage\":2},\"resume_from\":\"$ck\"")") || exit 1
r0=$(acc_submit "$(job r0 2 6 "\"resume_from\":\"$ck\"")") || exit 1
acc_wait_state "$r2" succeeded 120
acc_wait_state "$r0" succeeded 120
hr=$(history "$r2")
expect_eq "resumed steps" "$(echo "$hr" | jq -c '[.[][0]]')" "[4,5,6]"
expect_eq "resumed at w=2: stage 2 = stage 0" "$hr" "$(history "$r0")"
ok "stage-2 checkpoint at w=4 resumed at w=2: losses $(echo "$hr" | jq -c '[.[][1]]')"

# ---- a shutdown checkpoints a ZeRO job (the ranks stop together) and the
# restarted daemon resumes it with the losses of a run never stopped
ref=$(acc_submit "$(job ref 2 150)") || exit 1
acc_wait_state "$ref" succeeded 120
zs=$(acc_submit "$(job zs 2 150 '"zero_optimization":{"stage":2}')") || exit 1
acc_wait_step "$zs" 3
acc_stop
ls -d "$STATE/out/$zs"/ckpt-* >/dev/null 2>&1 || fail "no shutdown checkpoint of the ZeRO job: $(ls "$STATE/out/$zs")"
acc_start "${ARGS[@]}"
acc_wait_state "$zs" succeeded 120
at=$(acc_events_text "$zs" | grep -o 'resumed from [^ ]* at step [0-9]*' | head -1 | grep -o '[0-9]*$')
[ -n "$at" ] && [ "$at" -ge 3 ] && [ "$at" -lt 150 ] || fail "the ZeRO job did not resume mid-run from its shutdown checkpoint ('$at')"
expect_eq "history of the stopped and resumed job" "$(history "$zs")" "$(history "$ref")"
ok "SIGTERM: the ZeRO-2 job checkpointed after step $at, resumed, with the losses of a run never stopped"

# ---- ZeRO-3 (stage 3 at the top level, and from "deepspeed" with its
# stage3_* tuning keys): one micro-step per device and no clipping, so the
# losses are stage 0's bit for bit; the tuning keys are listed as ignored
job3() { # NAME STEPS EXTRA
    printf '{"name":"%s","model":{"n_layer":2,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":4,"devices":2,"max_steps":%s,"optimizer":{"grad_clip":0}%s}' \
        "$1" "$2" "${3:+,$3}"
}
losses() { acc_curl "$BASE/v1/jobs/$1/metrics" | jq -c '[.steps[] | [.step, .loss]]'; }
b0=$(acc_submit "$(job3 b0 4)") || exit 1
b3=$(acc_submit "$(job3 b3 4 '"zero_optimization":{"stage":3}')") || exit 1
d3=$(acc_submit "$(job3 d3 4 '"deepspeed":{"zero_optimization":{"stage":3,"stage3_prefetch_bucket_size":"auto","stage3_gather_16bit_weights_on_model_save":true}}')") || exit 1
for j in "$b0" "$b3" "$d3"; do acc_wait_state "$j" succeeded 120; done
l0=$(losses "$b0")
expect_eq "4 steps" "$(echo "$l0" | jq length)" 4
expect_eq "stage 3 losses" "$(losses "$b3")" "$l0"
expect_eq "stage 3 (deepspeed) losses" "$(losses "$d3")" "$l0"
acc_events_text "$d3" | grep -q 'ignored (no meaning in accumd): .*stage3_prefetch_bucket_size' ||
    fail "the stage3_* keys are not listed as ignored"
acc_events_text "$b3" | grep -q 'ZeRO stage 3' || fail "the start log does not name ZeRO stage 3"
ok "stage 3 on 2 devices: stage 0's losses ($(echo "$l0" | jq -c '[.[][1]]')), stage3_* keys ignored"

acc_stop
acc_check_log

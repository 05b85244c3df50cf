#!/bin/bash
# POST /v1/plan: "does it fit on my card?" for hardware the daemon does not
# have, from config.json alone.
#   - LLaMA-2-7B's config.json (published values, written here; no weights)
#     on one 24 GiB CUDA device: no full fine-tune fits, and the answer says
#     why with the numbers (16 bytes a parameter before activations);
#   - on four 24 GiB devices: still none (without ZeRO each holds it all;
#     ZeRO-3 rows partition weights and gradients too, still too big);
#   - LoRA rows with r 16, alpha 32, all-linear (39,976,960 adapter
#     parameters) and the adapters' AdamW state only;
#   - on 80 GiB: no full fine-tune, a LoRA one fits and is suggested;
#   - on 141 GiB: a full fine-tune fits, and the summary names it;
#   - the plan never reads the weights: a directory whose model.safetensors
#     is garbage plans like one without weights, while a submit of the same
#     spec is refused (400 naming model.from);
#   - bad hardware values and unknown keys: 400 naming the field;
#   - accumctl plan sends it (--device-memory, --devices, --kind) and prints
#     the table.
. "$(dirname "$0")/lib.sh"
command -v jq >/dev/null || { echo "skip: no jq"; exit 77; }

acc_data
write_config() {
    mkdir -p "$1"
    cat >"$1/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
 "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "float16", "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
EOF
}
write_config "$STATE/data/llama2-7b"
write_config "$STATE/data/llama2-7b-garbage"
head -c 100000 /dev/urandom >"$STATE/data/llama2-7b-garbage/model.safetensors"
acc_start --set cpu_devices=2 --set cpu_device_memory=256M --set cpu_threads_per_device=1

plan() { # plan SPEC_MEMBERS HARDWARE: the answer's body, status checked 200
    local out code
    out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "{$1, \"hardware\": $2}" "$BASE/v1/plan")
    code=${out##*$'\n'}
    [ "$code" = 200 ] || fail "plan $2: HTTP $code: ${out%$'\n'*}"
    echo "${out%$'\n'*}"
}
SPEC='"model": {"from": "llama2-7b", "seq_len": 4096}, "train_batch_size": 8, "train_micro_batch_size_per_gpu": "auto"'

# ---- one 24 GiB card: the full fine-tune does not fit -----------------------
a=$(plan "$SPEC" '{"device_memory": "24GiB", "devices": 1, "kind": "cuda"}')
expect_eq "params" "$(echo "$a" | jq .model.params)" 6738415616
expect_eq "hardware" "$(echo "$a" | jq -c '[.hardware.kind, .hardware.device_memory_bytes, .hardware.devices]')" \
    '["cuda",25769803776,1]'
expect_eq "24 GiB: fits" "$(echo "$a" | jq .summary.fits)" false
# every full row with the parameters on the card: no fit, 16 bytes a
# parameter before activations, the parts sum to the peak (the rows with the
# parameters offloaded too: below)
echo "$a" | jq -e '[.rows[] | select(.mode == "full" and (.offload_param | not))] | length > 0 and all(.fits == false)' >/dev/null ||
    fail "a full row fits 24 GiB: $a"
# (their device bytes fit the card; this machine's host memory may not hold them)
echo "$a" | jq -e '[.rows[] | select(.mode == "full" and .offload_param)] | length > 0
    and any(.device_bytes <= 25769803776 * 95 / 100)
    and all(.host_params_bytes >= 8 * 6738415616 and .optimizer_bytes == 0)
    and all(.fits or .limit != null)' >/dev/null ||
    fail "ZeRO-3 with the parameters offloaded: no full row's device bytes fit one 24 GiB card: $a"
echo "$a" | jq -e '[.rows[] | select(.mode == "full" and (.offload_param | not))] | all(.weights_bytes == 4 * 6738415616
    and .optimizer_bytes == (if .offload_optimizer then 0 else 8 * 6738415616 end)
    and .host_optimizer_bytes == (if .offload_optimizer then 16 * 6738415616 else 0 end)
    and .weights_bytes + .gradients_bytes + .optimizer_bytes + .activations_bytes == .peak_bytes
    and .peak_bytes + .rounding_bytes + .runtime_bytes == .device_bytes and .runtime_bytes == 536870912
    and .workspace_bytes == 0)' \
    >/dev/null || fail "breakdown: $(echo "$a" | jq -c '.rows[0]')"
why=$(echo "$a" | jq -r '.groups[] | select(.mode == "full" and .zero_stage == 0 and .recompute == false and (.offload_optimizer | not)) | .why_not')
echo "$why" | grep -q 'model state 100.4 GiB alone (weights 25.1 + gradients 25.1 + optimizer 50.2)' ||
    fail "24 GiB why: $why"
echo "$why" | grep -q 'exceeds the 24.0 GiB device' || fail "24 GiB why: $why"
expect_eq "24 GiB: largest m" "$(echo "$a" | jq '[.groups[] | select(.mode == "full") | .largest_fitting_micro_batch] | unique')" \
    "[
  null
]"
# every micro batch dividing B / w = 8: 1, 2, 4, 8, recompute off and on
expect_eq "rows per group" "$(echo "$a" | jq -c '[.rows[] | select(.mode == "full" and .recompute == false and (.offload_optimizer | not)) | .micro_batch]')" \
    '[1,2,4,8]'
expect_eq "recompute rows" "$(echo "$a" | jq -c '[.rows[] | select(.mode == "full" and .recompute and (.act_offload | not) and (.offload_optimizer | not)) | .accum_steps]')" \
    '[8,4,2,1]'
# recomputing from checkpoints in host memory: L x m x T x C fp32 floats on
# the host, the same rows with fewer device bytes
echo "$a" | jq -e '[.rows[] | select(.mode == "full" and .zero_stage == 0 and .recompute and (.offload_optimizer | not))] as $r |
    ($r | length) == 8 and ([range(4)] | all(. as $i | $r[$i + 4].act_offload and ($r[$i].act_offload | not)
        and $r[$i + 4].host_activations_bytes == 32 * $r[$i + 4].micro_batch * 4096 * 4096 * 4
        and $r[$i + 4].host_bytes >= $r[$i + 4].host_activations_bytes and $r[$i].host_activations_bytes == 0
        and $r[$i + 4].device_bytes < $r[$i].device_bytes))' >/dev/null ||
    fail "offload rows: $(echo "$a" | jq -c '[.rows[] | select(.act_offload)][0]')"
# LoRA rows (no lora section: r 16, alpha 32, all-linear): the adapters' AdamW state only
expect_eq "LoRA settings" "$(echo "$a" | jq -c '[.lora.r, .lora.alpha, (.lora.target_modules | length), .lora.trainable_params, .lora.from_spec]')" \
    '[16,32,7,39976960,false]'
echo "$a" | jq -e '[.rows[] | select(.mode == "lora")] | length == 24
    and all(.optimizer_bytes == (if .offload_optimizer then 0 else 8 * 39976960 end)
    and .weights_bytes + .gradients_bytes + .optimizer_bytes + .activations_bytes == .peak_bytes)' \
    >/dev/null || fail "LoRA rows: $(echo "$a" | jq -c '[.rows[] | select(.mode == "lora")][0]')"
ok "24 GiB: $why"

# ---- four 24 GiB cards: each still holds the whole state ---------------------
a=$(plan "$SPEC" '{"device_memory": "24GiB", "devices": 4, "kind": "cuda"}')
expect_eq "4 x 24 GiB: per device" "$(echo "$a" | jq .batch.per_device)" 2
echo "$a" | jq -e '[.rows[] | select(.mode == "full" and .zero_stage == 0)] | all(.fits == false)' >/dev/null ||
    fail "4 x 24 GiB: a replica fits: $a"
# ZeRO rows on 4 devices: the moments are 1/4 of stage 0's (a shard of
# floor or ceil), the gradients whole (docs/engine.md "ZeRO")
echo "$a" | jq -e '
    ([.rows[] | select(.mode == "full" and .zero_stage == 0 and .recompute == false)][0]) as $z0 |
    [.rows[] | select(.mode == "full" and .zero_stage >= 1 and .zero_stage <= 2 and (.offload_optimizer | not))] as $z |
    ($z | length) > 0 and
    ($z | all(.optimizer_bytes * 4 >= $z0.optimizer_bytes - 32 and .optimizer_bytes * 4 <= $z0.optimizer_bytes + 32
              and .gradients_bytes == $z0.gradients_bytes and .weights_bytes == $z0.weights_bytes))' >/dev/null ||
    fail "4 x 24 GiB: ZeRO rows: $(echo "$a" | jq -c '[.rows[] | select(.zero_stage >= 1)][0]')"
# ZeRO-3 rows: the parameters and gradients partitioned too (a quarter,
# plus the gather slots), still over 24 GiB without offload
echo "$a" | jq -e '
    ([.rows[] | select(.mode == "full" and .zero_stage == 0 and .recompute == false)][0]) as $z0 |
    [.rows[] | select(.mode == "full" and .zero_stage == 3 and (.offload_optimizer | not))] as $z |
    ($z | length) > 0 and
    ($z | all(.weights_bytes * 2 < $z0.weights_bytes and .gradients_bytes * 2 < $z0.gradients_bytes
              and .optimizer_bytes * 4 <= $z0.optimizer_bytes + 64 and .fits == false))' >/dev/null ||
    fail "4 x 24 GiB: ZeRO-3 rows: $(echo "$a" | jq -c '[.rows[] | select(.zero_stage == 3)][0]')"
# ZeRO-3 with the optimizer offloaded: the moments and master copy of a
# rank's quarter in host memory (12 bytes a parameter), and its gradient
# partition (4 bytes a parameter, plus one slice's staging: under 1 GiB), so
# the device's gradients are the slots and the trainer's alone (under 2 GiB)
echo "$a" | jq -e '
    [.rows[] | select(.mode == "full" and .zero_stage == 3 and .offload_optimizer and (.offload_param | not))] as $z |
    ($z | length) > 0 and ($z | all(.optimizer_bytes == 0 and .host_optimizer_bytes * 4 >= 12 * 6738415616
        and .host_optimizer_bytes * 4 <= 12 * 6738415616 + 256
        and .host_params_bytes * 4 >= 4 * 6738415616 and .host_params_bytes * 4 <= 4 * 6738415616 + 4 * 1073741824
        and .gradients_bytes < 2 * 1073741824 and .job_host_bytes == 4 * .host_bytes))' >/dev/null ||
    fail "4 x 24 GiB: ZeRO-3 + optimizer offload: $(echo "$a" | jq -c '[.rows[] | select(.zero_stage == 3 and .offload_optimizer)][0]')"
ok "4 x 24 GiB: $(echo "$a" | jq -r .summary.message)"

# ---- issue 20's spec (B 32, bf16, lean activations) on four 24 GiB cards and a
# host of 512 GiB: a full fine-tune fits with ZeRO-3 and the optimizer offloaded,
# the first full variant that does (least change), stating its host bytes ----
S20='"model": {"from": "llama2-7b", "seq_len": 4096}, "train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto", "precision": "bf16", "lean_activations": true'
a=$(plan "$S20" '{"device_memory": "24GiB", "devices": 4, "kind": "cuda", "host_memory": "512GiB"}')
echo "$a" | jq -e '
    ([.groups[] | select(.mode == "full" and .largest_fitting_micro_batch != null)][0]) as $g |
    $g.zero_stage == 3 and $g.offload_optimizer and $g.device_bytes <= 0.95 * 24 * 1073741824
    and $g.host_bytes * 4 >= 16 * 6738415616
    and ([.groups[] | select(.mode == "full" and (.offload_optimizer | not))] | all(.largest_fitting_micro_batch == null))' \
    >/dev/null || fail "4 x 24 GiB, issue 20: $(echo "$a" | jq -c '[.groups[] | select(.mode == "full")]')"
ok "4 x 24 GiB, B 32 bf16 lean: $(echo "$a" | jq -r '[.groups[] | select(.mode == "full" and .largest_fitting_micro_batch != null)][0]
    | "full ZeRO-3 + optimizer offload m \(.largest_fitting_micro_batch): \(.device_bytes) device bytes, \(.host_bytes) host bytes a rank"')"

# ---- 80 GiB: no full fine-tune with the optimizer on the card; LoRA fits, and
# the summary suggests it (least change: before any optimizer offload) ----
a=$(plan "$SPEC" '{"device_memory": "80GiB", "devices": 1, "kind": "cuda"}')
echo "$a" | jq -e '.summary.fits == false and .summary.suggested.mode == "lora" and .summary.suggested.fits
    and ([.groups[] | select(.mode == "full" and (.offload_optimizer | not)) | .largest_fitting_micro_batch]
         | all(. == null))' >/dev/null ||
    fail "80 GiB: $(echo "$a" | jq -c '.summary, .groups')"
ok "80 GiB: $(echo "$a" | jq -r .summary.message)"

# ---- 141 GiB: a full fine-tune fits ----------------------------------------------
a=$(plan "$SPEC" '{"device_memory": "141GiB", "devices": 1, "kind": "cuda"}')
echo "$a" | jq -e '.summary.fits == true and .summary.recommended.mode == "full" and .summary.recommended.fits' \
    >/dev/null || fail "141 GiB: $(echo "$a" | jq -c .summary)"
# the dry run's start: the largest fitting m of the spec's mode, else m = 1 recomputing (oom.adapt)
m=$(echo "$a" | jq '.groups[] | select(.mode == "full" and .zero_stage == 0 and .recompute == false and (.offload_optimizer | not)) | .largest_fitting_micro_batch')
if [ "$m" = null ]; then
    expect_eq "141 GiB: the recompute fallback" "$(echo "$a" | jq -c '.summary.recommended | [.micro_batch, .recompute]')" '[1,true]'
else
    expect_eq "141 GiB: the largest stored fit" "$(echo "$a" | jq .summary.recommended.micro_batch)" "$m"
fi
ok "141 GiB: $(echo "$a" | jq -r .summary.message)"

# ---- the weights are never read ---------------------------------------------------
g=$(plan '"model": {"from": "llama2-7b-garbage", "seq_len": 4096}, "train_batch_size": 8' \
    '{"device_memory": "141GiB", "kind": "cuda"}')
expect_eq "garbage weights plan alike" "$(echo "$g" | jq -c '[.rows[].device_bytes]')" \
    "$(echo "$a" | jq -c '[.rows[].device_bytes]')"
for dir in llama2-7b llama2-7b-garbage; do
    expect_error POST /v1/jobs "{\"model\": {\"from\": \"$dir\", \"seq_len\": 64}, \"data\": {\"train\": \"gpl.txt\"}, \"train_batch_size\": 8}" \
        400 model.from
    expect_error POST '/v1/jobs?dry_run=1' "{\"model\": {\"from\": \"$dir\", \"seq_len\": 64}, \"data\": {\"train\": \"gpl.txt\"}, \"train_batch_size\": 8}" \
        400 model.from
done
# still resolved under data_roots
expect_error POST /v1/plan '{"model": {"from": "/etc"}, "train_batch_size": 8}' 400 model.from
expect_error POST /v1/plan '{"model": {"from": "../llama2-7b"}, "train_batch_size": 8}' 400 model.from
ok "config.json only: plans without (or with unreadable) weights; submit refuses both"

# ---- bad input ----------------------------------------------------------------------
bad() { expect_error POST /v1/plan "{$SPEC, \"hardware\": $1}" 400 "$2"; }
bad '{"device_memory": "lots"}' hardware.device_memory
bad '{"device_memory": "24QB"}' hardware.device_memory
bad '{"device_memory": 1000}' hardware.device_memory
bad '{"device_memory": null}' hardware.device_memory
bad '{"devices": 0}' hardware.devices
bad '{"devices": 2.5}' hardware.devices
bad '{"devices": 3}' train_batch_size # 8 % 3: resolved as submit would with devices 3 (issue 23)
bad '{"devices": 100}' hardware.devices
bad '{"kind": "tpu"}' hardware.kind
bad '{"kind": "cuda"}' hardware.device_memory
bad '{"gpus": 4}' hardware
bad '"24GiB"' hardware
expect_error POST /v1/plan "{$SPEC, \"lr\": 1}" 400 lr
expect_error POST /v1/plan '[1]' 400 ""
expect_error POST /v1/plan '' 400 ""
expect_error GET /v1/plan '' 405 ""
ok "bad hardware values: 400 naming the field"

# ---- without hardware: this machine's devices --------------------------------------
a=$(plan "$SPEC" '{}')
expect_eq "this machine" "$(echo "$a" | jq -c '[.hardware.kind, .hardware.device_memory_bytes, .hardware.given]')" \
    '["cpu",268435456,true]'

# ---- accumctl plan ------------------------------------------------------------------
if [ -n "${ACCUMCTL:-}" ]; then
    echo "{$SPEC}" >"$ACC_TMP/7b.json"
    out=$("$ACCUMCTL" --state-dir "$STATE" plan "$ACC_TMP/7b.json" --device-memory 24GiB --devices 4 --kind cuda 2>&1) ||
        fail "accumctl plan: $out"
    echo "$out" | grep -q '^hardware: *4 x cuda of 24.0 GiB' || fail "accumctl plan header: $out"
    echo "$out" | grep -Eq '^full +0 +off +none .*model state 100.4 GiB alone' || fail "accumctl plan groups: $out"
    echo "$out" | grep -q 'no POST /v1/plan' && fail "accumctl fell back to the dry run: $out"
    ok "accumctl plan: $(echo "$out" | grep '^summary:')"
fi
acc_stop

#!/bin/bash
# A job brought as it is (h-dsconf), over HTTP with curl:
#   - "deepspeed": "ds_zero2.json", a DeepSpeed file in the shape projects
#     publish for the Hugging Face Trainer (ZeRO-2, "auto" everywhere, the
#     bucket / overlap tuning keys) submits without edits; the dry run shows
#     the file and the ignored keys; the job trains on 2 CPU devices with the
#     file's stage and the spec's values, and its log lists each ignored key;
#   - a number in the file that differs from the spec's is a 400 showing both;
#   - TrainingArguments names (learning_rate, per_device_train_batch_size,
#     bf16, ...) give the same job, and the same losses, as the spec's own
#     keys; an alias against its key is a 400 naming both;
#   - an unknown key gets "did you mean" with the closest key;
#   - a hub name not in the hf_hub_cache is a 400 saying where it looked and
#     which huggingface-cli command would fetch it.
. "$(dirname "$0")/lib.sh"

acc_data
D=$STATE/data
cat > "$D/ds_zero2.json" <<'EOF'
{
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                               "warmup_num_steps": "auto"}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none", "pin_memory": true},
                        "allgather_partitions": true, "allgather_bucket_size": 200000000, "overlap_comm": true,
                        "reduce_scatter": true, "reduce_bucket_size": "auto", "contiguous_gradients": true},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false
}
EOF
acc_start --set cpu_devices=2 --set cpu_device_memory=512M --set cpu_threads_per_device=1 --set "hf_hub_cache=$ACC_TMP/hub"
mkdir -p "$ACC_TMP/hub"

model='"model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"}'
hf="{\"name\":\"hf\",$model,\"deepspeed\":\"ds_zero2.json\",\"learning_rate\":0.002,\"per_device_train_batch_size\":2,\"gradient_accumulation_steps\":2,\"devices\":2,\"max_steps\":3,\"warmup_steps\":2,\"weight_decay\":0.0,\"max_grad_norm\":0.5,\"seed\":11,\"logging_steps\":1}"
own="{\"name\":\"own\",$model,\"zero_optimization\":{\"stage\":2},\"optimizer\":{\"lr\":0.002,\"weight_decay\":0.0,\"grad_clip\":0.5},\"lr_schedule\":{\"type\":\"warmup\",\"warmup_steps\":2},\"train_micro_batch_size_per_gpu\":2,\"gradient_accumulation_steps\":2,\"devices\":2,\"max_steps\":3,\"seed\":11}"

# ---- the dry run: the file, the split, the ignored keys -----------------------
dry=$(acc_curl -X POST --data-binary "$hf" "$BASE/v1/jobs?dry_run=1")
echo "$dry" | jq -e '.batch.train_batch_size == 8 and .batch.micro_batch == 2 and .batch.accum_steps == 2' >/dev/null ||
    fail "dry run split: $dry"
expect_eq "dry run: the file" "$(echo "$dry" | jq -r .resolved.deepspeed_file)" "$D/ds_zero2.json"
for k in deepspeed.fp16.loss_scale deepspeed.zero_optimization.overlap_comm deepspeed.zero_optimization.reduce_bucket_size \
         deepspeed.zero_optimization.allgather_bucket_size deepspeed.zero_optimization.contiguous_gradients \
         deepspeed.zero_optimization.offload_optimizer deepspeed.steps_per_print deepspeed.wall_clock_breakdown; do
    echo "$dry" | jq -e --arg k "$k" '.resolved.ignored_keys | index($k)' >/dev/null || fail "dry run: $k not ignored: $dry"
done
echo "$dry" | jq -e '.resolved.ignored_keys | map(startswith("logging_steps")) | any' >/dev/null ||
    fail "dry run: logging_steps not listed: $dry"
ok "dry run: the DeepSpeed file, B 8 = 2 x 2 x 2, every tuning key listed as ignored"

# ---- the job: trains with the file's stage; its log lists the ignored keys -----
j1=$(acc_submit "$hf") || exit 1
j2=$(acc_submit "$own") || exit 1
acc_wait_state "$j1" succeeded 120
acc_wait_state "$j2" succeeded 120
log=$(acc_curl "$BASE/v1/jobs/$j1/events?format=ndjson&since=0" --max-time 5 | jq -r 'select(.type == "log") | .message')
for k in deepspeed.zero_optimization.overlap_comm deepspeed.zero_optimization.reduce_bucket_size deepspeed.steps_per_print \
         deepspeed.fp16.initial_scale_power logging_steps; do
    grep -qF "$k" <<<"$log" || fail "the job's log does not list $k: $log"
done
grep -q "^ignored" <<<"$log" || fail "no ignored line: $log"
history() { acc_curl "$BASE/v1/jobs/$1/metrics" | jq -c '[.steps[] | [.step, .loss, .lr]]'; }
h1=$(history "$j1")
h2=$(history "$j2")
expect_eq "the DeepSpeed file with HF names = the spec's own keys (losses, lr)" "$h1" "$h2"
expect_eq "steps" "$(echo "$h1" | jq length)" 3
ok "DS file + HF names trained like the native spec: $(echo "$h1" | jq -c '[.[][1]]'); ignored keys in the log"

# ---- disagreements, did-you-mean, hub misses ------------------------------------
sed -i 's/"lr": "auto"/"lr": 0.0003/' "$D/ds_zero2.json"
out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$hf" "$BASE/v1/jobs")
expect_eq "file vs spec: status" "${out##*$'\n'}" 400
msg=$(echo "${out%$'\n'*}" | jq -r .error.message)
expect_eq "file vs spec: field" "$(echo "${out%$'\n'*}" | jq -r .error.field)" deepspeed.optimizer.params.lr
for s in 0.0003 0.002 ds_zero2.json learning_rate; do
    grep -qF "$s" <<<"$msg" || fail "file vs spec: '$s' not in: $msg"
done
expect_error POST /v1/jobs "{$model,\"train_batch_size\":8,\"learning_rate\":0.1,\"optimizer\":{\"lr\":0.2}}" 400 learning_rate
expect_error POST /v1/jobs "{$model,\"train_batch_size\":8,\"bf16\":true,\"precision\":\"fp32\"}" 400 bf16
out=$(acc_curl -X POST --data-binary "{$model,\"train_batch_size\":8,\"learning_rte\":0.1}" "$BASE/v1/jobs")
expect_eq "did you mean: field" "$(echo "$out" | jq -r .error.field)" learning_rte
echo "$out" | jq -r .error.message | grep -qF "did you mean 'learning_rate'?" || fail "did you mean: $out"
out=$(acc_curl -X POST --data-binary "{$model,\"train_batch_size\":8,\"zero_optimization\":{\"stage\":2,\"overlap_com\":true}}" "$BASE/v1/jobs")
echo "$out" | jq -r .error.message | grep -qF "did you mean 'overlap_comm'?" || fail "did you mean (zero): $out"
out=$(acc_curl -X POST --data-binary '{"model_name_or_path":"meta-llama/Llama-2-7b-hf","data":{"train":"gpl.txt"},"train_batch_size":8}' "$BASE/v1/jobs")
expect_eq "hub miss: field" "$(echo "$out" | jq -r .error.field)" model_name_or_path
echo "$out" | jq -r .error.message | grep -qF "huggingface-cli download meta-llama/Llama-2-7b-hf --cache-dir $ACC_TMP/hub" ||
    fail "hub miss: $out"
echo "$out" | jq -r .error.message | grep -qF "$ACC_TMP/hub/models--meta-llama--Llama-2-7b-hf" || fail "hub miss: where: $out"
out=$(acc_curl -X POST --data-binary "{$model,\"train_batch_size\":8,\"devices\":2,\"deepspeed\":{\"zero_optimization\":{\"stage\":3,\"offload_param\":{\"device\":\"cpu\"}}}}" "$BASE/v1/jobs")
expect_eq "ZeRO-3 parameter offload: field" "$(echo "$out" | jq -r .error.field)" deepspeed.zero_optimization.offload_param
echo "$out" | jq -r .error.message | grep -qF "offload_optimizer" || fail "ZeRO-3 parameter offload without optimizer offload: $out"
ok "file vs spec and alias vs key: 400s showing both; did-you-mean; hub miss names the download; ZeRO-3 parameter offload names its key"

acc_stop

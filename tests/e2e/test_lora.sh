#!/bin/bash
# LoRA through the daemon with curl: a tiny Hugging Face LLaMA directory
# (bf16: its frozen base stays bf16 on the device, the dry run's predicted
# peak is the measured one to the byte) fine-tuned with "lora" (all-linear, gradient checkpointing, merge_lora);
# bad lora input is a 400 naming the field; the job's outputs name the PEFT
# adapter directory (adapter_config.json, adapter_model.safetensors with
# PEFT's names) and the merged model, and the PyTorch reference gives the
# merged model the loss of base + adapter (PEFT's formula, written here).
# Skips (77) when /usr/bin/python3 has no torch.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
SUP="$ACCUMD_SRC/tests/support"
"$PY" -c 'import torch' 2>/dev/null || { echo "skip: no torch in $PY"; exit 77; }

acc_data
"$PY" "$SUP/make_tiny_llama.py" "$STATE/data/tiny" --variant big+gqa+bf16 --seed 4 ||
    fail "make_tiny_llama"
acc_start --set cpu_devices=1 --set cpu_device_memory=512M --set cpu_threads_per_device=1

# expect_400 WHAT SPEC_EXTRA FIELD
expect_400() {
    local spec out
    spec="{\"model\":{\"from\":\"tiny\",\"seq_len\":32},\"data\":{\"train\":\"gpl.txt\",\"format\":\"text\"},\"train_batch_size\":4,\"max_steps\":2,$2}"
    out=$(curl -s -w '\n%{http_code}' -X POST --data-binary "$spec" "$BASE/v1/jobs")
    expect_eq "$1: status" "${out##*$'\n'}" 400
    expect_eq "$1: field" "$(echo "${out%$'\n'*}" | jq -r .error.field)" "$3"
}
expect_400 "a module llama has not" '"lora":{"r":8,"target_modules":["q_proj","c_attn"]}' 'lora.target_modules[1]'
expect_400 "r of 0" '"lora":{"r":0}' lora.r
expect_400 "unknown lora key" '"lora":{"r":8,"rank":8}' lora.rank
expect_400 "dropout" '"lora":{"r":8,"dropout":0.05}' lora.dropout
expect_400 "merge without lora" '"save":{"merge_lora":true}' save.merge_lora
out=$(curl -s -w '\n%{http_code}' -X POST --data-binary \
    '{"model":{"arch":"gpt2","n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":4,"lora":{"r":4,"target_modules":["c_attn","q_proj"]}}' \
    "$BASE/v1/jobs")
expect_eq "gpt2 lora, a module it has not: status" "${out##*$'\n'}" 400
expect_eq "gpt2 lora, a module it has not: field" "$(echo "${out%$'\n'*}" | jq -r .error.field)" 'lora.target_modules[1]'
ok "bad lora input refused at submit, naming the field"

spec='{"name":"lora","model":{"from":"tiny","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"train_micro_batch_size_per_gpu":2,"max_steps":6,"checkpoint_interval":3,"optimizer":{"lr":0.01},"activation_checkpointing":true,"lora":{"r":4,"alpha":8,"dropout":0.0,"target_modules":"all-linear"},"save":{"merge_lora":true,"dtype":"float32"}}'
# the bf16 directory's frozen base stays bf16 on the device: the dry run's
# prediction is the peak the job measures, to the byte
pred=$(curl -s -X POST --data-binary "$spec" "$BASE/v1/jobs?dry_run=1" | jq '.predicted_peak_memory_bytes[0]')
id=$(acc_submit "$spec")
acc_wait_state "$id" succeeded 300
job=$(acc_curl "$BASE/v1/jobs/$id")
peak=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '[.steps[].mem_peak_bytes] | max')
expect_eq "bf16 base: predicted peak = measured peak" "$peak" "$pred"
ok "LoRA on a bf16 directory: predicted and measured peak $peak bytes"
adapter=$(echo "$job" | jq -r .outputs.adapter)
merged=$(echo "$job" | jq -r .outputs.merged)
[ -d "$adapter" ] && [ "$merged" = "$adapter/merged" ] || fail "outputs: $(echo "$job" | jq -c .outputs)"
for d in $(echo "$job" | jq -r '.outputs.checkpoints[]'); do
    for f in adapter_config.json adapter_model.safetensors merged/config.json merged/model.safetensors; do
        [ -f "$d/$f" ] || fail "$d has no $f"
    done
done
jq -e '.peft_type == "LORA" and .r == 4 and .lora_alpha == 8 and .task_type == "CAUSAL_LM" and .bias == "none"
       and (.target_modules | length) == 7' "$adapter/adapter_config.json" >/dev/null ||
    fail "adapter_config.json: $(cat "$adapter/adapter_config.json")"
first=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '.steps[0].loss')
last=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '.steps[-1].loss')
jq -en "$last < $first" >/dev/null || fail "loss did not go down: $first -> $last"
ok "LoRA job: outputs $(echo "$job" | jq -c .outputs), loss $first -> $last"

# the reference: PEFT's names and shapes, and merged = base + adapter
"$PY" "$SUP/make_tiny_llama.py" "$ACC_TMP/scratch" --variant big --batch "$ACC_TMP/batch" 2 16 >/dev/null
"$PY" - "$STATE/data/tiny" "$adapter" "$ACC_TMP/batch" <<'PYEOF' || fail "reference check"
import json, os, sys
sys.path.insert(0, os.path.join(os.environ["ACCUMD_SRC"], "tests", "support"))
import llama_ref, lora_check
base, ad_dir, batch = sys.argv[1:]
ac = json.load(open(os.path.join(ad_dir, "adapter_config.json")))
ad = llama_ref.st_read(os.path.join(ad_dir, "adapter_model.safetensors"))
cfg = llama_ref.Config(json.load(open(os.path.join(base, "config.json"))))
want = lora_check.peft_names(cfg, ac["target_modules"], ac["r"])
got = {n: list(t.shape) for n, t in ad.items()}
assert got == want, f"adapter tensors {sorted(got)[:3]} != {sorted(want)[:3]}"
assert any(t.abs().max().item() > 0 for n, t in ad.items() if "lora_B" in n), "B never trained"
lm, _ = lora_check.ref_logits(os.path.join(ad_dir, "merged"), batch)
la, _ = lora_check.ref_logits(base, batch, ad, ac["lora_alpha"] / ac["r"])
lb, _ = lora_check.ref_logits(base, batch)
r = lora_check.rel(lm, la)
assert r <= 1e-5, f"merged vs base + adapter: {r:.2e}"
assert lora_check.rel(lb, la) > 1e-4, "the adapter changes nothing"
print(f"reference: {len(got)} adapter tensors, merged = base + adapter within {r:.1e}")
PYEOF
ok "the adapter directory has PEFT's names; the merged model is base + adapter"

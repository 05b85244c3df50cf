#!/bin/bash
# (h-nf4, issue 21) QLoRA through the daemon with curl: a tiny LLaMA
# quantized at load ("model.quantize": "nf4") and a 4-bit directory in
# transformers' layout (written by qlora_check.py's reference) fine-tuned
# with LoRA; the dry run's predicted peak is the measured one to the byte;
# the merged model has no quantization_config and equals the dequantized
# base + adapter (PyTorch); bad input is a 400 naming the field.
# Skips (77) when /usr/bin/python3 has no torch.
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
SUP="$ACCUMD_SRC/tests/support"
"$PY" -c 'import torch, numpy' 2>/dev/null || { echo "skip: no torch in $PY"; exit 77; }

acc_data
"$PY" "$SUP/make_tiny_llama.py" "$STATE/data/tiny" --variant big+gqa --seed 4 || fail "make_tiny_llama"
"$PY" - "$STATE/data/tiny" "$STATE/data/tiny4" "$ACC_TMP/tiny-dequant" <<'PYEOF' || fail "quantize_dir"
import os, sys
sys.path.insert(0, os.path.join(os.environ["ACCUMD_SRC"], "tests", "support"))
import qlora_check
qlora_check.quantize_dir(*sys.argv[1:])
PYEOF
mkdir -p "$STATE/data/tiny4-fp4" && cp "$STATE/data/tiny4/model.safetensors" "$STATE/data/tiny4-fp4/"
jq '.quantization_config.bnb_4bit_quant_type = "fp4"' "$STATE/data/tiny4/config.json" >"$STATE/data/tiny4-fp4/config.json"
acc_start --set cpu_devices=1 --set cpu_device_memory=512M --set cpu_threads_per_device=1

# expect_400 WHAT MODEL_JSON EXTRA FIELD
expect_400() {
    local spec out
    spec="{\"model\":$2,\"data\":{\"train\":\"gpl.txt\",\"format\":\"text\"},\"train_batch_size\":4,\"max_steps\":2$3}"
    out=$(curl -s -w '\n%{http_code}' -X POST --data-binary "$spec" "$BASE/v1/jobs")
    expect_eq "$1: status" "${out##*$'\n'}" 400
    expect_eq "$1: field" "$(echo "${out%$'\n'*}" | jq -r .error.field)" "$4"
}
expect_400 "quantize without lora" '{"from":"tiny","seq_len":32,"quantize":"nf4"}' '' lora.r
expect_400 "a 4-bit directory without lora" '{"from":"tiny4","seq_len":32}' '' lora.r
expect_400 "quantize fp4" '{"from":"tiny","seq_len":32,"quantize":"fp4"}' ',"lora":{"r":4}' model.quantize
expect_400 "an fp4 directory" '{"from":"tiny4-fp4","seq_len":32}' ',"lora":{"r":4}' model.from
expect_400 "quantize a model without model.from" \
    '{"arch":"gpt2","n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256,"quantize":"nf4"}' \
    ',"lora":{"r":4}' model.quantize
ok "bad QLoRA input refused at submit, naming the field"

for src in tiny tiny4; do
    q=$([ "$src" = tiny ] && echo ',"quantize":"nf4"' || echo '')
    spec="{\"name\":\"qlora-$src\",\"model\":{\"from\":\"$src\",\"seq_len\":32$q},\"data\":{\"train\":\"gpl.txt\",\"format\":\"text\"},\"train_batch_size\":4,\"train_micro_batch_size_per_gpu\":2,\"max_steps\":6,\"optimizer\":{\"lr\":0.01},\"activation_checkpointing\":true,\"lora\":{\"r\":4,\"alpha\":8,\"target_modules\":\"all-linear\"},\"save\":{\"merge_lora\":true,\"dtype\":\"float32\"}}"
    pred=$(curl -s -X POST --data-binary "$spec" "$BASE/v1/jobs?dry_run=1" | jq '.predicted_peak_memory_bytes[0]')
    id=$(acc_submit "$spec")
    acc_wait_state "$id" succeeded 300
    job=$(acc_curl "$BASE/v1/jobs/$id")
    peak=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '[.steps[].mem_peak_bytes] | max')
    expect_eq "$src: predicted peak = measured peak" "$peak" "$pred"
    first=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '.steps[0].loss')
    last=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '.steps[-1].loss')
    jq -en "$last < $first" >/dev/null || fail "$src: loss did not go down: $first -> $last"
    adapter=$(echo "$job" | jq -r .outputs.adapter)
    jq -e 'has("quantization_config") | not' "$adapter/merged/config.json" >/dev/null ||
        fail "$src: the merged config.json is 4-bit"
    "$PY" - "$ACC_TMP/tiny-dequant" "$adapter" <<'PYEOF' || fail "$src: reference check"
import json, os, sys, tempfile
sys.path.insert(0, os.path.join(os.environ["ACCUMD_SRC"], "tests", "support"))
import llama_ref, lora_check, subprocess
deq, ad_dir = sys.argv[1:]
batch = os.path.join(tempfile.mkdtemp(), "batch")
subprocess.run([sys.executable, os.path.join(os.environ["ACCUMD_SRC"], "tests", "support", "make_tiny_llama.py"),
                batch + ".m", "--variant", "big", "--batch", batch, "2", "16"], check=True, stdout=subprocess.DEVNULL)
ac = json.load(open(os.path.join(ad_dir, "adapter_config.json")))
ad = llama_ref.st_read(os.path.join(ad_dir, "adapter_model.safetensors"))
lm, _ = lora_check.ref_logits(os.path.join(ad_dir, "merged"), batch)
la, _ = lora_check.ref_logits(deq, batch, ad, ac["lora_alpha"] / ac["r"])
r = lora_check.rel(lm, la)
assert r <= 1e-5, f"merged vs dequantized base + adapter: {r:.2e}"
print(f"reference: merged = dequantized base + adapter within {r:.1e}")
PYEOF
    ok "QLoRA from $src: peak $peak bytes as predicted, loss $first -> $last, merged = dequantized base + adapter"
done

# POST /v1/plan: qlora rows beside full and lora ones, the 4-bit base lighter
# than the fp32 one; a 4-bit directory plans without full rows
plan=$(curl -s -X POST --data-binary '{"model":{"from":"tiny","seq_len":32,"quantize":"nf4"},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"lora":{"r":4,"target_modules":"all-linear"}}' "$BASE/v1/plan")
echo "$plan" | jq -e '([.rows[] | select(.mode == "qlora")] | length) > 0 and ([.rows[] | select(.mode == "full")] | length) > 0
    and ([.rows[] | select(.mode == "qlora")][0].weights_bytes < [.rows[] | select(.mode == "lora")][0].weights_bytes)' >/dev/null ||
    fail "plan with quantize: $(echo "$plan" | jq -c '[.rows[] | {mode, weights_bytes}] | unique' 2>/dev/null || echo "$plan")"
plan=$(curl -s -X POST --data-binary '{"model":{"from":"tiny4","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"lora":{"r":4}}' "$BASE/v1/plan")
echo "$plan" | jq -e '([.rows[] | select(.mode == "full")] | length) == 0 and ([.rows[] | select(.mode == "lora")] | length) > 0' >/dev/null ||
    fail "plan of a 4-bit directory: $(echo "$plan" | jq -c '[.rows[] | .mode] | unique' 2>/dev/null || echo "$plan")"
ok "POST /v1/plan: qlora rows lighter than lora ones; a 4-bit directory has no full rows"

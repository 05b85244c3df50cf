#!/bin/bash
# A Hugging Face LLaMA directory fine-tuned on text through the daemon:
# "model": {"from": DIR}; a bad checkpoint is a 400 naming the file and the
# tensor; the job lists its outputs, each a Hugging Face directory
# (config.json, model.safetensors, tokenizer files) that loads back: the
# PyTorch reference reads it, and a second job starts from it.
# Skips (77) when /usr/bin/python3 has no torch (the checkpoints are made
# with tests/support/make_tiny_llama.py).
. "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
SUP="$ACCUMD_SRC/tests/support"
. "$ACCUMD_SRC/tests/support/need.sh"
"$PY" -c 'import torch' 2>/dev/null || need_missing "no torch in $PY"

acc_data
# vocab 300 >= the 256 byte values of text data; GQA, sharded, BF16 on disk
"$PY" "$SUP/make_tiny_llama.py" "$STATE/data/tiny" --variant big+gqa+sharded+bf16 --seed 3 ||
    fail "make_tiny_llama"
"$PY" "$SUP/make_tiny_llama.py" "$STATE/data/broken" --variant big --bad missing ||
    fail "make_tiny_llama --bad"
acc_start --set cpu_devices=1 --set cpu_device_memory=512M --set cpu_threads_per_device=1

# a bad checkpoint: 400 at submit, naming the file and the tensor
spec_bad='{"name":"bad","model":{"from":"broken","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"max_steps":2}'
out=$(curl -s -w '\n%{http_code}' -X POST --data-binary "$spec_bad" "$BASE/v1/jobs")
expect_eq "bad checkpoint status" "${out##*$'\n'}" 400
body=${out%$'\n'*}
expect_eq "bad checkpoint field" "$(echo "$body" | jq -r .error.field)" model.from
echo "$body" | jq -r .error.message | grep -q 'broken/model.safetensors: missing tensor model.layers.1.mlp.up_proj.weight' ||
    fail "bad checkpoint message: $body"
out=$(curl -s -w '\n%{http_code}' -X POST --data-binary \
    '{"model":{"from":"tiny","n_layer":3},"data":{"train":"gpl.txt","format":"text"}}' "$BASE/v1/jobs")
expect_eq "sizes with from" "${out##*$'\n'}" 400
expect_eq "sizes with from: field" "$(echo "${out%$'\n'*}" | jq -r .error.field)" model.n_layer
ok "bad checkpoints refused at submit"

spec='{"name":"ft","model":{"from":"tiny","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"train_micro_batch_size_per_gpu":2,"max_steps":6,"checkpoint_interval":3,"optimizer":{"lr":0.003}}'
id=$(acc_submit "$spec")
acc_wait_state "$id" succeeded 300
job=$(acc_curl "$BASE/v1/jobs/$id")
final=$(echo "$job" | jq -r .outputs.model)
[ -n "$final" ] && [ "$final" != null ] || fail "no outputs.model: $(echo "$job" | jq -c .outputs)"
expect_eq "checkpoints listed" "$(echo "$job" | jq '.outputs.checkpoints | length')" 2
for d in $(echo "$job" | jq -r '.outputs.checkpoints[]') "$final"; do
    for f in config.json model.safetensors tokenizer.json generation_config.json; do
        [ -f "$d/$f" ] || fail "$d has no $f"
    done
done
jq -e '.architectures == ["LlamaForCausalLM"] and .num_key_value_heads == 2 and .torch_dtype != null' \
    "$final/config.json" >/dev/null || fail "output config: $(cat "$final/config.json")"
first=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '.steps[0].loss')
last=$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '.steps[-1].loss')
jq -en "$last < $first" >/dev/null || fail "loss did not go down: $first -> $last"
ok "fine-tuned: outputs $(echo "$job" | jq -c .outputs)"

# the output loads back: the reference reads it, and a job starts from it
"$PY" "$SUP/make_tiny_llama.py" "$ACC_TMP/scratch" --variant big --batch "$ACC_TMP/batch" 2 16 >/dev/null
loss=$("$PY" "$SUP/llama_ref.py" loss "$final" "$ACC_TMP/batch") || fail "the reference cannot read $final"
jq -en "$loss > 0" >/dev/null || fail "reference loss $loss"
mkdir -p "$STATE/data/again"
cp "$final"/* "$STATE/data/again/"
id2=$(acc_submit '{"name":"again","model":{"from":"again","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"max_steps":2}')
acc_wait_state "$id2" succeeded 300
first2=$(acc_curl "$BASE/v1/jobs/$id2/metrics" | jq '.steps[0].loss')
jq -en "$first2 < $first" >/dev/null || fail "the second job did not start from the trained weights: $first2 vs $first"
ok "the output directory loads back (reference loss $loss; a job from it starts at $first2 < $first)"

# kill -9 mid-run: the LLaMA job resumes from its last checkpoint and ends
# with the step history of an uninterrupted run (exact on CPU)
spec_k='{"name":"kill","model":{"from":"tiny","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"train_micro_batch_size_per_gpu":2,"max_steps":60,"checkpoint_interval":15,"seed":5}'
ref=$(acc_submit "$spec_k")
acc_wait_state "$ref" succeeded 300
ref_hist=$(acc_curl "$BASE/v1/jobs/$ref/metrics" | jq -c '[.steps[] | [.step, .loss]]')
kid=$(acc_submit "$spec_k")
acc_wait_step "$kid" 20
acc_kill9
[ "$(acc_db "SELECT state FROM jobs WHERE id = '$kid'")" = running ] || fail "the job ended before the kill"
acc_start --set cpu_devices=1 --set cpu_device_memory=512M --set cpu_threads_per_device=1
acc_wait_state "$kid" succeeded 300
acc_events_text "$kid" | grep -q 'resumed from' || fail "no resume after the restart"
expect_eq "step history after kill -9 and resume" \
    "$(acc_curl "$BASE/v1/jobs/$kid/metrics" | jq -c '[.steps[] | [.step, .loss]]')" "$ref_hist"
acc_curl "$BASE/v1/jobs/$kid" | jq -e '.outputs.model | endswith("ckpt-00000060")' >/dev/null ||
    fail "outputs after resume: $(acc_curl "$BASE/v1/jobs/$kid" | jq -c .outputs)"
expect_eq "the resumed job saved bf16 (auto)" \
    "$(jq -r .torch_dtype "$(acc_curl "$BASE/v1/jobs/$kid" | jq -r .outputs.model)/config.json")" bfloat16
ok "kill -9 at step >= 20, resumed: the same $(echo "$ref_hist" | jq length)-step history"

# save.dtype: "auto" kept tiny's bf16 above (and that job resumed exactly
# from bf16-saving checkpoints: state.safetensors holds the fp32 weights);
# the same job saved in each dtype gives, by PyTorch's own conversions, the
# rounded float32 output, and the reference's loss on the bf16 one is the
# float32 one's within bf16 tolerance
expect_eq "auto dtype" "$(jq -r .torch_dtype "$final/config.json")" bfloat16
out=$(curl -s -w '\n%{http_code}' -X POST --data-binary \
    '{"model":{"from":"tiny","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"save":{"dtype":"fp8"}}' "$BASE/v1/jobs")
expect_eq "bad save.dtype" "${out##*$'\n'}" 400
expect_eq "bad save.dtype: field" "$(echo "${out%$'\n'*}" | jq -r .error.field)" save.dtype
declare -A dout
for dt in float32 bfloat16 float16; do
    did=$(acc_submit '{"name":"dt-'$dt'","model":{"from":"tiny","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"max_steps":3,"seed":9,"save":{"format":"hf","dtype":"'$dt'"}}')
    acc_wait_state "$did" succeeded 300
    dout[$dt]=$(acc_curl "$BASE/v1/jobs/$did" | jq -r .outputs.model)
    expect_eq "save.dtype $dt: torch_dtype" "$(jq -r .torch_dtype "${dout[$dt]}/config.json")" $dt
done
"$PY" - "$SUP" "${dout[float32]}" "${dout[bfloat16]}" "${dout[float16]}" <<'PYEOF' || fail "saved dtypes differ from PyTorch's rounding"
import sys, torch
sys.path.insert(0, sys.argv[1])
from llama_ref import load_dir
_, f32 = load_dir(sys.argv[2])
for d, dt in ((sys.argv[3], torch.bfloat16), (sys.argv[4], torch.float16)):
    _, t = load_dir(d)
    assert t.keys() == f32.keys(), d
    for k, v in f32.items():
        assert v.dtype == torch.float32 and t[k].dtype == dt, (k, v.dtype, t[k].dtype)
        assert torch.equal(v.to(dt).view(torch.int16), t[k].view(torch.int16)), (d, k)
PYEOF
l32=$("$PY" "$SUP/llama_ref.py" loss "${dout[float32]}" "$ACC_TMP/batch") || fail "reference on float32"
l16=$("$PY" "$SUP/llama_ref.py" loss "${dout[bfloat16]}" "$ACC_TMP/batch") || fail "reference on bfloat16"
jq -en "($l16 - $l32) as \$d | (if \$d < 0 then -\$d else \$d end) <= 0.02 * $l32" >/dev/null || fail "bf16 output's loss $l16 vs float32's $l32"
ok "save.dtype: bf16/fp16 outputs are PyTorch's rounding of the float32 one; reference loss $l16 vs $l32"

acc_stop

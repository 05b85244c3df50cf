#!/bin/bash
# (h-nf4, issue 21) The planner's QLoRA rows for LLaMA-2-7B (config.json
# only, written here from the published values; the base quantized at load:
# "model.quantize": "nf4", LoRA r 16 all-linear) as
# POST /v1/plan answers them on one CUDA card of 24 GiB, bf16: each row with
# its breakdown, next to the LoRA row on the bf16 base.
#
#   bench/qlora_plan.sh BUILD_DIR [SEQ_LEN [llama31-8b|llama2-7b [lean]]]      (default 4096, LLaMA-2-7B)
# With llama31-8b: LLaMA-3.1-8B's config.json (published values) instead.
# With lean: the spec has "lean_activations": true and the rows recomputing
# from checkpoints in host memory are shown too (recompute "on+host", with
# their host bytes); bench/bench_long_ctx bisects the longest seq_len.
set -eu
BUILD=${1:?usage: bench/qlora_plan.sh BUILD_DIR [SEQ_LEN [llama31-8b]]}
T=${2:-4096}
WHICH=${3:-llama2-7b}
LEAN=${4:-}
EXTRA=
[ "$LEAN" = lean ] && EXTRA='"lean_activations": true,'
TMP=$(mktemp -d /tmp/accumd-qlora-plan.XXXXXX)
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
mkdir -p "$TMP/data/Llama-2-7b-hf"
cat >"$TMP/data/Llama-2-7b-hf/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
 "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "float16", "hidden_act": "silu"}
JSON
if [ "$WHICH" = llama31-8b ]; then
cat >"$TMP/data/Llama-2-7b-hf/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
 "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
 "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
 "torch_dtype": "bfloat16", "hidden_act": "silu"}
JSON
fi
"$BUILD/accumd" --set listen=127.0.0.1:0 --set state_dir="$TMP" --set devices=cpu >"$TMP/log" 2>&1 &
PID=$!
for _ in $(seq 100); do [ -s "$TMP/accumd.addr" ] && break; sleep 0.1; done
BASE="http://$(cat "$TMP/accumd.addr")"
for _ in $(seq 100); do curl -sf -o /dev/null "$BASE/healthz" && break; sleep 0.1; done
body="{\"model\": {\"from\": \"Llama-2-7b-hf\", \"seq_len\": $T, \"quantize\": \"nf4\"}, \"train_batch_size\": 16, $EXTRA
       \"lora\": {\"r\": 16, \"lora_alpha\": 32, \"target_modules\": \"all-linear\"},
       \"train_micro_batch_size_per_gpu\": \"auto\", \"precision\": \"bf16\",
       \"hardware\": {\"device_memory\": \"24GiB\", \"devices\": 1, \"kind\": \"cuda\"}}"
printf '| mode | recompute | m | weights | gradients | optimizer | activations | runtime | device bytes | host | fits 24 GiB |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|\n'
curl -s -X POST --data-binary "$body" "$BASE/v1/plan" >"$TMP/plan.json"
jq -e .rows "$TMP/plan.json" >/dev/null || { jq -c . "$TMP/plan.json" >&2; exit 1; }
jq -r '
    def g: . / 1073741824 * 100 | round / 100 | tostring + " GiB";
    .rows[] | select(.zero_stage == 0 and (.mode == "qlora" or .mode == "lora") and .micro_batch <= 2)
    | "| \(.mode) | \(if .recompute then (if .act_offload then "on+host" else "on" end) else "off" end) | \(.micro_batch) | \(.weights_bytes | g) | "
      + "\(.gradients_bytes | g) | \(.optimizer_bytes | g) | \(.activations_bytes | g) | "
      + "\(.runtime_bytes | g) | \(.device_bytes | g) (\(.device_bytes)) | \(.host_bytes | g) | \(.fits) |"'  "$TMP/plan.json"


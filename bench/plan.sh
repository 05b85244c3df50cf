#!/bin/bash
# The planner's table for LLaMA-2-7B (config.json only, written here from
# the published values) on CUDA cards of 24, 80 and 141 GiB, as POST
# /v1/plan answers it: per hardware and way to run it (full / LoRA / QLoRA,
# ZeRO, recompute off / on / on from host checkpoints, the optimizer on the
# card or offloaded), the largest micro batch that fits, its bytes per
# device and its host bytes per rank (and the job's: ranks x that), or the
# smallest row's bytes and why not. For bench/RESULTS.md and the README,
# next to published measurements.
#
#   [BATCH=16] [LEAN=false] [HW="24GiB 1;24GiB 4;80GiB 1;141GiB 1"] [HOST=256GiB] \
#   bench/plan.sh BUILD_DIR [SEQ_LEN ...]      (default seq_len: 4096 512)
#
# BATCH: train_batch_size; LEAN: the spec's lean_activations; HW: the
# hardware, "device_memory devices" pairs separated by ";"; HOST:
# hardware.host_memory (unset: the daemon's, this machine's).
set -eu
BUILD=${1:?usage: bench/plan.sh BUILD_DIR [SEQ_LEN ...]}
shift
SEQS=${*:-4096 512}
BATCH=${BATCH:-16}
LEAN=${LEAN:-false}
HW=${HW:-24GiB 1;24GiB 4;80GiB 1;141GiB 1}
HOSTKEY=${HOST:+, \"host_memory\": \"$HOST\"}
TMP=$(mktemp -d /tmp/accumd-plan-bench.XXXXXX)
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
mkdir -p "$TMP/data/Llama-2-7b-hf"
cat >"$TMP/data/Llama-2-7b-hf/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
 "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "float16", "hidden_act": "silu"}
EOF
"$BUILD/accumd" --set listen=127.0.0.1:0 --set state_dir="$TMP" --set devices=cpu >"$TMP/log" 2>&1 &
PID=$!
for _ in $(seq 100); do [ -s "$TMP/accumd.addr" ] && break; sleep 0.1; done
BASE="http://$(cat "$TMP/accumd.addr")"
for _ in $(seq 100); do curl -sf -o /dev/null "$BASE/healthz" && break; sleep 0.1; done

printf '| seq_len | hardware | mode | ZeRO | recompute | optimizer | largest fitting m (a) | per device | host per rank (job) | why not (smallest row) |\n'
printf '|---|---|---|---|---|---|---|---|---|---|\n'
IFS=';' read -r -a HWS <<<"$HW"
for T in $SEQS; do
    for hw in "${HWS[@]}"; do
        set -- $hw
        body="{\"model\": {\"from\": \"Llama-2-7b-hf\", \"seq_len\": $T}, \"train_batch_size\": $BATCH,
               \"train_micro_batch_size_per_gpu\": \"auto\", \"precision\": \"bf16\", \"lean_activations\": $LEAN,
               \"hardware\": {\"device_memory\": \"$1\", \"devices\": $2, \"kind\": \"cuda\"$HOSTKEY}}"
        curl -s -X POST --data-binary "$body" "$BASE/v1/plan" | jq -r --arg T "$T" --arg hw "$2 x $1" --argjson w "$2" '
            def gib: if . >= 10737418 then (. / 1073741824 * 100 | round / 100 | tostring + " GiB")
                     else (. / 1048576 * 10 | round / 10 | tostring + " MiB") end;
            . as $p | .groups[] | . as $g
            | ([$p.rows[] | select(.mode == $g.mode and .zero_stage == $g.zero_stage and .recompute == $g.recompute
                and .act_offload == $g.act_offload and .offload_optimizer == $g.offload_optimizer)]) as $rs
            | ($rs[0]) as $r0
            | (if .largest_fitting_micro_batch == null then $r0
               else [$rs[] | select(.micro_batch == $g.largest_fitting_micro_batch)][0] end) as $r
            | "| \($T) | \($hw) | \(.mode) | \(.zero_stage) | "
              + (if .recompute then (if .act_offload then "on+host" else "on" end) else "off" end) + " | "
              + (if .offload_optimizer then "host" else "device" end) + " | "
              + (if .largest_fitting_micro_batch == null then "none"
                 else "\(.largest_fitting_micro_batch) (\(.accum_steps))" end) + " | "
              + (if .device_bytes == null then "m=1: \($r0.device_bytes | gib)"
                 else "\(.device_bytes | gib)" end) + " | "
              + "\($r.host_bytes | gib) (\($r.host_bytes * $w | gib)) | "
              + (.why_not // "") + " |"'
    done
done

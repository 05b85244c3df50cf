#!/bin/bash
# Issue 25 defect 11: non-finite values never pass silently.
#   - a model.from directory with one NaN in a weight: the job fails at its
#     start, the error naming the tensor (the load-time check of every
#     safetensors file); an Inf likewise;
#   - finite weights whose forward overflows (lm_head all 3e38: the logits
#     are +-Inf, the loss NaN): the job fails at step 1 with the step and
#     the value, no step is recorded and no checkpoint is written (before:
#     "succeeded" with loss null at every step, checkpoints written);
#   - tie_word_embeddings true plus an lm_head.weight tensor: 400 naming
#     model.from, the tensor and the key (before: accepted, the tensor
#     silently ignored).
# Skips (77) when /usr/bin/python3 has no torch (make_tiny_llama.py).
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
SUP="$ACCUMD_SRC/tests/support"
. "$ACCUMD_SRC/tests/support/need.sh"
command -v jq >/dev/null || need_missing "no jq"
"$PY" -c 'import torch' 2>/dev/null || need_missing "no torch in $PY"

acc_data
for d in nan inf huge tiedhead; do
    "$PY" "$SUP/make_tiny_llama.py" "$STATE/data/$d" --variant big --seed 5 || fail "make_tiny_llama $d"
done
# edit DIR PYTHON: change the tensors of DIR's model.safetensors (P: name -> tensor)
edit() {
    "$PY" - "$STATE/data/$1" "$2" <<'EOF' || fail "editing $1"
import json, os, sys
sys.path.insert(0, os.environ["SUP"])
from llama_ref import st_read, st_write
d, code = sys.argv[1], sys.argv[2]
P = st_read(d + "/model.safetensors")
exec(code)
st_write(d + "/model.safetensors", P)
EOF
}
export SUP
edit nan 'P["model.layers.1.mlp.up_proj.weight"].view(-1)[5] = float("nan")'
edit inf 'P["model.layers.0.self_attn.k_proj.weight"].view(-1)[0] = float("-inf")'
edit huge 'P["lm_head.weight"].fill_(3e38)'
"$PY" - "$STATE/data/tiedhead/config.json" <<'EOF' || fail "tiedhead config"
import json, sys
c = json.load(open(sys.argv[1])); c["tie_word_embeddings"] = True
json.dump(c, open(sys.argv[1], "w"))
EOF
acc_start --set cpu_devices=1 --set cpu_device_memory=512M --set cpu_threads_per_device=1

spec() { printf '{"name":"%s","model":{"from":"%s","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"train_micro_batch_size_per_gpu":2,"max_steps":4,"checkpoint_interval":1}' "$1" "$1"; }
job() { acc_curl "$BASE/v1/jobs/$1"; }

# ---- NaN / Inf in the weights: failed at start, naming the tensor
for c in "nan model.layers.1.mlp.up_proj.weight NaN 5" "inf model.layers.0.self_attn.k_proj.weight Inf 0"; do
    set -- $c
    id=$(acc_submit "$(spec "$1")") || exit 1
    acc_wait_state "$id" failed 60
    msg=$(job "$id" | jq -r .error.message)
    for want in "$2" "$3" "element $4"; do
        echo "$msg" | grep -qF "$want" || fail "$1 weights: the error does not name '$want': $msg"
    done
    expect_eq "$1 weights: steps" "$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '.steps | length')" 0
    ok "$1 in $2: failed at start: $msg"
done

# ---- a NaN loss: failed at step 1 with the value, nothing after it
id=$(acc_submit "$(spec huge)") || exit 1
acc_wait_state "$id" failed 120
msg=$(job "$id" | jq -r .error.message)
echo "$msg" | grep -q 'step 1: the loss is -\?nan (not finite)' || fail "NaN loss: the error: $msg"
expect_eq "NaN loss: steps recorded" "$(acc_curl "$BASE/v1/jobs/$id/metrics" | jq '.steps | length')" 0
ck=$(find "$STATE/out/$id" -maxdepth 1 -name 'ckpt-*' 2>/dev/null | wc -l)
expect_eq "NaN loss: checkpoints written" "$ck" 0
ok "non-finite loss: $msg"

# ---- tied embeddings plus lm_head.weight: refused at submit
out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$(spec tiedhead)" "$BASE/v1/jobs")
expect_eq "tied + lm_head: status" "${out##*$'\n'}" 400
body=${out%$'\n'*}
expect_eq "tied + lm_head: field" "$(echo "$body" | jq -r .error.field)" model.from
msg=$(echo "$body" | jq -r .error.message)
for want in lm_head.weight tie_word_embeddings; do
    echo "$msg" | grep -qF "$want" || fail "tied + lm_head: the message does not name $want: $msg"
done
ok "tie_word_embeddings + lm_head.weight: 400: $msg"
acc_stop

#!/bin/bash
# Issue 16, defects 2 and 3 in the directories a spec names and the JSONL
# data files, against the real daemon (test_paths.sh covers the text /
# tokens data, init_from, resume_from):
#  - a FIFO as a chat data.train, or as a tokenizer's tokenizer.json, is a
#    prompt 400 naming the field, even for more submissions at once than
#    libuv's thread pool has threads (4); /healthz answers meanwhile and a
#    normal chat submission afterwards is accepted and trains;
#  - tokenizer.json / tokenizer_config.json in data.tokenizer, and
#    config.json / tokenizer.json in model.from, that are symlinks to
#    /etc/passwd are refused with a 400 naming the field and never a byte of
#    the file; the same for POST /v1/tokenize's tokenizer;
#  - a file that is not JSON is reported by line and column, not by its
#    bytes.
# The tokenizer (byte-level BPE, no merges: tests/support/byte_tokenizer.py)
# and the Hugging Face directory (a tiny LLaMA, zero weights) are written
# with the standard library.
. "$(dirname "$0")/lib.sh"

acc_data
D=$STATE/data
python3 "$ACCUMD_SRC/tests/support/byte_tokenizer.py" "$D/tok" || fail "writing the tokenizer"
python3 - "$D" <<'EOF' || fail "writing the test files"
import json, os, struct, sys
d = sys.argv[1]
with open(f"{d}/chat.jsonl", "w") as f:
    for i in range(16):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"question {i}?"},
                                         {"role": "assistant", "content": f"answer {i}."}]}) + "\n")
# a tiny LLaMA directory (header-checked at submit; weights zero)
V, C, I, L = 258, 32, 48, 1
conf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
        "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": 4, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64,
        "tie_word_embeddings": False, "torch_dtype": "float32"}
shapes = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C], "lm_head.weight": [V, C]}
for l in range(L):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                   p + "mlp.gate_proj.weight": [I, C], p + "mlp.up_proj.weight": [I, C],
                   p + "mlp.down_proj.weight": [C, I]})
    for x in "qkvo":
        shapes[p + f"self_attn.{x}_proj.weight"] = [C, C]
hdr, off = {}, 0
for name, shp in shapes.items():
    nb = 4
    for s in shp:
        nb *= s
    hdr[name] = {"dtype": "F32", "shape": shp, "data_offsets": [off, off + nb]}
    off += nb
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
os.makedirs(f"{d}/llama")
json.dump(conf, open(f"{d}/llama/config.json", "w"))
with open(f"{d}/llama/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + bytes(off))
EOF
mkfifo "$D/pipe.jsonl"
mkdir "$D/tokfifo" && cp "$D/tok/tokenizer_config.json" "$D/tokfifo/" && mkfifo "$D/tokfifo/tokenizer.json"
for f in tokenizer.json tokenizer_config.json; do
    cp -r "$D/tok" "$D/tok-$f" && ln -sf /etc/passwd "$D/tok-$f/$f"
done
for f in config.json tokenizer.json; do
    cp -r "$D/llama" "$D/llama-$f" && ln -sf /etc/passwd "$D/llama-$f/$f"
done
mkdir "$D/toknotjson" && cp /etc/passwd "$D/toknotjson/tokenizer.json"

acc_start --set cpu_devices=1 --set cpu_device_memory=256M --set cpu_threads_per_device=1

# POST with a deadline (a thread stuck on a FIFO must fail the test, not
# hang it): prints the body, then the status on the last line
post() { acc_curl --max-time 30 -w '\n%{http_code}' -X POST --data-binary "$2" "$BASE$1"; }
# expect_400 PATH BODY FIELD: 400 naming FIELD, nothing of /etc/passwd in it
expect_400() {
    local out code body
    out=$(post "$1" "$2")
    code=${out##*$'\n'}
    body=${out%$'\n'*}
    [ "$code" = 400 ] || fail "want 400 for $2, got HTTP '$code': $body"
    expect_eq "field of $2" "$(echo "$body" | jq -r .error.field)" "$3"
    # jansson's text quoted /etc/passwd's first word ("near 'root'")
    if echo "$body" | grep -q -e "root:" -e "'root'" -e "near '" -e "/bin/"; then
        fail "the error quotes the file: $body"
    fi
    echo "$body"
}
chat() { printf '{"model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":128,"vocab_size":258},"data":{"train":"%s","format":"chat","tokenizer":"%s","chat_template":"chatml"},"train_batch_size":4,"max_steps":2}' "$1" "$2"; }

# ---- defect 3: FIFOs, more at once than the thread pool has threads
pids=()
for i in 1 2 3 4 5; do
    expect_400 /v1/jobs "$(chat pipe.jsonl tok)" data.train >"$ACC_TMP/fifo$i.out" &
    pids+=($!)
done
expect_400 /v1/jobs "$(chat chat.jsonl tokfifo)" data.tokenizer >"$ACC_TMP/fifo6.out" &
pids+=($!)
for p in "${pids[@]}"; do wait "$p" || fail "a FIFO submission was not a 400: $(cat "$ACC_TMP"/fifo*.out)"; done
grep -q FIFO "$ACC_TMP/fifo1.out" || fail "the message does not say FIFO: $(cat "$ACC_TMP/fifo1.out")"
grep -q FIFO "$ACC_TMP/fifo6.out" || fail "the message does not say FIFO: $(cat "$ACC_TMP/fifo6.out")"
code=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "$BASE/healthz")
expect_eq "/healthz after the FIFO submissions" "$code" 200
id=$(acc_submit "$(chat chat.jsonl tok)") || exit 1
acc_wait_state "$id" succeeded 120
ok "a FIFO as a chat data.train or a tokenizer.json is a prompt 400; the API and the next submission are unaffected"

# ---- defect 2: symlinks out of the roots inside the directories
for f in tokenizer.json tokenizer_config.json; do
    body=$(expect_400 /v1/jobs "$(chat chat.jsonl "tok-$f")" data.tokenizer) || exit 1
    echo "$body" | grep -q "outside the allowed roots" || fail "tok-$f: not refused as outside the roots: $body"
    body=$(expect_400 /v1/tokenize "{\"tokenizer\":\"tok-$f\",\"text\":\"hi\"}" tokenizer) || exit 1
    echo "$body" | grep -q "outside the allowed roots" || fail "tokenize tok-$f: not refused as outside the roots: $body"
done
acc_curl --max-time 30 -X POST --data-binary '{"tokenizer":"tok","text":"hi"}' "$BASE/v1/tokenize" |
    jq -e '.ids[0:2] == [106, 107]' >/dev/null || fail "tokenize: the valid tokenizer does not work"
ok "tokenizer.json / tokenizer_config.json linked to /etc/passwd: 400 at submit and at /v1/tokenize, nothing quoted"

llama() { printf '{"model":{"from":"%s","seq_len":32},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":4,"max_steps":2,"checkpoint_interval":1}' "$1"; }
for f in config.json tokenizer.json; do
    body=$(expect_400 /v1/jobs "$(llama "llama-$f")" model.from) || exit 1
    echo "$body" | grep -q "outside the allowed roots" || fail "llama-$f: not refused as outside the roots: $body"
done
# the same directory without the link: accepted, and its checkpoint holds
# the tokenizer.json copied from it, not anything else
cp "$D/tok/tokenizer.json" "$D/llama/"
id=$(acc_submit "$(llama llama)") || exit 1
acc_wait_state "$id" succeeded 120
ck=$(ls -d "$STATE/out/$id"/ckpt-* | tail -n 1)
cmp -s "$ck/tokenizer.json" "$D/tok/tokenizer.json" || fail "the checkpoint's tokenizer.json is not the source's"
ok "config.json / tokenizer.json in model.from linked to /etc/passwd: 400 naming model.from, nothing quoted"

# ---- not JSON: line and column, not the bytes
body=$(expect_400 /v1/tokenize '{"tokenizer":"toknotjson","text":"hi"}' tokenizer) || exit 1
echo "$body" | grep -q "not valid JSON (line 1, column" || fail "not JSON: no line and column: $body"
ok "a tokenizer.json that is not JSON: its line and column, none of its bytes"

acc_stop

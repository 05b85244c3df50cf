#!/bin/bash
# generate_load.sh: GET /v1/jobs while 50 generate requests wait and run (a
# benchmark, not a test; issue 24's "none blocks the API").
#
#   bench/generate_load.sh [BUILD_DIR]    (default: build; use a release build)
#
# A tiny LLaMA-architecture model (tests/support/make_tiny_llama.py shape
# "big" with the byte tokenizer's 258 ids) under data_roots, one CPU device.
# p50/p99 of GET /v1/jobs with BUILD_DIR/bench/http_load (8 connections,
# DUR seconds) on the idle daemon, then again while 50 POST /v1/generate
# (streamed, 64 new tokens each) are queued on the one device and run one by
# one in worker processes; then idle once more (the noise between two idle
# runs). Prints a markdown table for bench/RESULTS.md. Needs torch in
# /usr/bin/python3 (the model's weights).
set -eu
BUILD=${1:-build}
ACCUMD=$BUILD/accumd
LOAD=$BUILD/bench/http_load
DUR=${DUR:-10}
SRC=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/accumd-bench-gen.XXXXXX)
pid=
clients=()
cleanup() {
    set +e
    [ ${#clients[@]} -gt 0 ] && kill "${clients[@]}" 2>/dev/null
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/data"
/usr/bin/python3 - "$tmp/data/tiny" <<PYEOF
import sys
sys.path.insert(0, "$SRC/tests/support")
import make_tiny_llama as m
c = m.make_config(["big"])
c.update(vocab_size=258, max_position_embeddings=256)
m.save(sys.argv[1], c, m.make_params(c, 3), 1, m.torch.float32)
PYEOF
/usr/bin/python3 "$SRC/tests/support/byte_tokenizer.py" "$tmp/tok"
cp "$tmp/tok/"* "$tmp/data/tiny/"
"$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$tmp" --set devices=cpu --set cpu_devices=1 \
    --set cpu_device_memory=1G --set cpu_threads_per_device=1 --set log_level=warn >"$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ -s "$tmp/accumd.addr" ] && break; sleep 0.1; done
addr=$(cat "$tmp/accumd.addr")
B=http://$addr
# a few jobs to list
for i in 1 2 3; do
    curl -s -X POST "$B/v1/jobs" --data-binary "{\"name\":\"j$i\",\"model\":{\"n_layer\":1,\"n_head\":2,\"n_embd\":32,\"seq_len\":32,\"vocab_size\":258},\"data\":{\"train\":\"tiny/tokenizer.json\",\"format\":\"text\"},\"train_batch_size\":2,\"max_steps\":1}" >/dev/null
done
sleep 3

load() { "$LOAD" "${addr%:*}" "${addr##*:}" 8 "$DUR" /v1/jobs; }
field() { echo "$1" | tr ' ' '\n' | grep -A1 "^$2\$" | tail -1; }

idle1=$(load)
for i in $(seq 1 50); do
    curl -sN -X POST "$B/v1/generate" --data-binary "{\"model\":\"tiny\",\"prompt\":\"request $i\",\"max_new_tokens\":64,\"stream\":true}" \
        -o "$tmp/g$i.txt" &
    clients+=($!)
done
sleep 1
busy=$(load)
queued=$(curl -s "$B/metrics" | sed -n 's/^accumd_generate_queued //p')
wait "${clients[@]}"
clients=()
answered=$(grep -l '^event: done' "$tmp"/g*.txt | wc -l)
idle2=$(load)

echo "| GET /v1/jobs (8 connections, ${DUR} s) | requests/s | p50 ms | p99 ms | max ms | errors |"
echo "|---|---|---|---|---|---|"
for row in "idle:$idle1" "under 50 generate requests ($queued still queued at its end):$busy" "idle again:$idle2"; do
    name=${row%%:*} r=${row#*:}
    echo "| $name | $(field "$r" requests/s) | $(field "$r" p50_ms) | $(field "$r" p99_ms) | $(field "$r" max_ms) | $(field "$r" errors) |"
done
echo
echo "generate requests answered: $answered of 50"

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
ROUNDS=${ROUNDS:-1}        # loaded runs, each between two idle ones
TOKENS=${TOKENS:-64}       # max_new_tokens of each generate request
read -r -a EXTRA <<<"${EXTRA_SET:-}" # more key=value settings for the daemon
sets=()
for kv in ${EXTRA[@]+"${EXTRA[@]}"}; do sets+=(--set "$kv"); done
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
    --set cpu_device_memory=1G --set cpu_threads_per_device=1 --set log_level=warn ${sets[@]+"${sets[@]}"} >"$tmp/log" 2>&1 &
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
# The loop thread's CPU ticks (utime + stime) and its involuntary context
# switches (preemptions: another task took its core), the daemon's other
# threads' ticks, and the reaped workers' ticks (cutime + cstime).
ticks() { awk '{print $14 + $15}' "/proc/$pid/task/$pid/stat"; }
preempt() { sed -n 's/^nonvoluntary_ctxt_switches:[[:space:]]*//p' "/proc/$pid/task/$pid/status"; }
children() { awk '{print $16 + $17}' "/proc/$pid/stat"; }
others() {
    local t s=0
    for t in /proc/$pid/task/*; do
        [ "${t##*/}" = "$pid" ] || s=$((s + $(awk '{print $14 + $15}' "$t/stat")))
    done
    echo $s
}
# measure NAME: one http_load run, with the counters' deltas.
rows=()
measure() {
    local t0 p0 o0 c0 r
    t0=$(ticks) p0=$(preempt) o0=$(others) c0=$(children)
    r=$(load)
    rows+=("$1|$r|$(( $(ticks) - t0 ))|$(( $(preempt) - p0 ))|$(( $(others) - o0 ))|$(( $(children) - c0 ))")
}
generate_all() {
    local i
    for i in $(seq 1 50); do
        curl -sN -X POST "$B/v1/generate" --data-binary \
            "{\"model\":\"tiny\",\"prompt\":\"request $i\",\"max_new_tokens\":${TOKENS},\"stream\":true}" \
            -o "$tmp/g$1-$i.txt" &
        clients+=($!)
    done
}

answered=0
measure idle
for round in $(seq 1 "$ROUNDS"); do
    generate_all "$round"
    sleep 1
    measure "under 50 generate requests"
    queued=$(curl -s "$B/metrics" | sed -n 's/^accumd_generate_queued //p')
    rows[${#rows[@]}-1]="${rows[${#rows[@]}-1]/under 50 generate requests/under 50 generate requests ($queued queued at its end)}"
    wait "${clients[@]}"
    clients=()
    answered=$((answered + $(grep -l '^event: done' "$tmp"/g"$round"-*.txt | wc -l)))
    measure idle
done

hz=$(getconf CLK_TCK)
echo "| GET /v1/jobs (8 connections, ${DUR} s) | requests/s | p50 ms | p99 ms | max ms | errors | loop thread CPU s | loop thread preempted | other daemon threads CPU s | workers CPU s |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
    IFS='|' read -r name r lt lp ot wc <<<"$row"
    echo "| $name | $(field "$r" requests/s) | $(field "$r" p50_ms) | $(field "$r" p99_ms) | $(field "$r" max_ms) |" \
        "$(field "$r" errors) | $(awk "BEGIN{printf \"%.2f\", $lt/$hz}") | $lp | $(awk "BEGIN{printf \"%.2f\", $ot/$hz}") |" \
        "$(awk "BEGIN{printf \"%.2f\", $wc/$hz}") |"
done
echo
echo "generate requests answered: $answered of $((50 * ROUNDS))"

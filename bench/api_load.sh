#!/bin/bash
# api_load.sh: the API under load while a job trains (a benchmark, not a test).
#
#   bench/api_load.sh [ACCUMD_BINARY]    (default: build/accumd; use a release build)
#
# 1. requests/s and p50/p99 latency of GET /v1/jobs and GET /v1/jobs/{id}
#    with wrk (Debian package `wrk`; without it bench/http_load.c), 50
#    connections, 2 threads, 10 s each,
#    while a job trains on one CPU device;
# 2. the training step time of the same job with 100 SSE watchers attached
#    versus none (goal: under 2% slower).
# Prints a markdown table for bench/RESULTS.md.
set -eu
ACCUMD=${1:-build/accumd}
DUR=${DUR:-10}
tmp=$(mktemp -d /tmp/accumd-bench.XXXXXX)
pid=
watchers=()
cleanup() {
    set +e
    [ ${#watchers[@]} -gt 0 ] && kill "${watchers[@]}" 2>/dev/null
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/data"
for i in 1 2 3 4; do cat /usr/share/common-licenses/GPL-3; done >"$tmp/data/corpus.txt"
"$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$tmp" --set devices=cpu --set cpu_devices=1 \
    --set cpu_device_memory=1G --set log_level=warn ${THREADS:+--set cpu_threads_per_device=$THREADS} >"$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ -s "$tmp/accumd.addr" ] && break; sleep 0.1; done
B=http://$(cat "$tmp/accumd.addr")

job() { # NAME STEPS
    printf '{"name":"%s","model":{"n_layer":2,"n_head":4,"n_embd":128,"seq_len":128,"vocab_size":256},"data":{"train":"corpus.txt"},"train_batch_size":16,"train_micro_batch_size_per_gpu":4,"max_steps":%d}' "$1" "$2"
}
submit() { curl -s -X POST --data-binary "$(job "$1" "$2")" "$B/v1/jobs" | jq -r .id; }
wait_done() { while [ "$(curl -s "$B/v1/jobs/$1" | jq -r .state)" = running ] ||
                    [ "$(curl -s "$B/v1/jobs/$1" | jq -r .state)" = queued ]; do sleep 0.2; done; }
# seconds per step: B * T tokens over the run's median tokens/s (the
# median keeps the first, warming-up step and a noisy neighbour out)
step_time() {
    curl -s "$B/v1/jobs/$1/metrics" |
        jq '(.steps | map(.tokens_per_s) | sort | .[length / 2 | floor]) as $t | 16 * 128 / $t'
}

busy=$(submit busy 1000000)
sleep 1
HTTP_LOAD=${HTTP_LOAD:-$(dirname "$ACCUMD")/bench/http_load}
wrk_row() { # PATH
    if ! command -v wrk >/dev/null; then # bench/http_load.c: the same 50 keep-alive connections
        set -- $("$HTTP_LOAD" 127.0.0.1 "${B##*:}" 50 "$DUR" "$1") "$1"
        printf '| GET %s | %s | %s ms | %s ms |\n' "${13}" "$2" "$4" "$6"
        return
    fi
    wrk -t2 -c50 -d"${DUR}s" --latency "$B$1" >"$tmp/wrk" 2>&1
    rps=$(awk '/^Requests\/sec/ {print $2}' "$tmp/wrk")
    p50=$(awk '$1 == "50%" {print $2}' "$tmp/wrk")
    p99=$(awk '$1 == "99%" {print $2}' "$tmp/wrk")
    printf '| GET %s | %s | %s | %s |\n' "$1" "$rps" "$p50" "$p99"
}
echo "| request (50 connections, job training) | requests/s | p50 | p99 |"
echo "|---|---|---|---|"
wrk_row /v1/jobs
wrk_row "/v1/jobs/$busy"
curl -s -o /dev/null -X DELETE "$B/v1/jobs/$busy"
wait_done "$busy"

steps=${STEPS:-60}
a=$(submit quiet "$steps")
wait_done "$a"
b=$(submit watched "$steps")
for _ in $(seq 1 100); do
    curl -sN "$B/v1/jobs/$b/events" >/dev/null &
    watchers+=($!)
done
wait_done "$b"
ta=$(step_time "$a")
tb=$(step_time "$b")
echo
echo "| run ($steps steps, B=16, 2x128 GPT-2, 1 CPU device) | seconds/step (from tokens/s) |"
echo "|---|---|"
echo "| no watchers | $ta |"
echo "| 100 SSE watchers | $tb |"
awk -v a="$ta" -v b="$tb" 'BEGIN { printf "\nslowdown with 100 watchers: %.2f%%\n", (b / a - 1) * 100 }'

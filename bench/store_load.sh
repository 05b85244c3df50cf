#!/bin/bash
# store_load.sh: the API and a restart with 10,000 finished jobs in the job
# store (issue 16, "The API under load"; a benchmark, not a test).
#
#   bench/store_load.sh [ACCUMD] [HTTP_LOAD]
#       (defaults: build/dev/accumd, build/dev/bench/http_load)
#
# 1. one tiny job is trained for real, then the database is grown to N
#    (default 10,000) finished jobs by copying its rows (jobs, events,
#    metrics) in SQL with the sqlite3 CLI: no training for the copies;
# 2. restart time: from exec to the first /healthz answer, 3 times;
# 3. without and with one job training, p50/p99 at 50 keep-alive connections
#    for GET /v1/jobs?limit=50, a deep page (?after=), a state filter and
#    GET /v1/jobs/{id} over 50 different ids (bench/http_load.c; loopback
#    only, DUR seconds), and the loop thread's CPU time per request (what a
#    request costs, apart from how busy the machine is).
# Prints markdown for bench/RESULTS.md. KEEP=1 keeps the state directory.
set -eu
ACCUMD=${1:-build/dev/accumd}
LOAD=${2:-build/dev/bench/http_load}
N=${N:-10000}
DUR=${DUR:-10}
tmp=$(mktemp -d /tmp/accumd-store-bench.XXXXXX)
pid=
cleanup() {
    set +e
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    if [ -n "${KEEP:-}" ]; then echo "state kept in $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

start() {
    rm -f "$tmp/accumd.addr"
    local t0 i
    t0=$(date +%s.%N)
    "$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$tmp" --set devices=cpu --set cpu_devices=1 \
        --set cpu_device_memory=256M --set log_level=warn >>"$tmp/log" 2>&1 &
    pid=$!
    for i in $(seq 1 3000); do
        if [ -s "$tmp/accumd.addr" ] && curl -sf -o /dev/null "http://$(cat "$tmp/accumd.addr")/healthz"; then
            break
        fi
        sleep 0.01
    done
    B=http://$(cat "$tmp/accumd.addr")
    START_S=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
    # CPU seconds the daemon used to get there (utime + stime, all threads)
    START_CPU=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$pid/stat")
}
stop() {
    kill -TERM "$pid"
    wait "$pid"
    pid=
}

mkdir -p "$tmp/data"
cp /usr/share/common-licenses/GPL-3 "$tmp/data/gpl.txt"
job() { printf '{"name":"%s","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":2,"max_steps":%d}' "$1" "$2"; }
start
id=$(curl -s -X POST --data-binary "$(job template 20)" "$B/v1/jobs" | jq -r .id)
while [ "$(curl -s "$B/v1/jobs/$id" | jq -r .state)" != succeeded ]; do sleep 0.1; done
stop

sqlite3 "$tmp/accumd.db" <<SQL
BEGIN;
CREATE TEMP TABLE n(i INTEGER PRIMARY KEY);
WITH RECURSIVE c(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM c WHERE i < $N) INSERT INTO n SELECT i FROM c;
INSERT INTO jobs(id, submit_seq, uid, owner, state, submitted_at, spec, status, last_seq)
  SELECT printf('j%06d', i), i, NULL, NULL, state, submitted_at + i, spec,
         replace(status, '"$id"', printf('"j%06d"', i)), last_seq FROM n, jobs WHERE jobs.id = '$id';
INSERT INTO events(job, seq, type, time, json)
  SELECT printf('j%06d', i), seq, type, time, replace(json, '"$id"', printf('"j%06d"', i))
  FROM n, events WHERE job = '$id';
INSERT INTO metrics SELECT printf('j%06d', i), step, time, loss, lr, grad_norm, tokens_per_s, micro_batch,
  accum_steps, mem_peak FROM n, metrics WHERE job = '$id';
UPDATE meta SET value = $N + 1 WHERE key = 'next_submit';
COMMIT;
SQL
jobs=$(sqlite3 "$tmp/accumd.db" "SELECT count(*) FROM jobs")
events=$(sqlite3 "$tmp/accumd.db" "SELECT count(*) FROM events")
size=$(du -k "$tmp/accumd.db" | cut -f1)

echo "| restart with $jobs finished jobs ($events events, ${size} KiB database) | wall seconds to the first /healthz answer | daemon CPU seconds by then | load average |"
echo "|---|---|---|---|"
for run in 1 2 3; do
    start
    echo "| run $run | $START_S | $START_CPU | $(cut -d' ' -f1 /proc/loadavg) |"
    [ $run = 3 ] || stop
done
[ "$(curl -s "$B/v1/jobs?limit=1000" | jq '.jobs | length')" = 1000 ] || { echo "list is short" >&2; exit 1; }

host=${B#http://}
# CPU seconds of the daemon's loop thread (the main thread: every request runs there)
loop_cpu() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$pid/task/$pid/stat"; }
row() { # LABEL PATH...
    local label=$1 c0 c1
    shift
    c0=$(loop_cpu)
    set -- $("$LOAD" "${host%:*}" "${host##*:}" 50 "$DUR" "$@")
    c1=$(loop_cpu)
    printf '| %s | %s | %s ms | %s ms | %s ms | %s | %s |\n' "$label" "$2" "$4" "$6" "$8" "${12}" \
        "$(awk -v a="$c0" -v b="$c1" -v n="${10}" 'BEGIN { printf "%.0f", (b - a) / n * 1e6 }')"
}
ids=()
for i in $(seq 1 50); do ids+=("/v1/jobs/$(printf 'j%06d' $((i * 197 % N + 1)))"); done
table() { # WHAT
    echo
    echo "| request ($jobs jobs, $1, 50 connections, ${DUR} s, load average $(cut -d' ' -f1 /proc/loadavg)) | requests/s | p50 | p99 | max | errors | loop-thread CPU µs / request |"
    echo "|---|---|---|---|---|---|---|"
    row "GET /v1/jobs?limit=50" "/v1/jobs?limit=50"
    row "GET /v1/jobs?limit=50&after=j005000" "/v1/jobs?limit=50&after=j005000"
    row "GET /v1/jobs?state=succeeded&limit=50" "/v1/jobs?state=succeeded&limit=50"
    row "GET /v1/jobs/{id} (50 ids)" "${ids[@]}"
}
table "no job training"
busy=$(curl -s -X POST --data-binary "$(job busy 100000000)" "$B/v1/jobs" | jq -r .id)
sleep 1
table "one job training"
curl -s -o /dev/null -X DELETE "$B/v1/jobs/$busy"

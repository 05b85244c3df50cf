#!/bin/bash
# sched_users.sh: what users cost the loop thread (a benchmark, not a test).
#
#   bench/sched_users.sh [ACCUMD] [ACCUMCTL]   (default: build/accumd, build/accumctl)
#
# One CPU device held by a long job; then Q submissions (default 1000),
# round robin over U users (default 20; U=1: no users file, every job the
# admin's), each queued behind it. A dry run plans the whole queue with
# the new job in it (round robin by user, per-user limits: what every
# submission and every job end does too, plus their fsyncs), so its
# latency grows with the queue; printed: p50 / p95 of 200 dry runs with an
# empty queue and with Q queued (curl's time_total, ms), as a markdown row
# for bench/RESULTS.md.
set -eu
ACCUMD=${1:-build/accumd}
ACCUMCTL=${2:-build/accumctl}
Q=${Q:-1000}
U=${U:-20}
tmp=$(mktemp -d /tmp/accumd-bench.XXXXXX)
pid=
cleanup() {
    set +e
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/data"
cp /usr/share/common-licenses/GPL-3 "$tmp/data/corpus.txt"
tokens=()
users=()
if [ "$U" -gt 1 ]; then
    for i in $(seq 1 "$U"); do
        tokens+=("$("$ACCUMCTL" user add "user$i" --users-file "$tmp/users" 2>/dev/null | head -1)")
    done
    users=(--set users_file="$tmp/users")
fi
"$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$tmp" --set devices=cpu --set cpu_devices=1 \
    --set log_level=warn "${users[@]}" >"$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ -s "$tmp/accumd.addr" ] && break; sleep 0.1; done
B=http://$(cat "$tmp/accumd.addr")
job() { printf '{"name":"%s","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"corpus.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":2,"max_steps":%d}' "$1" "$2"; }
admin=$(cat "$tmp/token")
curl -s -o /dev/null -H "Authorization: Bearer $admin" -X POST --data-binary "$(job blocker 1000000)" "$B/v1/jobs"
job q 10 >"$tmp/spec"
tok() { if [ "$U" -gt 1 ]; then echo "${tokens[$(($1 % U))]}"; else echo "$admin"; fi; }
dry() { # 200 dry runs, their latencies
    for i in $(seq 0 199); do
        curl -s -o /dev/null -w '%{time_total}\n' -H "Authorization: Bearer $(tok "$i")" -X POST \
            --data-binary @"$tmp/spec" "$B/v1/jobs?dry_run=1"
    done
}
dry >"$tmp/lat0"
for i in $(seq 0 $((Q - 1))); do
    curl -s -o /dev/null -H "Authorization: Bearer $(tok "$i")" -X POST --data-binary @"$tmp/spec" "$B/v1/jobs"
done
queued=$(curl -s -H "Authorization: Bearer $admin" "$B/v1/jobs?state=queued" | jq '.jobs | length')
dry >"$tmp/latq"
pct() { sort -n | awk -v p="$1" '{ v[NR] = $1 } END { i = int(NR * p / 100); if (i < 1) i = 1; printf "%.2f", v[i] * 1000 }'; }
echo "| $U | $queued | $(pct 50 <"$tmp/lat0") / $(pct 95 <"$tmp/lat0") | $(pct 50 <"$tmp/latq") / $(pct 95 <"$tmp/latq") |"

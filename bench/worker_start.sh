#!/bin/bash
# Worker start-up overhead per job: the same 1-step tiny job run N times one
# after another, each in a worker process (worker_processes = true) and as
# rank threads inside the daemon (false). The figure is the job's
# started_at -> finished_at (the daemon's clock: placed -> final state
# stored), median over N; the difference of the medians is what a worker
# process costs a job (spawn, exec, the start message, the exit and reap).
#
#   bench/worker_start.sh ACCUMD_BINARY [N=30]
set -eu
BIN=${1:?usage: bench/worker_start.sh ACCUMD_BINARY [N]}
N=${2:-30}
TMP=$(mktemp -d)
trap 'kill $PID 2>/dev/null; rm -rf "$TMP"' EXIT
JOB='{"name":"one","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":8,"max_steps":1}'
for mode in true false; do
    S=$TMP/$mode
    mkdir -p "$S/data"
    cp /usr/share/common-licenses/GPL-3 "$S/data/gpl.txt"
    "$BIN" --set listen=127.0.0.1:0 --set state_dir="$S" --set devices=cpu --set cpu_threads_per_device=1 \
        --set worker_processes=$mode >"$S/log" 2>&1 &
    PID=$!
    for i in $(seq 100); do [ -s "$S/accumd.addr" ] && break; sleep 0.1; done
    B=http://$(cat "$S/accumd.addr")
    for i in $(seq "$N"); do
        id=$(curl -s -X POST --data-binary "$JOB" "$B/v1/jobs" | jq -r .id)
        while [ "$(curl -s "$B/v1/jobs/$id" | jq -r .state)" != succeeded ]; do sleep 0.02; done
        curl -s "$B/v1/jobs/$id" | jq -r '[.started_at, .finished_at] | @tsv' >>"$TMP/$mode.tsv"
    done
    kill "$PID"
    wait "$PID" || true
done
python3 - "$TMP/true.tsv" "$TMP/false.tsv" <<'PY'
import sys, statistics
from datetime import datetime
def ms(path):
    out = []
    for line in open(path):
        a, b = (datetime.strptime(x.strip(), "%Y-%m-%dT%H:%M:%S.%fZ") for x in line.split("\t"))
        out.append((b - a).total_seconds() * 1000)
    return out
w, t = ms(sys.argv[1]), ms(sys.argv[2])
mw, mt = statistics.median(w), statistics.median(t)
print(f"jobs per mode: {len(w)}")
print(f"worker process: median {mw:.1f} ms  (min {min(w):.1f}, max {max(w):.1f})")
print(f"rank threads:   median {mt:.1f} ms  (min {min(t):.1f}, max {max(t):.1f})")
print(f"worker start-up overhead per job: {mw - mt:.1f} ms (difference of medians)")
PY

#!/bin/bash
# The daemon's memory per queued job (issue 25, defect 6): one CPU device
# held by a long job, then N small jobs queued behind it over HTTP (one
# keep-alive connection); VmRSS of accumd before and after, and per job.
#   ACCUMD=build/rel/accumd bench/queued_rss.sh [N=2000] [--set key=value ...]
# (pass --set user_max_queued=0 --set max_queued_jobs=0 to builds that cap
# the queue). Prints one line: N, RSS before / after (KiB), KiB per job.
set -eu
: "${ACCUMD:?ACCUMD must point at the accumd binary}"
N=${1:-2000}
shift || true
T=$(mktemp -d /tmp/accumd-rss.XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$T"' EXIT
mkdir -p "$T/state/data" && cp /usr/share/common-licenses/GPL-3 "$T/state/data/gpl.txt"
"$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$T/state" --set devices=cpu --set cpu_devices=1 "$@" \
    >"$T/log" 2>&1 &
pid=$!
for i in $(seq 1 200); do [ -s "$T/state/accumd.addr" ] && break; sleep 0.1; done
python3 - "$(cat "$T/state/accumd.addr")" "$N" "$pid" <<'PY'
import http.client, json, sys, time
addr, n, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
host, port = addr.rsplit(":", 1)
def rss():
    for line in open("/proc/%s/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
def spec(name, steps):
    return json.dumps({"name": name, "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "seq_len": 32,
                       "vocab_size": 256}, "data": {"train": "gpl.txt"}, "train_batch_size": 8,
                       "train_micro_batch_size_per_gpu": 2, "max_steps": steps})
c = http.client.HTTPConnection(host, int(port), timeout=60)
def submit(body):
    c.request("POST", "/v1/jobs", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 201:
        sys.exit("submit: HTTP %d: %s" % (r.status, data[:300]))
submit(spec("long", 10000000))
time.sleep(3)
before = rss()
t0 = time.monotonic()
for i in range(n):
    submit(spec("q%d" % i, 5))
dt = time.monotonic() - t0
time.sleep(1)
after = rss()
print("queued %d jobs in %.1f s: VmRSS %d KiB before, %d KiB after: %.1f KiB per queued job"
      % (n, dt, before, after, (after - before) / n))
PY

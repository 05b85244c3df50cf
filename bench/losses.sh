#!/usr/bin/env bash
# losses.sh: the per-step losses of fixed small GPT-2 runs through the real
# daemon, printed with every bit (jansson writes doubles with 17 digits), so
# two builds can be compared with diff: a refactoring that moves nothing
# gives an empty diff.
#
#   bench/losses.sh BUILD_DIR > losses.txt      (BUILD_DIR holds accumd)
#
# Runs, each for STEPS optimizer steps (default 30) on the demo corpus:
#   demo      etc/demo-job.json as it is (1 device, m 4, a 4, cosine lr, clip)
#   split     the same on 2 devices, m 2, activation recomputation, bf16 (the
#             bucketed all-reduce, the recompute path and the bf16 products)
# Each line: "<run> <step> <loss>" (the API's 10 significant digits), then
# "<run> sha256 <file> <hash>" of the final checkpoint's model.safetensors
# (the weights) and state.safetensors (AdamW moments, step, split): equal
# hashes mean bit-identical training. Not a test and not timed.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: bench/losses.sh BUILD_DIR}
ACCUMD=$(cd "$build" && pwd)/accumd
[ -x "$ACCUMD" ] || { echo "losses.sh: no accumd in $build" >&2; exit 1; }
STEPS=${STEPS:-30}
PY=/usr/bin/python3

tmp=$(mktemp -d "${TMPDIR:-/tmp}/accumd-losses.XXXXXX")
pid=
cleanup() {
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/state/data"
lic=/usr/share/common-licenses
find "$lic" -maxdepth 1 -type f ! -name GPL-3 -print0 | sort -z | xargs -0 cat >"$tmp/state/data/demo-train.txt"
cat "$lic/GPL-3" >"$tmp/state/data/demo-val.txt"

"$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$tmp/state" --set devices=cpu \
    --set cpu_devices=2 --set cpu_threads_per_device=1 --set cpu_device_memory=2G \
    --set data_roots="$tmp/state/data" >"$tmp/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
    [ -s "$tmp/state/accumd.addr" ] && curl -sf -o /dev/null "http://$(cat "$tmp/state/accumd.addr")/healthz" && break
    sleep 0.1
done
base="http://$(cat "$tmp/state/accumd.addr")"

# spec RUN: the demo job with this run's changes
spec() {
    "$PY" - "$top/etc/demo-job.json" "$1" "$STEPS" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
run, steps = sys.argv[2], int(sys.argv[3])
s.update(max_steps=steps, eval_interval=0, checkpoint_interval=0)
if run == "split":
    s.update(devices=2, train_micro_batch_size_per_gpu=2, gradient_accumulation_steps="auto",
             activation_checkpointing=True, precision="bf16")
print(json.dumps(s))
PY
}

for run in demo split; do
    id=$(spec "$run" | curl -sf -X POST --data-binary @- "$base/v1/jobs" |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["id"])')
    curl -sN "$base/v1/jobs/$id/events?format=ndjson" | "$PY" -c '
import json, sys
run = sys.argv[1]
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    ev = json.loads(line)
    if ev.get("type") == "step":
        print(run, ev["step"], repr(ev["loss"]))
    elif ev.get("type") == "checkpoint":
        import hashlib, os
        for f in ("model.safetensors", "state.safetensors"):
            h = hashlib.sha256(open(os.path.join(ev["path"], f), "rb").read()).hexdigest()
            print(run, "sha256", f, h)
    elif ev.get("type") == "done":
        if ev.get("state") != "succeeded":
            print(run, "ended", ev.get("state"), ev.get("message"))
        break
' "$run"
done

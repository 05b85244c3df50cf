#!/bin/bash
# /healthz latency while a submission with a large token shard is validated
# (issue 16, defect 3: the shard scan used to run on the loop thread).
#   bench/submit_stall.sh ACCUMD_BINARY [SHARD_MIB=256]
# Prints the largest and median /healthz time (ms) over the polls taken while
# the POST was in flight, and the POST's own time. A figure, not a test.
set -u
bin=${1:?accumd binary}
mib=${2:-256}
tmp=$(mktemp -d /tmp/accumd-stall.XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir -p "$tmp/state/data"
/usr/bin/python3 - "$tmp/state/data/big.bin" "$mib" <<'PY'
import sys, numpy as np
n = int(sys.argv[2]) * (1 << 20) // 2
h = np.zeros(256, np.int32); h[0], h[1], h[2] = 20240520, 1, n
with open(sys.argv[1], "wb") as f:
    f.write(h.tobytes()); f.write((np.arange(n, dtype=np.uint32) % 256).astype(np.uint16).tobytes())
PY
"$bin" --set listen=127.0.0.1:0 --set state_dir="$tmp/state" --set devices=cpu --set cpu_device_memory=256M \
    >"$tmp/log" 2>&1 &
pid=$!
for i in $(seq 1 100); do [ -s "$tmp/state/accumd.addr" ] && break; sleep 0.1; done
base=http://$(cat "$tmp/state/accumd.addr")
cat /dev/null >"$tmp/t"
spec='{"model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"big.bin","format":"tokens"},"train_batch_size":8,"max_steps":1}'
curl -s -o /dev/null -w '%{time_total}\n' -X POST --data-binary "$spec" "$base/v1/jobs?dry_run=1" >"$tmp/post" &
post=$!
while kill -0 $post 2>/dev/null; do
    curl -s -o /dev/null -w '%{time_total}\n' "$base/healthz" >>"$tmp/t"
done
wait $post
sort -n "$tmp/t" | awk -v post="$(cat "$tmp/post")" '{ a[NR] = $1 } END {
    printf "polls %d, healthz max %.1f ms, median %.1f ms; POST (dry run) %.0f ms\n", NR, a[NR] * 1000, a[int((NR + 1) / 2)] * 1000, post * 1000 }'

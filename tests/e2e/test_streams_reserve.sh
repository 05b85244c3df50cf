#!/bin/bash
# Issue 25, defect 5: event streams cannot lock the API. 650 idle
# streams of one running job (GET /v1/jobs/ID/events?since=999999999 from
# loopback, clients that never read) are held open while /healthz, a job
# listing, a submit and a DELETE are sent: each is answered (no refusal, no
# loss: the DELETE's cancel shows on the job). Streams past user_max_streams
# (default 64) are refused at once with a JSON 429 naming the limit, and
# their connection is closed; those within it stay open. The total
# (max_streams) is a 503, closed too.
. "$(dirname "$0")/lib.sh"

acc_data
acc_start
port=${BASE##*:}
long=$(acc_submit "$(tiny_job long 100000)")
acc_wait_state "$long" running

# hold.py PORT JOB N READY STOP: open N streams, never read them; record
# how each was answered, then hold them until STOP exists
cat >"$ACC_TMP/hold.py" <<'PY'
import json, os, socket, sys, time
port, job, n, ready, stop = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
status = (sys.argv[6] if len(sys.argv) > 6 else "429").encode()
limit = (sys.argv[7] if len(sys.argv) > 7 else "user_max_streams").encode()
req = ("GET /v1/jobs/%s/events?since=999999999 HTTP/1.1\r\nHost: x\r\n\r\n" % job).encode()
socks, refused_connect = [], 0
for i in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(req)
        socks.append(s)
    except OSError:
        refused_connect += 1
# every connection's answer (its first bytes) is in, or 60 s have passed
deadline = time.monotonic() + 60
for s in socks:
    s.setblocking(False)
while time.monotonic() < deadline:
    waiting = 0
    for s in socks:
        try:
            waiting += not s.recv(16, socket.MSG_PEEK)
        except BlockingIOError:
            waiting += 1
        except OSError:
            pass
    if waiting == 0:
        break
    time.sleep(0.2)
stats = {"opened": len(socks), "refused_connect": refused_connect, "refused": 0, "s200": 0, "closed": 0,
         "other": 0, "limit_named": 0}
held = []
for s in socks:
    s.setblocking(False)
    try:
        head = s.recv(512, socket.MSG_PEEK)
    except BlockingIOError:
        head = b""
    except OSError:      # reset: refused by a connection limit
        stats["other"] += 1
        continue
    if head.startswith(b"HTTP/1.1 " + status):
        stats["refused"] += 1
        data = b""
        s.settimeout(2)
        try:
            while True:
                d = s.recv(4096)
                if not d:
                    stats["closed"] += 1
                    break
                data += d
        except OSError:
            pass
        if limit in data:
            stats["limit_named"] += 1
        s.close()
    elif head.startswith(b"HTTP/1.1 200"):
        stats["s200"] += 1
        held.append(s)   # never read: an idle watcher
    else:
        stats["other"] += 1
        held.append(s)
json.dump(stats, open(ready + ".tmp", "w"))
os.rename(ready + ".tmp", ready)
deadline = time.monotonic() + 180  # never outlive a failed test
while not os.path.exists(stop) and os.path.isdir(os.path.dirname(stop)) and time.monotonic() < deadline:
    time.sleep(0.2)
PY
python3 "$ACC_TMP/hold.py" "$port" "$long" 650 "$ACC_TMP/ready" "$ACC_TMP/stop" &
holder=$!
for i in $(seq 1 600); do [ -f "$ACC_TMP/ready" ] && break; sleep 0.1; done
[ -f "$ACC_TMP/ready" ] || { touch "$ACC_TMP/stop"; fail "the 650 streams were not opened in 60 s"; }
stats=$(cat "$ACC_TMP/ready")
echo "streams: $stats"

# with the 650 still connected: everything else is served
code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' "$BASE/healthz")
expect_eq "/healthz during 650 idle streams" "$code" 200
code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' "$BASE/v1/jobs")
expect_eq "GET /v1/jobs during 650 idle streams" "$code" 200
code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' "$BASE/v1/devices")
expect_eq "GET /v1/devices during 650 idle streams" "$code" 200
out=$(curl -s -m 20 -w '\n%{http_code}' -X POST --data-binary "$(tiny_job queued 5)" "$BASE/v1/jobs")
expect_eq "a submit during 650 idle streams" "${out##*$'\n'}" 201
out=$(curl -s -m 5 -w '\n%{http_code}' -X DELETE "$BASE/v1/jobs/$long")
expect_eq "DELETE during 650 idle streams" "${out##*$'\n'}" 202
touch "$ACC_TMP/stop"
wait "$holder"

# the cancel was not lost, and the streams were refused past the limit
acc_wait_state "$long" cancelled 60
echo "$stats" | jq -e '.refused_connect == 0 and .other == 0' >/dev/null ||
    fail "streams refused at connect or answered otherwise: $stats"
echo "$stats" | jq -e '.s200 == 64 and .refused == 650 - 64' >/dev/null ||
    fail "want 64 streams held and 586 refused with 429 (user_max_streams 64): $stats"
echo "$stats" | jq -e '.closed == .refused and .limit_named == .refused' >/dev/null ||
    fail "the 429s must name user_max_streams and close their connection: $stats"
ok "650 idle streams: 64 held, 586 refused (429, closed); /healthz, lists, a submit and a DELETE served meanwhile"
acc_stop

# the total: max_streams 20 below user_max_streams 100: 30 streams, 20 held,
# 10 refused with a 503 naming max_streams
acc_start --set max_streams=20 --set user_max_streams=100
port=${BASE##*:}
long2=$(acc_submit "$(tiny_job long2 100000)")
acc_wait_state "$long2" running
rm -f "$ACC_TMP/ready" "$ACC_TMP/stop"
python3 "$ACC_TMP/hold.py" "$port" "$long2" 30 "$ACC_TMP/ready" "$ACC_TMP/stop" 503 max_streams &
holder=$!
for i in $(seq 1 300); do [ -f "$ACC_TMP/ready" ] && break; sleep 0.1; done
touch "$ACC_TMP/stop"
wait "$holder"
stats=$(cat "$ACC_TMP/ready" 2>/dev/null) || fail "the 30 streams were not opened"
echo "$stats" | jq -e '.s200 == 20 and .refused == 10 and .closed == 10 and .limit_named == 10 and .other == 0' \
    >/dev/null || fail "want 20 streams held and 10 refused with 503 naming max_streams: $stats"
out=$("$ACCUMD" --set max_streams=400 --check-config 2>&1) && fail "max_streams 400 (over half of 600) accepted"
grep -q 'max_streams' <<<"$out" || fail "max_streams=400: $out"
ok "max_streams: 20 held, 10 refused (503, closed); a limit without a reserve is refused"
acc_curl -o /dev/null -X DELETE "$BASE/v1/jobs/$long2"
acc_stop

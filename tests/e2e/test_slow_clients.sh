#!/bin/bash
# Issue 16, defect 11: half-open connections that trickle their request
# (a header line a second, or a body byte a second) are held to
# header_timeout / request_timeout as a whole, and never take every slot:
# while 150 of them (more than max_connections_per_ip) keep coming back for
# 10 s, /healthz and a job listing are still answered (50 slots are kept
# for clients that have sent their request). Loopback only,
# bounded: the trickler stops itself after 10 s.
. "$(dirname "$0")/lib.sh"

acc_start --set max_connections_per_ip=100 --set max_pending_connections=50 --set header_timeout=3 \
    --set request_timeout=5
port=${BASE##*:}

# trickle.py PORT N_HEADER N_BODY SECONDS COMEBACK(0/1): slow clients, each
# sending a header line (or a body byte) a second
cat >"$ACC_TMP/trickle.py" <<'PY'
import selectors, socket, sys, time
port, n_hdr, n_body, run_s, again = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
sel = selectors.DefaultSelector()
start = time.monotonic()
opened = closed = 0
first_round = {}      # socket -> opened at, for the sockets of the first round
first_closed_age = []

def open_one(kind):
    global opened
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return
    s.setblocking(False)
    try:
        if kind == "hdr":
            s.send(b"GET /healthz HTTP/1.1\r\nHost: slow\r\n")
        else:
            s.send(b"POST /v1/jobs HTTP/1.1\r\nHost: slow\r\nContent-Length: 100000\r\n\r\n{")
    except OSError:
        s.close()
        return
    opened += 1
    sel.register(s, selectors.EVENT_READ, (kind, time.monotonic()))
    return s

for i in range(n_hdr):
    s = open_one("hdr")
    if s is not None:
        first_round[s] = time.monotonic()
for i in range(n_body):
    s = open_one("body")
    if s is not None:
        first_round[s] = time.monotonic()
last_tick = time.monotonic()
comeback = []
while time.monotonic() - start < run_s:
    now = time.monotonic()
    for t, kind in [c for c in comeback if c[0] <= now]:
        comeback.remove((t, kind))
        open_one(kind)
    for key, _ in sel.select(timeout=0.2):
        s = key.fileobj
        try:
            d = s.recv(4096)
        except OSError:
            d = b""
        if d:
            continue          # an answer (a 4xx): keep reading until closed
        kind, t0 = key.data
        sel.unregister(s)
        s.close()
        closed += 1
        if s in first_round:
            first_closed_age.append(time.monotonic() - first_round.pop(s))
        if again:
            comeback.append((time.monotonic() + 0.3, kind))  # and come back
    if time.monotonic() - last_tick >= 1.0:
        last_tick = time.monotonic()
        for key in list(sel.get_map().values()):
            try:
                key.fileobj.send(b"X-Slow: 1\r\n" if key.data[0] == "hdr" else b" ")
            except OSError:
                pass
print("opened", opened, "closed", closed, "first_round_open", len(first_round),
      "first_round_max_age %.1f" % max(first_closed_age or [0]))
PY
/usr/bin/python3 "$ACC_TMP/trickle.py" "$port" 140 10 10 1 >"$ACC_TMP/trickle.out" 2>&1 &
trickler=$!

sleep 1 # the flood is in place
answered=0
for i in $(seq 1 6); do
    code=$(curl -s -o /dev/null --max-time 5 -w '%{http_code}' "$BASE/healthz")
    [ "$code" = 200 ] || fail "/healthz during the flood (try $i): HTTP $code"
    code=$(curl -s -o /dev/null --max-time 5 -w '%{http_code}' "$BASE/v1/jobs")
    [ "$code" = 200 ] || fail "GET /v1/jobs during the flood (try $i): HTTP $code"
    answered=$((answered + 1))
    sleep 1
done
wait "$trickler" || fail "trickler failed: $(cat "$ACC_TMP/trickle.out")"
out=$(cat "$ACC_TMP/trickle.out")
echo "trickler: $out"
read -r _ opened _ closed _ left _ age <<<"$out"
# every connection of the first round was closed while it still trickled
# (it lived 10 s past header_timeout 3 s / request_timeout 5 s otherwise)
expect_eq "first-round connections still open at the end" "$left" 0
[ "$closed" -ge 150 ] || fail "only $closed trickling connections were closed"
n=$(curl -s "$BASE/metrics" | awk '/^accumd_http_connections_closed_total /{print $2}')
[ "${n:-0}" -ge 150 ] || fail "accumd_http_connections_closed_total is '$n'"
ok "$answered rounds of /healthz and /v1/jobs answered under a trickle flood; $closed slow connections closed"

# fewer than the cap, no comeback: each is closed by its deadline alone,
# though it keeps trickling for 8 s (header_timeout 3 s, request_timeout 5 s)
/usr/bin/python3 "$ACC_TMP/trickle.py" "$port" 20 5 8 0 >"$ACC_TMP/trickle.out" 2>&1 || fail "trickler failed"
out=$(cat "$ACC_TMP/trickle.out")
echo "trickler: $out"
read -r _ opened _ closed _ left _ age <<<"$out"
expect_eq "slow connections past their deadline" "$left" 0
expect_eq "slow connections closed" "$closed" 25
ok "header_timeout and request_timeout close trickling connections"

# the limits are config keys, checked
"$ACCUMD" --set state_dir="$ACC_TMP/x" --set max_connections_per_ip=10 --set max_pending_connections=10 \
    --check-config >"$ACC_TMP/cc" 2>&1 && fail "a pending cap without a reserve was accepted"
grep -q max_pending_connections "$ACC_TMP/cc" || fail "the error does not name the key: $(cat "$ACC_TMP/cc")"
"$ACCUMD" --set state_dir="$ACC_TMP/x" --set header_timeout=30 --set request_timeout=10 \
    --check-config >"$ACC_TMP/cc" 2>&1 && fail "header_timeout above request_timeout was accepted"
acc_stop
ok "connection limits are checked config keys"

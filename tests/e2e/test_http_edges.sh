#!/bin/bash
# Issue 25, defect 12: HTTP edge cases, sent as raw bytes (python3 sockets):
#   - a NUL byte inside any header value (Last-Event-ID, Authorization, a
#     custom header, the last header just before its line end) is a JSON
#     400, never a request served with the value cut at the NUL; requests
#     without one (trailing blanks, empty values, bare LF line ends,
#     pipelined keep-alive requests) are served as before;
#   - Transfer-Encoding other than chunked ("xchunked") is answered at once
#     (501 or 400, within 3 s) with a JSON error naming Transfer-Encoding;
#   - a Content-Length past 64 bits (23 digits), sent at once or after a
#     pause, is a JSON 413 with exactly one status line.
. "$(dirname "$0")/lib.sh"

acc_start
port=${BASE##*:}

cat >"$ACC_TMP/raw.py" <<'PY'
import json, socket, sys, time
port = int(sys.argv[1])

def send(parts, wait=3.0):
    """Send the parts (a pause between them), read until close or `wait`."""
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    t0 = time.monotonic()
    for i, p in enumerate(parts):
        if i:
            time.sleep(0.4)
        s.sendall(p)
    out = b""
    try:
        while time.monotonic() - t0 < wait:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except socket.timeout:
        pass
    s.close()
    return out, time.monotonic() - t0

def answers(raw):
    """Status codes of the status lines, and the first JSON body."""
    codes = [int(l.split()[1]) for l in raw.split(b"\n") if l.startswith(b"HTTP/1.")]
    body = None
    for chunk in raw.split(b"\r\n\r\n")[1:]:
        line = chunk.split(b"\n")[0].strip()
        if line.startswith(b"{"):
            body = json.loads(line)
            break
    return codes, body

failed = []
def check(name, ok, raw):
    print(("ok   " if ok else "FAIL ") + name + (": " + repr(raw[:400]) if not ok else ""))
    if not ok:
        failed.append(name)

R = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n"
nul = {
    "Last-Event-ID": R + b"Last-Event-ID: 1\x002\r\n\r\n",
    "Authorization": R + b"Authorization: Bearer abc\x00def\r\n\r\n",
    "custom header": R + b"X-A: a\x00b\r\nX-B: c\r\n\r\n",
    "NUL before the line end": R + b"X-A: ab\x00\r\nX-B: c\r\n\r\n",
    "NUL ending the last header": R + b"X-A: ab\x00\r\n\r\n",
    "events stream": b"GET /v1/jobs/j000001/events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 5\x00\x00x\r\n\r\n",
}
for name, req in nul.items():
    raw, _ = send([req])
    codes, body = answers(raw)
    check("NUL in a header (%s) -> 400" % name,
          codes == [400] and body is not None and "NUL" in body["error"]["message"], raw)

fine = {
    "trailing blanks": R + b"X-A: ab   \r\nX-B: c \t \r\n\r\n",
    "empty values": R + b"X-A:\r\nX-B: \r\n\r\n",
    "bare LF": b"GET /v1/jobs HTTP/1.1\nHost: x\nX-A: ab\n\n",
    "pipelined": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + R + b"Last-Event-ID: 7\r\n\r\n",
}
for name, req in fine.items():
    raw, _ = send([req], wait=1.5)
    codes, _ = answers(raw)
    want = [200, 200] if name == "pipelined" else [200]
    check("no NUL (%s) -> %s" % (name, want), codes == want, raw)

raw, dt = send([b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n{}"])
codes, body = answers(raw)
check("Transfer-Encoding: xchunked -> 501/400 at once (%.2f s)" % dt,
      len(codes) == 1 and codes[0] in (400, 501) and dt < 2.5 and body is not None
      and body["error"].get("field") == "Transfer-Encoding", raw)

big = b"Content-Length: 99999999999999999999999\r\n\r\n{}"
head = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n"
for name, parts in (("at once", [head + big]), ("after a pause", [head, big])):
    raw, _ = send(parts)
    codes, body = answers(raw)
    check("Content-Length past 64 bits (%s) -> one JSON 413" % name,
          codes == [413] and raw.count(b"HTTP/1.") == 1 and body is not None
          and body["error"]["code"] == "too_large", raw)
sys.exit(1 if failed else 0)
PY
python3 "$ACC_TMP/raw.py" "$port" || fail "raw HTTP cases (above)"
curl -sf "$BASE/healthz" >/dev/null || fail "the daemon does not answer after the raw cases"
ok "NUL in headers 400, unknown transfer coding 501 at once, Content-Length past 64 bits one JSON 413"
acc_stop

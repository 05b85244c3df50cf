#!/bin/bash
# Issue 16, defects 9, 10, 13, 14, 15: what the request carries in its path,
# query and headers is parsed strictly and echoed safely.
#  9: non-UTF-8 bytes echoed into an error are escaped (400/404, not 500);
# 10: a NUL (percent-encoded or raw) never shortens a job id;
# 13: booleans (?dry_run) are 1/true/yes/on/0/false/no/off (any case), else 400;
# 14: since / Last-Event-ID are plain decimal, range-checked, else 400;
# 15: HEAD works wherever GET does.
. "$(dirname "$0")/lib.sh"

acc_data
acc_start --set cpu_devices=2 --set cpu_device_memory=128M
victim=$(acc_submit "$(tiny_job victim 1000000)") || exit 1
acc_wait_state "$victim" running

# expect_json_error METHOD URL STATUS FIELD [curl args...]: the answer is a
# JSON error (valid UTF-8: jq parses it) with that status and field
expect_json_error() {
    local m=$1 u=$2 want=$3 wfield=$4 out code field
    shift 4
    out=$(acc_curl -w '\n%{http_code}' -X "$m" "$@" "$BASE$u")
    code=${out##*$'\n'}
    out=${out%$'\n'*}
    [ "$code" = "$want" ] || fail "$m $u $*: HTTP $code, want $want: $out"
    printf '%s' "$out" | iconv -f UTF-8 -t UTF-8 >/dev/null 2>&1 || fail "$m $u: answer is not UTF-8: $out"
    field=$(printf '%s' "$out" | jq -r '.error.field // ""') || fail "$m $u: not JSON: $out"
    [ "$field" = "$wfield" ] || fail "$m $u: field '$field', want '$wfield': $out"
}

# 9: invalid UTF-8 in the path, a query value, a header, the method
expect_json_error GET '/v1/jobs/%ff' 404 ""
expect_json_error GET '/v1/jobs/%c3%28/events' 404 ""
expect_json_error GET '/v1/jobs?state=%ff' 400 state
expect_json_error GET "/v1/jobs/$victim/events?format=%fe%ff" 400 format
expect_json_error GET "/v1/jobs/$victim/events" 400 Last-Event-ID -H $'Last-Event-ID: \xff'
expect_json_error GET "/v1/jobs/$victim/events?since=%ed%a0%80" 400 since
expect_json_error GET '/%ff%0a/nothing' 404 ""
expect_json_error PUT '/v1/jobs/%80' 404 ""
msg=$(acc_curl "$BASE/v1/jobs?state=%ff" | jq -r .error.message)
case $msg in *'\xff'*) ;; *) fail "the bad byte is not shown as \\xff: $msg" ;; esac
ok "non-UTF-8 request bytes are escaped in errors"

# 10: %00 in an id, raw NUL in the request line: never the job without it
expect_json_error DELETE "/v1/jobs/$victim%00" 404 ""
expect_json_error GET "/v1/jobs/$victim%00/events" 404 ""
expect_json_error DELETE "/v1/jobs/$victim%2500" 404 ""
expect_json_error DELETE "/v1/jobs/$victim%2F" 404 ""
expect_json_error DELETE "/v1/jobs/$victim/" 404 ""
expect_json_error DELETE "/v1/jobs/${victim}x" 404 ""
expect_json_error DELETE "/v1/jobs/+$victim" 404 ""
expect_json_error GET '/v1/jobs?state=running%00' 400 state
port=${BASE##*:}
raw=$(/usr/bin/python3 - "$port" "$victim" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"DELETE /v1/jobs/" + sys.argv[2].encode() + b"\x00x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
s.settimeout(10)
out = b""
while True:
    d = s.recv(65536)
    if not d:
        break
    out += d
print(out.split(b"\r\n")[0].decode())
PY
)
case $raw in *' 400 '*) ;; *) fail "raw NUL in the request target: $raw" ;; esac
expect_eq "victim survives NUL tricks" "$(acc_state "$victim")" running
ok "NUL bytes never shorten an id"

# 13: strict booleans, for every boolean query parameter (dry_run)
spec=$(tiny_job dry 3)
njobs() { acc_curl "$BASE/v1/jobs" | jq '.jobs | length'; }
before=$(njobs)
for v in 1 true TRUE True yes on ON ''; do
    out=$(acc_curl -X POST --data-binary "$spec" "$BASE/v1/jobs?dry_run=$v")
    expect_eq "dry_run=$v is a dry run" "$(echo "$out" | jq -r .dry_run)" true
done
out=$(acc_curl -X POST --data-binary "$spec" "$BASE/v1/jobs?dry_run")
expect_eq "bare dry_run is a dry run" "$(echo "$out" | jq -r .dry_run)" true
expect_eq "no job from dry runs" "$(njobs)" "$before"
for v in maybe 2 -1 tru 'true%20' '%20true' '1%00' '%ff' yess; do
    expect_json_error POST "/v1/jobs?dry_run=$v" 400 dry_run --data-binary "$spec"
done
expect_json_error POST "/v1/jobs?dry_run=1&dry_run=0" 400 dry_run --data-binary "$spec"
expect_eq "no job from refused values" "$(njobs)" "$before"
for v in 0 false FALSE no off; do
    out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$(tiny_job real 1)" "$BASE/v1/jobs?dry_run=$v")
    expect_eq "dry_run=$v submits" "${out##*$'\n'}" 201
done
ok "booleans parsed strictly"

# 14: strict decimal sequence numbers, range-checked
for v in '%20-1' -1 '%2B5' '+5' 5x 0x10 '' 18446744073709551615 9223372036854775808 '1%00' '%205'; do
    expect_json_error GET "/v1/jobs/$victim/events?since=$v" 400 since
done
for v in ' -1' '+5' 18446744073709551615 9223372036854775808 1e3 5x; do
    expect_json_error GET "/v1/jobs/$victim/events" 400 Last-Event-ID -H "Last-Event-ID: $v"
done
expect_json_error GET "/v1/jobs/$victim/events?since=1" 400 Last-Event-ID -H "Last-Event-ID: -1"
expect_json_error GET "/v1/jobs/$victim/events?since=1&since=2" 400 since
# a valid one still streams from where it says: the first event after 1 is 2
# (on a short finished job: the victim's ring has long wrapped, see event_ring)
short=$(acc_submit "$(tiny_job short 2)") || exit 1
acc_wait_state "$short" succeeded
first=$(acc_curl --max-time 10 "$BASE/v1/jobs/$short/events?since=1&format=ndjson" | head -n 1 | jq -r .seq)
expect_eq "since=1 starts at 2" "$first" 2
first=$(acc_curl --max-time 10 -H 'Last-Event-ID: 0' "$BASE/v1/jobs/$short/events?format=ndjson" | head -n 1 | jq -r .seq)
expect_eq "Last-Event-ID 0 starts at 1" "$first" 1
ok "since and Last-Event-ID parsed strictly"

# 15: HEAD wherever GET is: the GET answer's status and content type, no
# body (read on a raw socket, so nothing hides a body that was sent)
head_check() { # URL STATUS TYPE
    local got
    got=$(/usr/bin/python3 - "$port" "$1" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"HEAD " + sys.argv[2].encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
s.settimeout(10)
out = b""
while True:
    d = s.recv(65536)
    if not d:
        break
    out += d
head, _, body = out.partition(b"\r\n\r\n")
lines = head.decode().split("\r\n")
ctype = [l.split(":", 1)[1].strip() for l in lines[1:] if l.lower().startswith("content-type:")]
print(lines[0].split(" ")[1], ctype[0].replace(" ", "") if ctype else "-", len(body))
PY
)
    set -- "$1" "$2" "$3" $got
    expect_eq "HEAD $1 status" "$4" "$2"
    case $5 in "$3"*) ;; *) fail "HEAD $1: content type '$5', want $3" ;; esac
    expect_eq "HEAD $1 body bytes" "$6" 0
}
head_check "/healthz" 200 application/json
head_check "/v1/jobs" 200 application/json
head_check "/v1/jobs/$victim" 200 application/json
head_check "/v1/jobs/$victim/metrics" 200 application/json
head_check "/v1/jobs/$victim/events" 200 text/event-stream
head_check "/v1/jobs/$victim/events?format=ndjson" 200 application/x-ndjson
head_check "/v1/devices" 200 application/json
head_check "/metrics" 200 text/plain
head_check "/v1/jobs/j999999" 404 application/json
allow=$(acc_curl -D - -o /dev/null -X PUT "$BASE/v1/jobs/$victim" | tr -d '\r' | grep -i '^allow:')
case $allow in *HEAD*) ;; *) fail "405 Allow lacks HEAD: $allow" ;; esac
ok "HEAD on every GET route"

curl -sf -o /dev/null "$BASE/healthz" || fail "daemon down"
expect_eq "victim still running" "$(acc_state "$victim")" running
acc_curl -s -o /dev/null -X DELETE "$BASE/v1/jobs/$victim"
acc_wait_state "$victim" cancelled
acc_stop
ok "daemon intact"

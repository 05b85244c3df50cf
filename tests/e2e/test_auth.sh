#!/bin/bash
# Auth: the token file is created 0600; with require_token every endpoint
# but /healthz answers 401 without the right bearer token, and works with it.
. "$(dirname "$0")/lib.sh"

acc_data
acc_start --set require_token=true
tf=$STATE/token
[ -f "$tf" ] || fail "token file not created"
expect_eq "token file mode" "$(stat -c %a "$tf")" 600
TOKEN=$(cat "$tf")

code=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/healthz")
expect_eq "healthz without token" "$code" 200
for path in /v1/jobs /v1/devices /metrics /v1/jobs/j000001 /v1/jobs/j000001/events; do
    code=$(curl -s -o "$ACC_TMP/401" -D "$ACC_TMP/h" -w '%{http_code}' "$BASE$path")
    expect_eq "GET $path without token" "$code" 401
    jq -e '.error.code == "unauthorized"' "$ACC_TMP/401" >/dev/null || fail "401 body: $(cat "$ACC_TMP/401")"
    grep -qi '^WWW-Authenticate: Bearer' "$ACC_TMP/h" || fail "no WWW-Authenticate"
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer wrong$TOKEN" "$BASE$path")
    expect_eq "GET $path with a wrong token" "$code" 401
done
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST --data-binary "$(tiny_job t 2)" "$BASE/v1/jobs")
expect_eq "POST without token" "$code" 401
expect_eq "nothing submitted" "$(acc_curl "$BASE/v1/jobs" | jq '.jobs | length')" 0

id=$(acc_submit "$(tiny_job t 2)") || exit 1
acc_wait_state "$id" succeeded
code=$(acc_curl -o /dev/null -w '%{http_code}' "$BASE/metrics")
expect_eq "metrics with token" "$code" 200
acc_stop
ok "token required, 401 without, works with"

# the same token is kept across restarts; loopback without require_token is open
before=$TOKEN
acc_start
expect_eq "token kept" "$(cat "$tf")" "$before"
code=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v1/jobs")
expect_eq "loopback, token not required" "$code" 200
acc_stop
ok "token kept; loopback default open"

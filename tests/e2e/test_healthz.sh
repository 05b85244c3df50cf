#!/bin/bash
# The daemon starts on a free port, answers /healthz, answers unknown routes
# with a JSON 404, and stops on SIGTERM with exit 0 and no sanitizer report.
. "$(dirname "$0")/lib.sh"

acc_start
body=$(curl -s "$BASE/healthz")
expect_eq "healthz body" "$body" '{"status":"ok"}'
code=$(curl -s -o "$ACC_TMP/nf" -w '%{http_code}' "$BASE/v1/nope")
expect_eq "unknown route status" "$code" 404
grep -q '"code":"not_found"' "$ACC_TMP/nf" || fail "404 body is not a JSON error: $(cat "$ACC_TMP/nf")"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$BASE/healthz")
expect_eq "POST /healthz" "$code" 405
acc_stop
ok "healthz, 404, 405, clean SIGTERM"

# SIGINT stops it too, and a restart on the same state dir works
acc_start
kill -INT "$ACC_PID"
wait "$ACC_PID"; rc=$?; ACC_PID=
expect_eq "exit status on SIGINT" "$rc" 0
acc_check_log
acc_start
acc_stop
ok "SIGINT, restart"

# SIGHUP reopens log_file (logrotate moves the file away, then reloads)
acc_start --set log_file="$ACC_TMP/accumd.log"
grep -q 'listening on' "$ACC_TMP/accumd.log" || fail "log_file not written"
mv "$ACC_TMP/accumd.log" "$ACC_TMP/accumd.log.1"
kill -HUP "$ACC_PID"
for _ in $(seq 1 50); do [ -s "$ACC_TMP/accumd.log" ] && break; sleep 0.1; done
grep -q 'log reopened' "$ACC_TMP/accumd.log" || fail "SIGHUP did not reopen log_file"
curl -sf "$BASE/healthz" >/dev/null || fail "daemon not serving after SIGHUP"
acc_stop
grep -q 'stopped' "$ACC_TMP/accumd.log" || fail "shutdown not logged to the reopened file"
ok "SIGHUP reopens log_file"

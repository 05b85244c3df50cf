#!/bin/bash
# Issue 16, defect 17: whether the token is required is decided on the
# resolved address, never on how the listen host is spelt: a name that
# merely starts with "127." is not loopback.
. "$(dirname "$0")/lib.sh"

token_of() { "$ACCUMD" --set state_dir="$ACC_TMP/cc" --listen "$1" --check-config | awk '/^require_token/ {print $3}'; }
for h in 127.example.com:8470 127.0.0.1.example.invalid:8470 127.:8470 0.0.0.0:8470 '[::]:8470' '[::ffff:10.1.2.3]:8470'; do
    expect_eq "require_token for $h" "$(token_of "$h")" true
done
for h in 127.0.0.1:8470 127.3.2.1:8470 localhost:8470 '[::1]:8470'; do
    expect_eq "require_token for $h" "$(token_of "$h")" false
done
ok "--check-config: the token is forced on for every non-loopback listen host"

# a daemon on "localhost" (resolved to loopback) serves without the token
STATE=$ACC_TMP/state
mkdir -p "$STATE"
"$ACCUMD" --set listen=localhost:0 --set state_dir="$STATE" --set devices=cpu >>"$STATE/daemon.log" 2>&1 &
ACC_PID=$!
for _ in $(seq 1 200); do [ -s "$STATE/accumd.addr" ] && break; sleep 0.1; done
[ -s "$STATE/accumd.addr" ] || fail "no address file"
port=$(sed 's/.*://' "$STATE/accumd.addr")
BASE=http://127.0.0.1:$port
for _ in $(seq 1 100); do curl -sf -o /dev/null "$BASE/healthz" && break; sleep 0.1; done
expect_eq "GET /v1/jobs on localhost without a token" "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v1/jobs")" 200
grep -q "token required" "$STATE/daemon.log" && fail "localhost counted as a network address"
acc_stop
ok "localhost is loopback"

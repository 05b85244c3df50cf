# End-to-end test helpers: start the real accumd on a free loopback port with
# a private state directory, talk to it with curl, always stop it.
#
#   . "$(dirname "$0")/lib.sh"
#   acc_start [--set key=value ...]     # sets $BASE, $STATE, $ACC_PID
#   curl -s "$BASE/healthz"
#   acc_stop                            # SIGTERM, expect exit 0, no sanitizer report
#
# ACCUMD must name the binary (meson passes it).
set -u
: "${ACCUMD:?ACCUMD must point at the accumd binary}"

TEST_NAME=$(basename "$0" .sh)
ACC_PID=
STATE=
BASE=
ACC_TMP=$(mktemp -d "${TMPDIR:-/tmp}/accumd-$TEST_NAME.XXXXXX")

fail() {
    echo "FAIL($TEST_NAME): $*" >&2
    if [ -n "$STATE" ] && [ -f "$STATE/daemon.log" ]; then
        echo "---- daemon log (last 40 lines) ----" >&2
        tail -n 40 "$STATE/daemon.log" >&2
    fi
    exit 1
}

ok() { echo "ok($TEST_NAME): $*"; }

# expect_eq WHAT GOT WANT
expect_eq() { [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"; }

# Start a daemon; extra args go to accumd. Waits until /healthz answers.
acc_start() {
    STATE=${STATE:-$ACC_TMP/state}
    mkdir -p "$STATE"
    rm -f "$STATE/accumd.addr"
    "$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$STATE" --set devices=cpu "$@" \
        >>"$STATE/daemon.log" 2>&1 &
    ACC_PID=$!
    local i
    for i in $(seq 1 200); do
        if [ -s "$STATE/accumd.addr" ]; then
            BASE="http://$(cat "$STATE/accumd.addr")"
            if curl -sf -o /dev/null "$BASE/healthz"; then
                return 0
            fi
        fi
        kill -0 "$ACC_PID" 2>/dev/null || fail "accumd exited during start"
        sleep 0.1
    done
    fail "accumd did not become ready in 20 s"
}

# Stop with SIGTERM, expect exit 0 within $1 seconds (default 30).
acc_stop() {
    [ -n "$ACC_PID" ] || return 0
    local pid=$ACC_PID rc i
    ACC_PID=
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 $((${1:-30} * 10))); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        fail "accumd did not stop on SIGTERM"
    fi
    wait "$pid"
    rc=$?
    acc_check_log
    [ "$rc" -eq 0 ] || fail "accumd exited with $rc on SIGTERM"
}

# Kill hard (crash simulation); no exit status check.
acc_kill9() {
    [ -n "$ACC_PID" ] || return 0
    kill -KILL "$ACC_PID" 2>/dev/null
    wait "$ACC_PID" 2>/dev/null
    ACC_PID=
}

acc_check_log() {
    if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$STATE/daemon.log"; then
        fail "sanitizer report in the daemon log"
    fi
}

acc_cleanup() {
    local rc=$?
    if [ -n "$ACC_PID" ]; then
        kill -KILL "$ACC_PID" 2>/dev/null
        wait "$ACC_PID" 2>/dev/null
    fi
    rm -rf "$ACC_TMP"
    exit $rc
}
trap acc_cleanup EXIT

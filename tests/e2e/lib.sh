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

# ---- jobs (need jq) -----------------------------------------------------------
# acc_data: a small text corpus in the daemon's default data root
# ($STATE/data/gpl.txt). Call before or after acc_start.
acc_data() {
    STATE=${STATE:-$ACC_TMP/state}
    mkdir -p "$STATE/data"
    cp /usr/share/common-licenses/GPL-3 "$STATE/data/gpl.txt"
}

# curl -s, with the bearer token when $TOKEN is set.
acc_curl() {
    if [ -n "${TOKEN:-}" ]; then
        curl -s -H "Authorization: Bearer $TOKEN" "$@"
    else
        curl -s "$@"
    fi
}

# tiny_job NAME MAX_STEPS [EXTRA_JSON_MEMBERS]: a spec that trains in
# milliseconds a step on one CPU device.
tiny_job() {
    printf '{"name":"%s","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt","format":"text"},"train_batch_size":8,"train_micro_batch_size_per_gpu":2,"max_steps":%s%s}' \
        "$1" "$2" "${3:+,$3}"
}

# acc_submit SPEC: POST it, expect 201, print the job id.
acc_submit() {
    local out code
    out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$1" "$BASE/v1/jobs")
    code=${out##*$'\n'}
    [ "$code" = 201 ] || fail "submit: HTTP $code: ${out%$'\n'*}"
    echo "${out%$'\n'*}" | jq -r .id
}

acc_state() { acc_curl "$BASE/v1/jobs/$1" | jq -r .state; }

# acc_wait_state ID STATE [SECONDS=30]
acc_wait_state() {
    local i s
    for i in $(seq 1 $((${3:-30} * 20))); do
        s=$(acc_state "$1")
        [ "$s" = "$2" ] && return 0
        sleep 0.05
    done
    fail "job $1 is '$s', not '$2' after ${3:-30} s"
}

# acc_wait_step ID STEP: until the job has done at least STEP steps.
acc_wait_step() {
    local i s
    for i in $(seq 1 600); do
        s=$(acc_curl "$BASE/v1/jobs/$1" | jq -r .step)
        [ "$s" -ge "$2" ] 2>/dev/null && return 0
        sleep 0.05
    done
    fail "job $1 did not reach step $2 (at $s)"
}

# expect_error METHOD PATH DATA STATUS FIELD: the answer is STATUS with a
# JSON error body naming FIELD ("" for none).
expect_error() {
    local out code field
    if [ -n "$3" ]; then
        out=$(acc_curl -w '\n%{http_code}' -X "$1" --data-binary "$3" "$BASE$2")
    else
        out=$(acc_curl -w '\n%{http_code}' -X "$1" "$BASE$2")
    fi
    code=${out##*$'\n'}
    out=${out%$'\n'*}
    [ "$code" = "$4" ] || fail "$1 $2: HTTP $code, want $4: $out"
    echo "$out" | jq -e '.error.code and .error.message' >/dev/null || fail "$1 $2: not a JSON error: $out"
    field=$(echo "$out" | jq -r '.error.field // ""')
    [ "$field" = "$5" ] || fail "$1 $2: field '$field', want '$5': $out"
}

# ---- the job store (state_dir/accumd.db, SQLite) ---------------------------------
# acc_db SQL: run a query on the daemon's store (read-only; works while it runs).
acc_db() { sqlite3 -readonly "$STATE/accumd.db" "$1"; }
# acc_events_text ID: every stored event line of a job, oldest first.
acc_events_text() { acc_db "SELECT json FROM events WHERE job = '$1' ORDER BY seq"; }

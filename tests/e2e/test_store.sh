#!/bin/bash
# The job store on SQLite (issue 16):
#  - a round-1 state directory (jobs/<id>/ files, a torn last event line, a
#    garbage seq, a damaged spec.json) is imported at the first start: every
#    job listed, the damaged one failed with the reason, files moved aside;
#  - GET /v1/jobs pages newest first with ?limit= and ?after=, `next` is the
#    cursor, ?state= filters, bad values are 400 naming the field;
#  - kill -9 in the middle of a burst of submissions loses no acknowledged job;
#  - a state change the store cannot write (another process holds its write
#    lock) is not shown as done: the job keeps its state, /healthz and
#    /metrics say so, submissions get 503 `unavailable`, and once the store
#    writes again the change lands;
#  - a submission the store refuses is 500 `internal` naming the operation and
#    the file, then 503 until it writes; a damaged record stays, failed;
#  - garbage written into the database file: the daemon starts read-only,
#    answers reads, refuses submissions with 503, /healthz says why.
. "$(dirname "$0")/lib.sh"
command -v sqlite3 >/dev/null || fail "sqlite3 (the CLI) is needed"
ARGS=(--set cpu_devices=1 --set cpu_device_memory=128M)

# ---- round-1 import
acc_data
r1=$STATE/jobs
mkdir -p "$r1/j000001" "$r1/j000002" "$r1/j000003"
tiny_job old-done 3 >"$r1/j000001/spec.json"
echo '{"id":"j000001","state":"succeeded","submit_seq":1,"submitted_at":1764670000.5,"step":3,"error_code":"","error":"","restarts":0}' >"$r1/j000001/status.json"
printf '%s\n' '{"seq":1,"type":"state","time":"2025-12-02T10:00:00.000Z","job":"j000001","state":"queued"}' \
    '{"seq":2,"type":"step","time":"2025-12-02T10:00:01.000Z","job":"j000001","step":1,"loss":5.5,"lr":0.001}' \
    '{"seq":999999999999,"type":"log","job":"j000001","message":"garbage"}' \
    '{"seq":3,"type":"done","time":"2025-12-02T10:00:02.000Z","job":"j000001","state":"succeeded"}' >"$r1/j000001/events.ndjson"
printf '{"seq":4,"type":"sta' >>"$r1/j000001/events.ndjson" # torn by a crash
echo '{"name": "damaged", "model": {' >"$r1/j000002/spec.json"
echo '{"id":"j000002","state":"queued","submit_seq":2}' >"$r1/j000002/status.json"
tiny_job old-queued 2 >"$r1/j000003/spec.json"
echo '{"id":"j000003","state":"queued","submit_seq":3}' >"$r1/j000003/status.json"
acc_start "${ARGS[@]}"
expect_eq "imported jobs listed" "$(curl -s "$BASE/v1/jobs" | jq -c '[.jobs[].id]')" '["j000003","j000002","j000001"]'
expect_eq "round-1 succeeded job" "$(acc_state j000001)" succeeded
expect_eq "its events: torn tail and garbage seq dropped" \
    "$(curl -s "$BASE/v1/jobs/j000001/events?format=ndjson" | jq -c -s '[.[].seq]')" '[1,2,3]'
expect_eq "its history" "$(curl -s "$BASE/v1/jobs/j000001/metrics" | jq -c '[.steps[].step]')" '[1]'
expect_eq "damaged record kept, failed" "$(acc_state j000002)" failed
curl -s "$BASE/v1/jobs/j000002" | jq -r .error.message | grep -q 'damaged' || fail "no reason for the damaged job"
acc_wait_state j000003 succeeded
[ -d "$STATE/jobs.imported/j000001" ] || fail "round-1 files not kept in jobs.imported/"
[ -e "$STATE/jobs" ] && fail "jobs/ still there after the import"
new=$(acc_submit "$(tiny_job new 1)") || exit 1
expect_eq "ids go on after the imported ones" "$new" j000004
acc_stop
acc_start "${ARGS[@]}"
expect_eq "a second start imports nothing twice" "$(curl -s "$BASE/v1/jobs" | jq '.jobs | length')" 4
expect_eq "damaged job still failed" "$(acc_state j000002)" failed
acc_stop
ok "round-1 state directory imported"

# ---- pagination: a blocker runs, 9 jobs queue behind it
STATE=$ACC_TMP/pages
acc_data
acc_start "${ARGS[@]}"
blocker=$(acc_submit "$(tiny_job blocker 1000000)") || exit 1
acc_wait_state "$blocker" running
for i in $(seq 1 9); do acc_submit "$(tiny_job "q$i" 2)" >/dev/null || exit 1; done
all=$(curl -s "$BASE/v1/jobs" | jq -c '[.jobs[].id]')
expect_eq "newest first" "$(echo "$all" | jq -r '.[0] + " " + .[-1]')" "j000010 j000001"
pages=() after= n=0
while :; do
    out=$(curl -s "$BASE/v1/jobs?limit=4${after:+&after=$after}")
    pages+=("$(echo "$out" | jq -c '[.jobs[].id]')")
    after=$(echo "$out" | jq -r '.next // empty')
    n=$((n + 1))
    [ -n "$after" ] && [ $n -lt 10 ] || break
done
expect_eq "pages of 4" "${#pages[@]}" 3
expect_eq "pages joined are the whole list" "$(printf '%s\n' "${pages[@]}" | jq -c -s 'add')" "$all"
expect_eq "last page has no next" "$(curl -s "$BASE/v1/jobs?limit=4&after=j000003" | jq -c '[[.jobs[].id], .next]')" '[["j000002","j000001"],null]'
expect_eq "state filter by pages" \
    "$(curl -s "$BASE/v1/jobs?state=queued&limit=2&after=j000005" | jq -c '[[.jobs[].id], .next]')" '[["j000004","j000003"],"j000003"]'
expect_eq "running filter" "$(curl -s "$BASE/v1/jobs?state=running" | jq -c '[.jobs[].id]')" "[\"$blocker\"]"
for bad in 0 -1 1001 abc 5x ""; do
    expect_error GET "/v1/jobs?limit=$bad" "" 400 limit
done
expect_error GET "/v1/jobs?after=j999999" "" 400 after
ok "pagination: limit, after, next, state"

# ---- kill -9 during a burst of submissions
touch "$ACC_TMP/acked"
for i in $(seq 1 40); do
    (code=$(curl -s -o "$ACC_TMP/burst$i" -w '%{http_code}' -X POST --data-binary "$(tiny_job "b$i" 2)" "$BASE/v1/jobs")
     [ "$code" = 201 ] && jq -r .id "$ACC_TMP/burst$i" >>"$ACC_TMP/acked") &
done
# kill once a few are acknowledged, with the rest in flight
for _ in $(seq 1 400); do [ "$(wc -l <"$ACC_TMP/acked")" -ge 3 ] && break; sleep 0.01; done
acc_kill9
wait
acc_start "${ARGS[@]}"
[ -s "$ACC_TMP/acked" ] || fail "no submission acknowledged before the kill"
have=$(curl -s "$BASE/v1/jobs?limit=1000" | jq -r '.jobs[].id')
while read -r id; do
    echo "$have" | grep -qx "$id" || fail "acknowledged job $id lost by kill -9"
done <"$ACC_TMP/acked"
ok "kill -9 mid-burst: all $(wc -l <"$ACC_TMP/acked") acknowledged submissions kept"
blocker=$(curl -s "$BASE/v1/jobs?state=running" | jq -r '.jobs[0].id')
acc_wait_state "$blocker" running

# ---- the store cannot write: another process holds its write lock
lock() { # hold the database's write lock until the file $2 is removed
    /usr/bin/python3 - "$STATE/accumd.db" "$1" <<'PY' &
import os, sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN EXCLUSIVE")
open(sys.argv[2], "w").close()
while os.path.exists(sys.argv[2]):
    time.sleep(0.05)
c.execute("ROLLBACK")
PY
    for _ in $(seq 1 100); do [ -e "$1" ] && return 0; sleep 0.05; done
    fail "could not lock the store"
}
lock "$ACC_TMP/held"
# a running job's cancel is stored before its 202 (issue 25): refused now,
# nothing changed
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$BASE/v1/jobs/$blocker")
expect_eq "cancel a running job while the store cannot write" "$code" 503
expect_eq "no cancel shown that is not stored" "$(curl -s "$BASE/v1/jobs/$blocker" | jq -r .cancel_requested)" false
# a state change while the store cannot write: the job's worker dies (its
# end, failed, waits for the store)
kill -9 "$(cat "$STATE/workers/$blocker.pid")" || fail "no worker pid for $blocker"
for _ in $(seq 1 100); do
    [ "$(curl -s "$BASE/healthz" | jq -r .status)" = degraded ] && break
    sleep 0.05
done
h=$(curl -s "$BASE/healthz")
expect_eq "healthz degraded" "$(echo "$h" | jq -r .status)" degraded
echo "$h" | jq -r .store.error | grep -q 'accumd.db' || fail "healthz does not name the file: $h"
sleep 1 # the worker is gone by now; its outcome cannot be stored
expect_eq "not shown failed while unstored" "$(acc_state "$blocker")" running
curl -s "$BASE/metrics" | grep -q '^accumd_store_up 0' || fail "metrics: store not down"
curl -s "$BASE/metrics" | grep -q '^accumd_store_pending_state_changes 1' || fail "metrics: no pending change"
expect_error POST /v1/jobs "$(tiny_job refused 2)" 503 ""
grep -q 'not stored' "$STATE/daemon.log" || fail "the log does not say what was not stored"
rm -f "$ACC_TMP/held"
acc_wait_state "$blocker" failed 20
for _ in $(seq 1 100); do
    [ "$(curl -s "$BASE/healthz" | jq -r .status)" = ok ] && break
    sleep 0.05
done
expect_eq "healthz ok again" "$(curl -s "$BASE/healthz" | jq -r .status)" ok
acc_submit "$(tiny_job accepted 2)" >/dev/null || exit 1
[ -e "$STATE/jobs" ] && fail "a job directory was created under state_dir"
acc_stop
acc_start "${ARGS[@]}"
expect_eq "the late change is on disk" "$(acc_state "$blocker")" failed
acc_stop
ok "unwritable store: nothing shown done that is not stored, 503, retried"

# ---- a submission the store refuses: 500 `internal` naming the operation
# and the file (nothing acknowledged, nothing left behind), then 503 until
# the store writes again; a damaged record in the database stays listed
STATE=$ACC_TMP/refused
acc_data
acc_start "${ARGS[@]}"
keep=$(acc_submit "$(tiny_job keep 2)") || exit 1
acc_wait_state "$keep" succeeded
lock "$ACC_TMP/held2"
out=$(curl -s -w '\n%{http_code}' -X POST --data-binary "$(tiny_job refused 2)" "$BASE/v1/jobs")
expect_eq "refused submission" "${out##*$'\n'}" 500
echo "${out%$'\n'*}" | jq -e '.error.code == "internal" and (.error.message | test("create job j000002 on .*accumd.db"))' \
    >/dev/null || fail "store error does not say internal / what / which file: ${out%$'\n'*}"
expect_error POST /v1/jobs "$(tiny_job refused 2)" 503 ""
rm -f "$ACC_TMP/held2"
for _ in $(seq 1 100); do
    [ "$(curl -s "$BASE/healthz" | jq -r .status)" = ok ] && break
    sleep 0.05
done
next=$(acc_submit "$(tiny_job after 2)") || exit 1
expect_eq "the refused one left no id behind" "$next" j000002
expect_eq "jobs" "$(curl -s "$BASE/v1/jobs" | jq -c '[.jobs[].id]')" "[\"$next\",\"$keep\"]"
[ -e "$STATE/jobs" ] && fail "a job directory was created under state_dir"
acc_wait_state "$next" succeeded
acc_stop
sqlite3 "$STATE/accumd.db" "UPDATE jobs SET spec = '{\"name\": tor' WHERE id = '$keep'"
acc_start "${ARGS[@]}"
expect_eq "damaged record listed failed" "$(acc_state "$keep")" failed
acc_curl "$BASE/v1/jobs/$keep" | jq -r .error.message | grep -q 'record damaged: the stored spec is not valid JSON' ||
    fail "no reason: $(acc_curl "$BASE/v1/jobs/$keep")"
expect_eq "the other job" "$(acc_state "$next")" succeeded
acc_stop
ok "refused submission: 500 internal naming the file, then 503; damaged record kept as failed"

# ---- garbage in the database file: read-only mode
acc_start "${ARGS[@]}"
acc_stop
[ -e "$STATE/accumd.db-wal" ] && [ -s "$STATE/accumd.db-wal" ] && fail "WAL not checkpointed at a clean stop"
yes "not a b-tree page" | head -c 8192 | dd of="$STATE/accumd.db" bs=4096 seek=1 conv=notrunc status=none
acc_start "${ARGS[@]}"
for _ in $(seq 1 200); do # the whole-file check runs beside the start
    [ "$(curl -s "$BASE/healthz" | jq -r .status)" = degraded ] && break
    sleep 0.05
done
h=$(curl -s "$BASE/healthz")
expect_eq "healthz read-only" "$(echo "$h" | jq -c '[.status, .store.read_only]')" '["degraded",true]'
code=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v1/jobs")
expect_eq "reads still answered" "$code" 200
expect_error POST /v1/jobs "$(tiny_job refused 2)" 503 ""
curl -s "$BASE/metrics" | grep -q '^accumd_store_read_only 1' || fail "metrics: not read-only"
grep -q 'read-only mode' "$STATE/daemon.log" || fail "the log does not say read-only"
acc_stop
ok "corrupt database: read-only mode, reads answered, submissions 503"

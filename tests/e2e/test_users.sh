#!/bin/bash
# Users: a users file with two users and an admin (tokens stored as their
# SHA-256, made by accumctl user add and accumd --hash-token and checked
# against coreutils' sha256sum); every job records its owner; cancel by a
# non-owner is 403 naming the rule, by the owner or an admin 200/202; the
# per-user limits hold under a burst of submissions from both users; the
# fair order alternates between them; the audit log has every action, in
# state_dir and in the journal; /metrics by user; a wrong token is 401.
. "$(dirname "$0")/lib.sh"
: "${ACCUMCTL:?ACCUMCTL must point at the accumctl binary}"

USERS=$ACC_TMP/users
"$ACCUMCTL" user add alice --role user --users-file "$USERS" --json >"$ACC_TMP/alice.json" ||
    fail "user add alice"
ALICE=$(jq -r .token "$ACC_TMP/alice.json")
expect_eq "users file line of alice" "$(head -1 "$USERS")" "$(jq -r .line "$ACC_TMP/alice.json")"
"$ACCUMCTL" user add bob --users-file "$USERS" >"$ACC_TMP/bob.out" 2>/dev/null || fail "user add bob"
BOB=$(sed -n 1p "$ACC_TMP/bob.out")
expect_eq "bob's line, default role user" "$(sed -n 2p "$ACC_TMP/bob.out")" "bob user sha256:$(printf %s "$BOB" | sha256sum | cut -d' ' -f1)"
expect_eq "appended" "$(tail -1 "$USERS")" "$(sed -n 2p "$ACC_TMP/bob.out")"
"$ACCUMCTL" user add bob --users-file "$USERS" >/dev/null 2>&1 && fail "a second bob was added"
expect_eq "users file mode" "$(stat -c %a "$USERS")" 600
# an admin whose token was made elsewhere: accumd --hash-token, the same
# digest as sha256sum
ROOT=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
h=$(printf '%s\n' "$ROOT" | "$ACCUMD" --hash-token) || fail "--hash-token"
expect_eq "--hash-token" "$h" "sha256:$(printf %s "$ROOT" | sha256sum | cut -d' ' -f1)"
printf '# the lab admin\nroot   admin   %s\n' "$h" >>"$USERS"
ok "users file: accumctl user add, accumd --hash-token (= sha256sum)"

# a bad users file stops the start, naming the line
printf 'carol user %s\nbad superuser %s\n' "$h" "$h" >"$ACC_TMP/bad.users"
out=$(timeout 30 "$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$ACC_TMP/badstate" --set devices=cpu \
    --set users_file="$ACC_TMP/bad.users" 2>&1) && fail "started with a bad users file"
grep -q "bad.users:2: role must be admin or user, got 'superuser'" <<<"$out" || fail "bad users file: $out"

# the new keys through --check-config
out=$("$ACCUMD" --set users_file="$USERS" --set user_max_running=2 --set user_max_devices=3 --check-config) ||
    fail "--check-config with the user keys"
grep -qx "users_file = $USERS" <<<"$out" && grep -qx 'user_max_running = 2' <<<"$out" &&
    grep -qx 'user_max_devices = 3' <<<"$out" || fail "check-config: $out"
out=$("$ACCUMD" --set user_max_running=-1 --check-config 2>&1)
expect_eq "a negative limit" "$?" 2
grep -q 'user_max_running must be an integer in \[0,' <<<"$out" || fail "user_max_running=-1: $out"

as() { local t=$1; shift; curl -s -H "Authorization: Bearer $t" "$@"; }
# submit_as TOKEN SPEC: prints "id state"
submit_as() {
    as "$1" -X POST --data-binary "$2" "$BASE/v1/jobs" | jq -r '"\(.id) \(.state)"'
}
# code_as TOKEN METHOD PATH: the HTTP status
code_as() { as "$1" -o "$ACC_TMP/body" -w '%{http_code}' -X "$2" "$BASE$3"; }
wait_final() {
    local i s
    for i in $(seq 1 1200); do
        s=$(as "$ROOT" "$BASE/v1/jobs/$1" | jq -r .state)
        case $s in succeeded | failed | cancelled) return 0 ;; esac
        sleep 0.05
    done
    fail "job $1 did not end ($s)"
}

# ---- limits: one running job and one device per user, two devices ---------
acc_data
acc_start --set users_file="$USERS" --set require_token=true --set cpu_devices=2 --set cpu_device_memory=256M \
    --set user_max_running=1 --set user_max_devices=1
LONG=$(tiny_job long 100000)
SHORT=$(tiny_job short 2)
# a wrong token, or none: 401, as before users
expect_eq "no token" "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v1/jobs")" 401
expect_eq "wrong token" "$(code_as "wrong$ALICE" GET /v1/jobs)" 401
expect_eq "token_file still the admin" "$(code_as "$(cat "$STATE/token")" GET /v1/jobs)" 200
# over the devices one user may hold: never placeable, refused
out=$(as "$ALICE" -X POST --data-binary "$(tiny_job wide 2 '"devices":2')" "$BASE/v1/jobs")
expect_eq "over user_max_devices" "$(jq -r .error.field <<<"$out")" devices
grep -q 'user_max_devices 1' <<<"$out" || fail "user_max_devices message: $out"

read -r a1 s <<<"$(submit_as "$ALICE" "$LONG")"
expect_eq "alice's first" "$s" running
read -r a2 s <<<"$(submit_as "$ALICE" "$SHORT")"
expect_eq "alice's second waits for her share (a device is free)" "$s" queued
expect_eq "a free device" "$(as "$ROOT" "$BASE/v1/devices" | jq '[.devices[] | select(.job == null)] | length')" 1
# the dry run says so, per owner
plan=$(as "$ALICE" -X POST --data-binary "$SHORT" "$BASE/v1/jobs?dry_run=1")
jq -e '.placement.starts_now == false and .placement.over_user_limit == true' <<<"$plan" >/dev/null ||
    fail "alice's dry run: $plan"
plan=$(as "$BOB" -X POST --data-binary "$SHORT" "$BASE/v1/jobs?dry_run=1")
jq -e '.placement.starts_now == true and .placement.over_user_limit == false' <<<"$plan" >/dev/null ||
    fail "bob's dry run: $plan"
read -r b1 s <<<"$(submit_as "$BOB" "$LONG")"
expect_eq "bob's first starts on the free device" "$s" running
expect_eq "owner in the job view" "$(as "$BOB" "$BASE/v1/jobs/$a1" | jq -r .owner)" alice
# the list is newest first (the job store's pages)
expect_eq "owner in the list" "$(as "$BOB" "$BASE/v1/jobs" | jq -r "[.jobs[] | .owner] | join(\",\")")" bob,alice,alice
ok "limits: alice's second job waits with a device free; bob's runs; owners shown"

# everyone reads everything; only the owner or an admin cancels
expect_eq "bob reads alice's job" "$(code_as "$BOB" GET "/v1/jobs/$a1")" 200
expect_eq "bob reads alice's metrics" "$(code_as "$BOB" GET "/v1/jobs/$a1/metrics")" 200
expect_eq "bob cancels alice's job" "$(code_as "$BOB" DELETE "/v1/jobs/$a1")" 403
jq -e '.error.code == "forbidden" and (.error.message | test("only the job.s owner or an admin may cancel it: job '"$a1"' is alice.s, you are bob \\(role user\\)"))' \
    "$ACC_TMP/body" >/dev/null || fail "403 body: $(cat "$ACC_TMP/body")"
ACCUMD_STATE_DIR=$ACC_TMP "$ACCUMCTL" --url "$BASE" --token "$BOB" cancel "$a2" 2>"$ACC_TMP/err"
expect_eq "accumctl: 403 is exit 3" "$?" 3
grep -q 'HTTP 403 forbidden: only the job' "$ACC_TMP/err" || fail "accumctl 403: $(cat "$ACC_TMP/err")"
expect_eq "still running" "$(as "$ROOT" "$BASE/v1/jobs/$a1" | jq -r .state)" running
expect_eq "alice cancels her running job" "$(code_as "$ALICE" DELETE "/v1/jobs/$a1")" 202
wait_final "$a1"
wait_final "$a2" # her share is back: the queued one runs
expect_eq "alice's second job" "$(as "$ALICE" "$BASE/v1/jobs/$a2" | jq -r .state)" succeeded
expect_eq "the admin cancels bob's job" "$(code_as "$ROOT" DELETE "/v1/jobs/$b1")" 202
wait_final "$b1"
expect_eq "bob's job" "$(as "$ROOT" "$BASE/v1/jobs/$b1" | jq -r .state)" cancelled
ok "cancel: non-owner 403 (rule named), owner 202, admin 202"

# a burst from each user, three submissions in parallel each, alice's
# first (two devices free): never more than one running job per user
for who in ALICE BOB; do
    burst=()
    for i in 1 2 3; do
        as "${!who}" -X POST --data-binary "$(tiny_job "burst-$who-$i" 3)" "$BASE/v1/jobs" >"$ACC_TMP/burst-$who-$i" &
        burst+=($!)
    done
    wait "${burst[@]}"
done
for f in "$ACC_TMP"/burst-*; do
    jq -e '.id' "$f" >/dev/null || fail "burst submission: $(cat "$f")"
    wait_final "$(jq -r .id "$f")"
done
as "$ROOT" "$BASE/v1/jobs" >"$ACC_TMP/all"
for u in alice bob; do
    # this user's runs, by start: each starts after the previous one ended
    jq -r --arg u "$u" '[.jobs[] | select(.owner == $u and .started_at != null)] | sort_by(.started_at) |
        .[] | "\(.started_at) \(.finished_at)"' "$ACC_TMP/all" |
        awk -v u="$u" 'NR > 1 && $1 < prev { print u ": a job started at " $1 " before the one before ended at " prev; bad = 1 }
                       { prev = $2 } END { exit bad }' || fail "user_max_running=1 broken"
    expect_eq "$u's burst succeeded" \
        "$(jq --arg u "$u" '[.jobs[] | select(.owner == $u and (.name | startswith("burst")) and .state == "succeeded")] | length' "$ACC_TMP/all")" 3
done
ok "a burst of 6 from both users: at most one running job per user throughout"

# /metrics by user
as "$ROOT" "$BASE/metrics" >"$ACC_TMP/metrics"
grep -qx 'accumd_user_jobs{user="alice",state="succeeded"} 4' "$ACC_TMP/metrics" || fail "metrics alice: $(grep user_jobs "$ACC_TMP/metrics")"
grep -qx 'accumd_user_jobs{user="alice",state="cancelled"} 1' "$ACC_TMP/metrics" || fail "metrics alice cancelled"
grep -qx 'accumd_user_jobs{user="bob",state="cancelled"} 1' "$ACC_TMP/metrics" || fail "metrics bob cancelled"
grep -qx 'accumd_user_jobs{user="bob",state="succeeded"} 3' "$ACC_TMP/metrics" || fail "metrics bob succeeded"
grep -qx 'accumd_user_devices{user="bob"} 0' "$ACC_TMP/metrics" || fail "metrics bob devices"
bash "$(dirname "$0")/prom_check.sh" "$ACC_TMP/metrics" || fail "metrics do not parse"

# the audit log: every submission and cancel, who, what, the result
jq -r '"\(.user) \(.role) \(.action) \(.job) \(.result)"' "$STATE/audit.log" >"$ACC_TMP/audit"
{
    echo "alice user submit $a1 ok"
    echo "alice user submit $a2 ok"
    echo "bob user submit $b1 ok"
    echo "bob user cancel $a1 forbidden"
    echo "bob user cancel $a2 forbidden"
    echo "alice user cancel $a1 ok"
    echo "root admin cancel $b1 ok"
} >"$ACC_TMP/audit-want"
head -7 "$ACC_TMP/audit" | cmp -s - "$ACC_TMP/audit-want" ||
    fail "audit log: $(diff "$ACC_TMP/audit-want" <(head -7 "$ACC_TMP/audit"))"
expect_eq "audit: the burst" "$(tail -n +8 "$ACC_TMP/audit" | grep -c ' submit j[0-9]* ok$')" 6
expect_eq "audit lines" "$(wc -l <"$ACC_TMP/audit")" 13
jq -e 'has("time") and (.time | test("^20[0-9-]+T[0-9:.]+Z$"))' "$STATE/audit.log" >/dev/null || fail "audit time"
expect_eq "audit in the journal" "$(grep -c 'audit: ' "$STATE/daemon.log")" 13
grep -q "audit: bob (user) cancel $a1: forbidden" "$STATE/daemon.log" || fail "journal audit line"
acc_stop
ok "audit log: all 13 actions in state_dir/audit.log and the journal"

# owners survive a restart (status.json); the audit log is appended to
acc_start --set users_file="$USERS" --set require_token=true --set cpu_devices=2 --set cpu_device_memory=256M
expect_eq "owner after a restart" "$(as "$BOB" "$BASE/v1/jobs/$a1" | jq -r .owner)" alice
expect_eq "bob still may not cancel alice's jobs" "$(code_as "$BOB" DELETE "/v1/jobs/$a2")" 403
acc_stop
expect_eq "audit appended after the restart" "$(wc -l <"$STATE/audit.log")" 14
expect_eq "the first 13 unchanged" "$(head -13 "$STATE/audit.log" | jq -r '"\(.user) \(.role) \(.action) \(.job) \(.result)"' | md5sum)" \
    "$(md5sum <"$ACC_TMP/audit")"
ok "owners persist across a restart; the audit log is appended to"

# ---- fair order: one device, a burst of three from each, round robin -------
keep=$STATE
STATE=$ACC_TMP/state2
acc_data
acc_start --set users_file="$USERS" --set cpu_devices=1 --set cpu_device_memory=256M
read -r blocker s <<<"$(submit_as "$ROOT" "$LONG")"
expect_eq "blocker" "$s" running
for who in ALICE ALICE ALICE BOB BOB BOB; do
    read -r id s <<<"$(submit_as "${!who}" "$(tiny_job "fair-$who" 2)")"
    expect_eq "queued behind the blocker" "$s" queued
done
# loopback without a token (require_token off): "anonymous", a plain user
expect_eq "anonymous reads" "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v1/jobs")" 200
expect_eq "anonymous cancels alice's" "$(curl -s -o "$ACC_TMP/body" -w '%{http_code}' -X DELETE "$BASE/v1/jobs/$id")" 403
grep -q 'you are anonymous (role user)' "$ACC_TMP/body" || fail "anonymous 403: $(cat "$ACC_TMP/body")"
expect_eq "a wrong token with a users file, even on loopback" "$(code_as "nope$BOB" GET /v1/jobs)" 401
# a user added while the daemon runs: SIGHUP reads the file again; a bad
# file then keeps the users of before
CAROL=$("$ACCUMCTL" user add carol --users-file "$USERS" 2>/dev/null | head -1)
expect_eq "carol before SIGHUP" "$(code_as "$CAROL" GET /v1/jobs)" 401
kill -HUP "$ACC_PID"
for _ in $(seq 1 100); do
    [ "$(code_as "$CAROL" GET /v1/jobs)" = 200 ] && break
    sleep 0.05
done
expect_eq "carol after SIGHUP" "$(code_as "$CAROL" GET /v1/jobs)" 200
cp "$USERS" "$ACC_TMP/users.good"
echo "dave wizard sha256:00" >>"$USERS"
kill -HUP "$ACC_PID"
for _ in $(seq 1 100); do
    grep -q 'users_file not reloaded' "$STATE/daemon.log" && break
    sleep 0.05
done
grep -q "users_file not reloaded, the users of before stay: .*users:6: role must be admin or user" "$STATE/daemon.log" ||
    fail "bad reload: $(grep auth "$STATE/daemon.log" | tail -2)"
expect_eq "carol after a bad reload" "$(code_as "$CAROL" GET /v1/jobs)" 200
cp "$ACC_TMP/users.good" "$USERS"
expect_eq "the admin cancels the blocker" "$(code_as "$ROOT" DELETE "/v1/jobs/$blocker")" 202
for j in $(as "$ROOT" "$BASE/v1/jobs" | jq -r '.jobs[] | select(.name | startswith("fair")) | .id'); do
    wait_final "$j"
done
order=$(as "$ROOT" "$BASE/v1/jobs" | jq -r '[.jobs[] | select(.name | startswith("fair"))] | sort_by(.started_at) | map(.owner) | join(" ")')
expect_eq "run order" "$order" "alice bob alice bob alice bob"
grep -q "anonymous (user) cancel $id: forbidden" "$STATE/daemon.log" || fail "anonymous cancel not audited"
acc_stop
# the audit log of the first daemon is still whole (append-only)
expect_eq "first audit log kept" "$(wc -l <"$keep/audit.log")" 14
ok "fair order: alice bob alice bob alice bob; anonymous is a plain user; wrong token 401"

# ---- the devices limit under a burst: 3 devices, no running-jobs limit,
# at most 2 devices per user; 1- and 2-device jobs from both users at once.
# From the jobs' start and end times: each user's devices in use never
# exceed 2, all of them never exceed 3, and each user did use 2 at once
# (the limit was reached, not merely never tested)
acc_start --set users_file="$USERS" --set require_token=true --set cpu_devices=3 --set cpu_device_memory=256M \
    --set user_max_running=0 --set user_max_devices=2
burst=()
for who in ALICE BOB; do
    for i in 1 2 3 4; do
        d=$((i % 2 + 1))
        as "${!who}" -X POST --data-binary "$(tiny_job "dev$d-$who-$i" 6 "\"devices\":$d")" \
            "$BASE/v1/jobs" >"$ACC_TMP/devburst-$who-$i" &
        burst+=($!)
    done
done
wait "${burst[@]}"
for f in "$ACC_TMP"/devburst-*; do
    jq -e '.id' "$f" >/dev/null || fail "devices burst submission: $(cat "$f")"
    wait_final "$(jq -r .id "$f")"
done
as "$ROOT" "$BASE/v1/jobs?limit=100" >"$ACC_TMP/devall"
/usr/bin/python3 - "$ACC_TMP/devall" <<'PY' || fail "user_max_devices=2 under a burst"
import json, sys
jobs = [j for j in json.load(open(sys.argv[1]))["jobs"] if j["name"].startswith("dev")]
assert len(jobs) == 8 and all(j["state"] == "succeeded" for j in jobs), [(j["name"], j["state"]) for j in jobs]
# (time, +devices) at a start, (time, -devices) at an end; ends first at a tie
ev = {}
for j in jobs:
    d = int(j["name"][3])
    for key, sign in (("started_at", 1), ("finished_at", -1)):
        ev.setdefault(j["owner"], []).append((j[key], sign, d))
        ev.setdefault("*", []).append((j[key], sign, d))
peak = {}
for who, es in ev.items():
    cur = 0
    for _, sign, d in sorted(es):
        cur += sign * d
        peak[who] = max(peak.get(who, 0), cur)
print("peak devices in use:", peak)
assert peak["alice"] == 2 and peak["bob"] == 2, peak
assert peak["*"] <= 3, peak
PY
acc_stop
ok "a burst of 1- and 2-device jobs from both users: at most 2 devices per user, 3 in all, throughout"

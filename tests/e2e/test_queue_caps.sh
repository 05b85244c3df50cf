#!/bin/bash
# Issue 25, defect 6: caps on queued jobs. With user_max_queued 3 and
# max_queued_jobs 5 (one CPU device, held by a long job of alice's):
#   - alice queues 3 jobs; her 4th is a 429 naming user_max_queued, and no
#     job is created for it (the list is unchanged);
#   - bob queues 2 (5 in all); his 3rd is a 429 naming max_queued_jobs;
#   - once alice cancels one of hers, her next submission is accepted;
#   - dry runs are never capped; the new keys show in --check-config and
#     bad values are refused naming the key.
. "$(dirname "$0")/lib.sh"

USERS=$ACC_TMP/users
"$ACCUMCTL" user add alice --role user --users-file "$USERS" --json >"$ACC_TMP/alice.json" || fail "user add alice"
"$ACCUMCTL" user add bob --role user --users-file "$USERS" --json >"$ACC_TMP/bob.json" || fail "user add bob"
ALICE=$(jq -r .token "$ACC_TMP/alice.json")
BOB=$(jq -r .token "$ACC_TMP/bob.json")

out=$("$ACCUMD" --set user_max_queued=3 --set max_queued_jobs=5 --check-config) || fail "--check-config"
grep -qx 'user_max_queued = 3' <<<"$out" && grep -qx 'max_queued_jobs = 5' <<<"$out" || fail "check-config: $out"
out=$("$ACCUMD" --set user_max_queued=-1 --check-config 2>&1) && fail "user_max_queued=-1 accepted"
grep -q 'user_max_queued' <<<"$out" || fail "user_max_queued=-1: $out"

acc_data
acc_start --set users_file="$USERS" --set user_max_queued=3 --set max_queued_jobs=5

TOKEN=$ALICE
long=$(acc_submit "$(tiny_job long 100000)")
acc_wait_state "$long" running
a=()
for i in 1 2 3; do a+=("$(acc_submit "$(tiny_job "a$i" 5)")"); done
for id in "${a[@]}"; do expect_eq "alice's $id" "$(acc_state "$id")" queued; done
n_before=$(acc_curl "$BASE/v1/jobs?limit=100" | jq '.jobs | length')
out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$(tiny_job a4 5)" "$BASE/v1/jobs")
expect_eq "alice's 4th queued job" "${out##*$'\n'}" 429
echo "${out%$'\n'*}" | jq -e '.error.code == "too_many_requests" and (.error.message | test("user_max_queued 3"))' \
    >/dev/null || fail "the 429 does not name user_max_queued: ${out%$'\n'*}"
expect_eq "jobs after the refused submit" "$(acc_curl "$BASE/v1/jobs?limit=100" | jq '.jobs | length')" "$n_before"
out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$(tiny_job dry 5)" "$BASE/v1/jobs?dry_run=1")
expect_eq "a dry run at the cap" "${out##*$'\n'}" 200

TOKEN=$BOB
b1=$(acc_submit "$(tiny_job b1 5)")
b2=$(acc_submit "$(tiny_job b2 5)")
out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$(tiny_job b3 5)" "$BASE/v1/jobs")
expect_eq "bob's 3rd job with 5 queued in all" "${out##*$'\n'}" 429
echo "${out%$'\n'*}" | jq -e '.error.message | test("max_queued_jobs 5")' >/dev/null ||
    fail "the 429 does not name max_queued_jobs: ${out%$'\n'*}"

TOKEN=$ALICE
code=$(acc_curl -o /dev/null -w '%{http_code}' -X DELETE "$BASE/v1/jobs/${a[0]}")
expect_eq "alice cancels a queued job" "$code" 200
a4=$(acc_submit "$(tiny_job a4 5)")
expect_eq "alice's job after the cancel" "$(acc_state "$a4")" queued
ok "user_max_queued and max_queued_jobs: 429 naming the limit, nothing created; room again after a cancel"

for id in "$long" "${a[@]:1}" "$a4"; do acc_curl -o /dev/null -X DELETE "$BASE/v1/jobs/$id"; done
TOKEN=$BOB
for id in "$b1" "$b2"; do acc_curl -o /dev/null -X DELETE "$BASE/v1/jobs/$id"; done
acc_stop

#!/bin/bash
# Host memory as a planned, reserved, refused resource (config host_memory;
# docs/operations.md, docs/api.md), through the real daemon with a small
# host_memory (1 MiB). A rank's host bytes here are its batch buffers:
# (T + 1) x 4 + (B / w) x T x 12 + 2 T bytes (inputs, targets, weights of the
# largest split, the sample, the mask), so seq_len 256 and B 192 need
# 591,364 bytes (two such jobs: more than 1 MiB) and B 384 1,181,188 (alone
# more than 1 MiB).
#   - a job needing more than host_memory is refused at submit: 400, field
#     host_memory, both numbers in the message;
#   - two jobs whose host bytes together exceed it run one after the other:
#     the second waits (queued, host_memory.waiting with the reason in its
#     view and a log event) while the first runs with its bytes reserved,
#     then runs; their step events carry the reservation and the trainer's
#     host_mem figures, and /metrics the limit and the reservations;
#   - the dry run says what the job reserves; POST /v1/plan shows each row's
#     host bytes by part and, with hardware.host_memory below the job's,
#     marks every row as not fitting with "limit": "host_memory"; a bad
#     hardware.host_memory is a 400 naming it; accumctl plan --host-memory
#     prints the host column.
. "$(dirname "$0")/lib.sh"
command -v jq >/dev/null || { echo "skip: no jq"; exit 77; }

T=256
per_rank() { echo $(( (T + 1) * 4 + $1 * T * 12 + 2 * T )); } # B / w samples a rank
job() { # job NAME B MAX_STEPS
    tiny_job "$1" "$3" | jq -c ".model.seq_len = $T | .train_batch_size = $2 | .train_micro_batch_size_per_gpu = 8"
}
SMALL=$(per_rank 192) BIG=$(per_rank 384)
LIMIT=1048576
[ $((2 * SMALL)) -gt $LIMIT ] && [ "$SMALL" -le $LIMIT ] && [ "$BIG" -gt $LIMIT ] || fail "test sizes: $SMALL $BIG"

acc_data
acc_start --set cpu_devices=2 --set cpu_device_memory=512M --set cpu_threads_per_device=1 --set host_memory=1M

# ---- refused at submit ----------------------------------------------------------
out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$(job big 384 2)" "$BASE/v1/jobs")
expect_eq "a job needing more host memory than there is" "${out##*$'\n'}" 400
body=${out%$'\n'*}
expect_eq "its field" "$(echo "$body" | jq -r .error.field)" host_memory
msg=$(echo "$body" | jq -r .error.message)
echo "$msg" | grep -q "needs $BIG bytes of host memory" || fail "message without the job's bytes: $msg"
echo "$msg" | grep -q "$LIMIT bytes of host memory" || fail "message without host_memory's bytes: $msg"
ok "refused: $msg"

# ---- the dry run says what it reserves --------------------------------------------
plan=$(acc_curl -X POST "$BASE/v1/jobs?dry_run=1" --data-binary "$(job one 192 2)")
expect_eq "dry run: job host bytes" "$(echo "$plan" | jq .host_memory.job_bytes)" "$SMALL"
expect_eq "dry run: host_memory" "$(echo "$plan" | jq .host_memory.host_memory_bytes)" "$LIMIT"
expect_eq "dry run: candidates' host bytes" "$(echo "$plan" | jq -c '[.micro_batch_candidates[].host_batch_bytes] | unique')" \
    "$(jq -nc "[$SMALL]")"

# ---- one after the other ----------------------------------------------------------
a=$(acc_submit "$(job first 192 12)") || exit 1
acc_wait_state "$a" running
b=$(acc_submit "$(job second 192 2)") || exit 1
view=$(acc_curl "$BASE/v1/jobs/$b")
expect_eq "second job" "$(echo "$view" | jq -r .state)" queued
expect_eq "it waits for host memory" "$(echo "$view" | jq .host_memory.waiting)" true
echo "$view" | jq -r .host_memory.wait_reason | grep -q "needs $SMALL bytes" || fail "wait reason: $view"
"$ACCUMCTL" --url "$BASE" show "$b" >"$ACC_TMP/show.out" 2>&1
grep -q '^host mem: .*waiting for host memory' "$ACC_TMP/show.out" || fail "accumctl show: $(cat "$ACC_TMP/show.out")"
va=$(acc_curl "$BASE/v1/jobs/$a")
[ "$(echo "$va" | jq -r .state)" = running ] || fail "the first job ended before the check: $va"
expect_eq "first job's reservation" "$(echo "$va" | jq .host_memory.reserved_bytes)" "$SMALL"
curl -s "$BASE/metrics" >"$ACC_TMP/m"
grep -q "^accumd_host_memory_bytes $LIMIT\$" "$ACC_TMP/m" || fail "metrics: host_memory: $(grep host_memory "$ACC_TMP/m")"
grep -q "^accumd_host_memory_reserved_bytes $SMALL\$" "$ACC_TMP/m" || fail "metrics: reserved: $(grep host_memory "$ACC_TMP/m")"
grep -q "^accumd_job_host_memory_reserved_bytes{job=\"$a\"} $SMALL\$" "$ACC_TMP/m" ||
    fail "metrics: the job's reservation: $(grep host_memory "$ACC_TMP/m")"
acc_wait_state "$a" succeeded 120
acc_wait_state "$b" succeeded 120
ta=$(acc_curl "$BASE/v1/jobs/$a" | jq -r .finished_at) tb=$(acc_curl "$BASE/v1/jobs/$b" | jq -r .started_at)
[[ "$tb" > "$ta" || "$tb" = "$ta" ]] || fail "second started $tb before the first finished $ta"
ev=$(acc_curl "$BASE/v1/jobs/$b/events?format=ndjson" -m 2)
echo "$ev" | jq -r 'select(.type == "log") | .message' | grep -q "waiting for host memory" ||
    fail "no waiting log event: $ev"
step=$(acc_curl "$BASE/v1/jobs/$a/events?format=ndjson" -m 2 | jq -c 'select(.type == "step")' | tail -1)
echo "$step" | jq -e ".host_reserved == $SMALL and .host_budget == 0 and .host_in_use == 0 and .host_peak == 0" \
    >/dev/null || fail "step event's host figures: $step"
ok "the second job waited for host memory, then ran (first finished $ta, second started $tb)"

# ---- POST /v1/plan ------------------------------------------------------------------
spec=$(job big 384 2)
post_plan() { acc_curl -w '\n%{http_code}' -X POST --data-binary "$(echo "$spec" | jq -c ".hardware = $1")" "$BASE/v1/plan"; }
out=$(post_plan '{"devices": 1, "device_memory": "8G"}')
expect_eq "plan" "${out##*$'\n'}" 200
ans=${out%$'\n'*}
expect_eq "default host memory: the daemon's" "$(echo "$ans" | jq .hardware.host_memory_bytes)" "$LIMIT"
expect_eq "rows' host bytes" "$(echo "$ans" | jq -c '[.rows[] | .host_bytes - .host_activations_bytes - .host_optimizer_bytes - .host_params_bytes] | unique')" "$(jq -nc "[$BIG]")"
expect_eq "optimizer state only in optimizer-offload rows" \
    "$(echo "$ans" | jq -c '[.rows[] | (.host_optimizer_bytes > 0) == .offload_optimizer] | unique')" "[true]"
expect_eq "host checkpoints only in on+host rows" \
    "$(echo "$ans" | jq -c '[.rows[] | (.host_activations_bytes > 0) == .act_offload] | unique')" "[true]"
expect_eq "rows' batch part" "$(echo "$ans" | jq -c '[.rows[].host_batch_bytes] | unique')" "$(jq -nc "[$BIG]")"
expect_eq "no row fits" "$(echo "$ans" | jq -c '[.rows[] | .fits] | unique')" "[false]"
expect_eq "the limit" "$(echo "$ans" | jq -c '[.rows[].limit] | unique')" '["host_memory"]'
echo "$ans" | jq -r '.rows[0].why_not' | grep -q "host memory" || fail "why_not: $(echo "$ans" | jq .rows[0])"
out=$(post_plan '{"devices": 1, "device_memory": "8G", "host_memory": "2M"}')
ans=${out%$'\n'*}
expect_eq "with 2M of host memory rows fit" "$(echo "$ans" | jq '[.rows[] | select(.fits)] | length > 0')" true
expect_eq "fitting rows have no limit" "$(echo "$ans" | jq -c '[.rows[] | select(.fits) | .limit] | unique')" '[null]'
out=$(post_plan '{"devices": 2, "device_memory": "8G", "host_memory": "1M"}')
ans=${out%$'\n'*}
expect_eq "two ranks: per rank half" "$(echo "$ans" | jq -c '[.rows[] | .host_bytes - .host_activations_bytes - .host_optimizer_bytes - .host_params_bytes] | unique')" "$(jq -nc "[$(per_rank 192)]")"
expect_eq "two ranks: the job's" "$(echo "$ans" | jq -c '[.rows[] | .job_host_bytes - 2 * (.host_activations_bytes + .host_optimizer_bytes + .host_params_bytes)] | unique')" "$(jq -nc "[$((2 * SMALL))]")"
out=$(post_plan '{"host_memory": "lots"}')
expect_eq "bad host_memory" "${out##*$'\n'}" 400
expect_eq "its field" "$(echo "${out%$'\n'*}" | jq -r .error.field)" hardware.host_memory
echo "$spec" >"$ACC_TMP/big.json"
"$ACCUMCTL" --url "$BASE" plan "$ACC_TMP/big.json" --devices 1 --host-memory 1M >"$ACC_TMP/ctl.out" 2>&1
grep -q '^host: *1.0 MiB of host memory' "$ACC_TMP/ctl.out" || fail "accumctl plan host line: $(cat "$ACC_TMP/ctl.out")"
grep -q 'exceeds host memory' "$ACC_TMP/ctl.out" || fail "accumctl plan host column: $(cat "$ACC_TMP/ctl.out")"
"$ACCUMCTL" --url "$BASE" plan "$ACC_TMP/big.json" --devices 1 --host-memory 2M >"$ACC_TMP/ctl.out" 2>&1
grep -v 'on+host' "$ACC_TMP/ctl.out" | grep -v 'opt-offload' | grep -q 'exceeds host memory' && fail "2M: $(cat "$ACC_TMP/ctl.out")"
ok "POST /v1/plan and accumctl plan: host bytes by part, rows past hardware.host_memory"

curl -sf "$BASE/healthz" >/dev/null || fail "daemon down"
acc_stop
ok "done"

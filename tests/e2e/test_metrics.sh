#!/bin/bash
# /metrics is valid Prometheus text (checked by prom_check.sh), carries the
# promised families, and its counters move with a job and with requests.
. "$(dirname "$0")/lib.sh"
check=$(dirname "$0")/prom_check.sh

# the checker itself refuses what a scraper would
printf '# TYPE accumd_x_total counter\naccumd_x_total{a="1} 3\n' >"$ACC_TMP/bad1"
! bash "$check" "$ACC_TMP/bad1" >/dev/null || fail "checker accepted an open label"
printf '# TYPE accumd_x counter\naccumd_x 3\n' >"$ACC_TMP/bad2"
! bash "$check" "$ACC_TMP/bad2" >/dev/null || fail "checker accepted a counter without _total"
printf 'accumd_y 1\n' >"$ACC_TMP/bad3"
! bash "$check" "$ACC_TMP/bad3" >/dev/null || fail "checker accepted a sample without TYPE"

acc_data
acc_start --set cpu_devices=2 --set cpu_device_memory=128M
curl -s -D "$ACC_TMP/h" "$BASE/metrics" >"$ACC_TMP/m0"
grep -qi '^Content-Type: text/plain; version=0.0.4' "$ACC_TMP/h" || fail "content type: $(cat "$ACC_TMP/h")"
bash "$check" "$ACC_TMP/m0" || fail "idle /metrics is not valid exposition"

id=$(acc_submit "$(tiny_job short 5)") || exit 1
acc_wait_state "$id" succeeded
curl -s -o /dev/null "$BASE/v1/nope"
long=$(acc_submit "$(tiny_job 'quote \" back \\ slash' 1000000)") || exit 1
acc_wait_step "$long" 2
curl -s "$BASE/metrics" >"$ACC_TMP/m1"
bash "$check" "$ACC_TMP/m1" || fail "busy /metrics is not valid exposition"
for fam in accumd_jobs accumd_steps_total accumd_tokens_total accumd_job_loss accumd_oom_adjustments_total \
    accumd_device_memory_total_bytes accumd_device_memory_in_use_bytes accumd_device_memory_peak_bytes \
    accumd_http_requests_total; do
    grep -q "^# TYPE $fam " "$ACC_TMP/m1" || fail "family $fam missing"
done
grep -q '^accumd_jobs{state="succeeded"} 1$' "$ACC_TMP/m1" || fail "succeeded count"
grep -q '^accumd_jobs{state="running"} 1$' "$ACC_TMP/m1" || fail "running count"
steps=$(awk '/^accumd_steps_total /{print $2}' "$ACC_TMP/m1")
[ "$steps" -ge 7 ] || fail "steps_total $steps < 7"
tokens=$(awk '/^accumd_tokens_total /{print $2}' "$ACC_TMP/m1")
expect_eq "tokens = steps * B * T" "$tokens" $((steps * 8 * 32))
grep -qF "accumd_job_loss{job=\"$long\",name=\"quote \\\" back \\\\ slash\"}" "$ACC_TMP/m1" ||
    fail "loss of the running job, label escaped: $(grep job_loss "$ACC_TMP/m1")"
grep -q '^accumd_http_requests_total{code="404"} 1$' "$ACC_TMP/m1" || fail "404 counted"
grep -q '^accumd_device_memory_in_use_bytes{device="cpu0",kind="cpu"} [1-9]' "$ACC_TMP/m1" || fail "memory in use"
curl -s -o /dev/null -X DELETE "$BASE/v1/jobs/$long"
acc_wait_state "$long" cancelled
acc_stop
ok "/metrics format and values"

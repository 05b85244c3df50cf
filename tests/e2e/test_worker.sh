#!/bin/bash
# Each job in its own worker process (daemon/worker.c, worker_proto.h):
#  - a worker killed with SIGKILL, one that segfaults, aborts or exits
#    (ACCUMD_TEST_FAULT), one that hangs (heartbeat lost): each job ends
#    failed with the cause and its step within 10 s, the daemon keeps serving,
#    a job running beside them finishes with the losses it has alone, the
#    devices are free again, /metrics counts each failure by cause;
#  - max_restarts: a transient crash resumes from the checkpoint and ends
#    with the losses of an uninterrupted run; a crash at the same step twice
#    fails the job; max_restarts is validated;
#  - no orphan: the daemon killed with -9 takes its worker along
#    (PR_SET_PDEATHSIG), and a restarted daemon kills a worker an earlier one
#    left (state_dir/workers/<job>.pid), never a process that only has its pid.
. "$(dirname "$0")/lib.sh"

export ACCUMD_TEST_FAULT="segv-job:segv:3,hang-job:hang:3,abort-job:abort:2,exit-job:exit:2,flaky:segv:5:1,sticky:segv:5"
ARGS=(--set cpu_devices=4 --set cpu_threads_per_device=1 --set worker_heartbeat_timeout=2)
BUDDY=$(printf '{"name":"buddy","model":{"n_layer":2,"n_head":2,"n_embd":64,"seq_len":64,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":4,"max_steps":600,"seed":3}')
LONG=$(tiny_job victim 100000)

history() { acc_curl "$BASE/v1/jobs/$1/metrics" | jq -c '[.steps[] | [.step, .loss]]'; }
worker_pid() { cat "$STATE/workers/$1.pid" 2>/dev/null; }
error_of() { acc_curl "$BASE/v1/jobs/$1" | jq -r '.error.message // ""'; }
metric() { acc_curl "$BASE/metrics" | awk -v k="$1" '$1 == k {print $2}'; }
devices_free() {
    local busy
    busy=$(acc_curl "$BASE/v1/devices" | jq '[.devices[] | select(.job != null)] | length')
    expect_eq "devices held after $1" "$busy" 0
}
healthy() { curl -sf -o /dev/null "$BASE/healthz" || fail "/healthz does not answer after $1"; }

acc_data
acc_start "${ARGS[@]}"

# ---- the buddy alone: its reference losses
ref=$(acc_submit "$BUDDY") || exit 1
acc_wait_state "$ref" succeeded 300
ref_hist=$(history "$ref")
ok "buddy alone: $(echo "$ref_hist" | jq length) steps"

# ---- faults beside a running buddy: the three dying workers at once, on
# the other devices, so the buddy runs through all of them
buddy=$(acc_submit "$BUDDY") || exit 1
acc_wait_step "$buddy" 1
victim=$(acc_submit "$LONG") || exit 1
segv=$(acc_submit "$(tiny_job segv-job 1000)") || exit 1
hang=$(acc_submit "$(tiny_job hang-job 1000)") || exit 1

# SIGKILL (as the OOM killer does)
acc_wait_step "$victim" 2
pid=$(worker_pid "$victim")
[ -n "$pid" ] || fail "no pid file for the worker of $victim: $(ls "$STATE/workers")"
grep -qz -- '--worker' "/proc/$pid/cmdline" || fail "pid $pid is not a worker: $(tr '\0' ' ' < /proc/$pid/cmdline)"
kill -KILL "$pid"
acc_wait_state "$victim" failed 10
err=$(error_of "$victim")
echo "$err" | grep -q '^worker killed by signal 9 .* at step [0-9]' || fail "SIGKILL error: $err"
[ ! -e "$STATE/workers/$victim.pid" ] || fail "the pid file of $victim stays"
healthy SIGKILL
ok "SIGKILL: $err"

# a segfault at step 3
acc_wait_state "$segv" failed 10
err=$(error_of "$segv")
expect_eq "segfault error" "$err" "worker killed by signal 11 (Segmentation fault) at step 2"
healthy segfault
ok "segfault: $err"

# a hang at step 3: no heartbeat for worker_heartbeat_timeout = 2 s, killed
acc_wait_state "$hang" failed 10
err=$(error_of "$hang")
expect_eq "hang error" "$err" "worker sent no heartbeat for 2 s and was killed at step 2"
healthy hang
ok "hang: $err"
expect_eq "buddy beside the three dying workers" "$(acc_state "$buddy")" running
ok "the buddy ran through all three (at step $(acc_curl "$BASE/v1/jobs/$buddy" | jq .step) of 600)"

acc_wait_state "$buddy" succeeded 300
expect_eq "buddy's losses beside three dying workers" "$(history "$buddy")" "$ref_hist"
devices_free "the faults"
ok "the buddy ended with its losses alone; the devices are free"

# abort and a non-zero exit
ab=$(acc_submit "$(tiny_job abort-job 1000)") || exit 1
ex=$(acc_submit "$(tiny_job exit-job 1000)") || exit 1
acc_wait_state "$ab" failed 10
acc_wait_state "$ex" failed 10
expect_eq "abort error" "$(error_of "$ab")" "worker killed by signal 6 (Aborted) at step 1"
expect_eq "exit error" "$(error_of "$ex")" "worker exited with status 7 without reporting at step 1"
devices_free "abort and exit"
zombies=$(ps --ppid "$ACC_PID" -o stat= | grep -c '^Z' || true)
expect_eq "zombie children of the daemon" "$zombies" 0
expect_eq "signal failures" "$(metric 'accumd_worker_failures_total{cause="signal"}')" 3
expect_eq "heartbeat failures" "$(metric 'accumd_worker_failures_total{cause="heartbeat"}')" 1
expect_eq "exit failures" "$(metric 'accumd_worker_failures_total{cause="exit"}')" 1
ok "abort, exit; /metrics counts 3 signal, 1 heartbeat, 1 exit"

# ---- max_restarts
expect_error POST /v1/jobs "$(tiny_job bad 4 '"max_restarts":-1')" 400 max_restarts
expect_error POST /v1/jobs "$(tiny_job bad 4 '"max_restarts":"2"')" 400 max_restarts
CK='"checkpoint_interval":2,"seed":5,"max_restarts":2'
plain=$(acc_submit "$(tiny_job plain 8 "$CK")") || exit 1
acc_wait_state "$plain" succeeded 60
plain_hist=$(history "$plain")
flaky=$(acc_submit "$(tiny_job flaky 8 "$CK")") || exit 1
acc_wait_state "$flaky" succeeded 60
expect_eq "flaky: losses after a restart" "$(history "$flaky")" "$plain_hist"
expect_eq "flaky: worker_restarts" "$(acc_curl "$BASE/v1/jobs/$flaky" | jq .worker_restarts)" 1
acc_events_text "$flaky" | grep -q 'worker killed by signal 11 (Segmentation fault) at step 4; requeued (restart 1 of 2)' ||
    fail "flaky: no requeue event: $(acc_events_text "$flaky" | grep -i worker)"
acc_events_text "$flaky" | grep -q '"message":"resumed from' || fail "flaky: did not resume from its checkpoint"
ok "a transient crash at step 5 restarted from ckpt 4 with the uninterrupted losses"

sticky=$(acc_submit "$(tiny_job sticky 8 "$CK")") || exit 1
acc_wait_state "$sticky" failed 60
expect_eq "sticky: error" "$(error_of "$sticky")" \
    "worker killed by signal 11 (Segmentation fault) at step 4 (the second time at this step: not restarted)"
expect_eq "sticky: worker_restarts" "$(acc_curl "$BASE/v1/jobs/$sticky" | jq .worker_restarts)" 1
expect_eq "restarts counted" "$(metric accumd_worker_restarts_total)" 2
devices_free "the restarts"
ok "a crash at the same step twice fails the job"

# ---- the daemon dies: its worker goes with it
long=$(acc_submit "$LONG") || exit 1
acc_wait_step "$long" 2
pid=$(worker_pid "$long")
acc_kill9
for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "worker $pid outlived its daemon"
ok "kill -9 of the daemon ends its worker"

# a leftover worker (its daemon gone, it still alive) and a stranger whose
# pid was written in a pid file: only the worker is killed at the next start
mkfifo "$ACC_TMP/channel" # read-write: it opens at once and never gives data
"$ACCUMD" --worker j000777 $$ 3<>"$ACC_TMP/channel" >/dev/null 2>&1 &
left=$!
sleep 600 >/dev/null 2>&1 &
stranger=$!
for i in $(seq 1 50); do grep -qz -- '--worker' "/proc/$left/cmdline" 2>/dev/null && break; sleep 0.1; done
echo "$left" > "$STATE/workers/j000777.pid"
echo "$stranger" > "$STATE/workers/j000778.pid"
acc_start "${ARGS[@]}"
for i in $(seq 1 50); do kill -0 "$left" 2>/dev/null || break; sleep 0.1; done
kill -0 "$left" 2>/dev/null && fail "the leftover worker $left was not killed"
kill -0 "$stranger" 2>/dev/null || fail "a process that only had a pid file's pid was killed"
kill "$stranger"
wait "$left" "$stranger" 2>/dev/null
grep -q 'job j000777: worker .* of an earlier daemon still runs; killing it' "$STATE/daemon.log" || fail "no log of the kill"
acc_wait_state "$long" running 30 # requeued by the restart, resumed in a new worker
acc_wait_step "$long" 3
healthy restart
acc_stop
ok "a restarted daemon kills the leftover worker, not a stranger; the job runs again"

#!/bin/bash
# Issue 25 defect 7: a stopped rank process no longer hangs its job. With
# rank_processes = true and rank_watchdog_min = 5, a 2-device job whose
# second accumd-rank gets SIGSTOP (every other rank then waits in a
# collective, the worker's heartbeats go on): the job leaves "running"
# (failed, max_restarts 0) within 60 s, its error and a log event name the
# rank watchdog, and no rank process of it is left, the stopped one
# included. Before: "running" at the same step for minutes.
. "$(dirname "$0")/../e2e/lib.sh"
RANK_BIN=${1:-}
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
command -v jq >/dev/null || { echo "skip: no jq"; exit 77; }
[ -x "$RANK_BIN" ] || { echo "skip: no accumd-rank (built without Open MPI)"; exit 77; }

# Under mpirun the ranks' leak check is off (tests/mpi/lib_mpi.sh says why)
MPI_ARGS="--allow-run-as-root --oversubscribe -x ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
LONG='{"name":"long","model":{"n_layer":2,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":2,"devices":2,"max_steps":100000,"seed":9}'
ranks_of() { pgrep -f -- "--output $STATE/out/$1" || true; }

acc_data
acc_start --set cpu_devices=2 --set cpu_threads_per_device=1 --set rank_processes=true \
    --set "mpi_args=$MPI_ARGS" --set rank_watchdog_min=5
id=$(acc_submit "$LONG") || exit 1
acc_wait_step "$id" 3
victim=$(ranks_of "$id" | tail -1)
[ -n "$victim" ] || fail "no rank process seen for $id"
kill -STOP "$victim"
trap 'rc=$?; kill -KILL '"$victim"' 2>/dev/null; (exit $rc); acc_cleanup' EXIT
at=$(acc_curl "$BASE/v1/jobs/$id" | jq .step)
acc_wait_state "$id" failed 60
err=$(acc_curl "$BASE/v1/jobs/$id" | jq -r .error.message)
echo "$err" | grep -q "watchdog" || fail "the error does not name the watchdog: $err"
acc_events_text "$id" | jq -r 'select(.type == "log") | .message' | grep -q '^rank watchdog: rank 0 reported nothing for' ||
    fail "no watchdog log event: $(acc_events_text "$id" | tail -3)"
for i in $(seq 1 100); do [ -z "$(ranks_of "$id")" ] && break; sleep 0.1; done
[ -z "$(ranks_of "$id")" ] || fail "rank processes left: $(ranks_of "$id")"
# gone, or a zombie its new parent has yet to reap (it was SIGKILLed)
alive() { local st; st=$(awk '{print $3}' "/proc/$victim/stat" 2>/dev/null); [ -n "$st" ] && [ "$st" != Z ]; }
for i in $(seq 1 100); do alive || break; sleep 0.1; done
alive && fail "the stopped rank $victim is still there: $(cat /proc/$victim/stat 2>/dev/null)"
busy=$(acc_curl "$BASE/v1/devices" | jq '[.devices[] | select(.job != null)] | length')
expect_eq "devices held after the watchdog" "$busy" 0
acc_stop
ok "a stopped rank at step $at: job failed by the watchdog, every rank gone: $err"

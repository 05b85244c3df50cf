#!/bin/bash
# Rank processes through the daemon (issue 13 part 2; docs/multinode.md):
# with rank_processes = true a job's worker runs its ranks as accumd-rank
# processes under mpirun (Open MPI's TCP transport on loopback) and relays
# rank 0's events; the job, driven with curl, gives the per-step losses of
# the same job as rank threads inside the daemon (worker_processes = false).
# "nodes": 2 of 1 device is the same world of 2. Cancel stops every rank;
# a rank killed fails the job and leaves no rank process behind.
# A multi-node job without worker processes is refused naming "nodes".
. "$(dirname "$0")/../e2e/lib.sh"
RANK_BIN=${1:-}
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
command -v jq >/dev/null || { echo "skip: no jq"; exit 77; }
[ -x "$RANK_BIN" ] || { echo "skip: no accumd-rank (built without Open MPI)"; exit 77; }

# Under mpirun the ranks' leak check is off (tests/mpi/lib_mpi.sh says why)
MPI_ARGS="--allow-run-as-root --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
COMMON=(--set cpu_devices=2 --set cpu_threads_per_device=1)
JOB2=$(printf '{"name":"two","model":{"n_layer":2,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":2,"devices":2,"max_steps":6,"seed":9}')
NODES2=$(echo "$JOB2" | jq -c '.devices = 1 | .nodes = 2 | .name = "nodes"')
LONG=$(echo "$JOB2" | jq -c '.max_steps = 100000 | .name = "long"')

history() { acc_curl "$BASE/v1/jobs/$1/metrics" | jq -c '[.steps[] | [.step, .loss]]'; }
ranks_of() { pgrep -f -- "--output $STATE/out/$1" || true; }

# ---- the reference: rank threads inside the daemon
STATE=$ACC_TMP/threads
acc_data
acc_start "${COMMON[@]}" --set worker_processes=false
ref=$(acc_submit "$JOB2") || exit 1
acc_wait_state "$ref" succeeded 120
ref_hist=$(history "$ref")
expect_eq "reference steps" "$(echo "$ref_hist" | jq -c '[.[][0]]')" "[1,2,3,4,5,6]"
expect_error POST /v1/jobs "$NODES2" 400 nodes
acc_stop
ok "threads: $ref_hist"

# ---- the same job as 2 rank processes under mpirun, through the daemon
STATE=$ACC_TMP/ranks
acc_data
acc_start "${COMMON[@]}" --set rank_processes=true --set "mpi_args=$MPI_ARGS"
id=$(acc_submit "$JOB2") || exit 1
acc_wait_state "$id" succeeded 180
expect_eq "2 rank processes: per-step losses" "$(history "$id")" "$ref_hist"
[ -f "$STATE/out/$id/rank-spec.json" ] || fail "no rank-spec.json in the job's output"
acc_curl "$BASE/v1/jobs/$id" | jq -e '.outputs.model != null' >/dev/null || fail "no final model listed"
[ -z "$(ranks_of "$id")" ] || fail "rank processes left: $(ranks_of "$id")"
ok "2 rank processes: the threads' losses"

nid=$(acc_submit "$NODES2") || exit 1
acc_wait_state "$nid" succeeded 180
expect_eq "nodes 2 x 1 device: per-step losses" "$(history "$nid")" "$ref_hist"
ok "nodes: 2 of 1 device: the same losses"

# ---- cancel: every rank stops, none is left
lid=$(acc_submit "$LONG") || exit 1
acc_wait_step "$lid" 2
[ -n "$(ranks_of "$lid")" ] || fail "no rank process seen for $lid"
curl -s -o /dev/null -X DELETE "$BASE/v1/jobs/$lid"
acc_wait_state "$lid" cancelled 30
for i in $(seq 1 100); do [ -z "$(ranks_of "$lid")" ] && break; sleep 0.1; done
[ -z "$(ranks_of "$lid")" ] || fail "rank processes left after cancel: $(ranks_of "$lid")"
busy=$(acc_curl "$BASE/v1/devices" | jq '[.devices[] | select(.job != null)] | length')
expect_eq "devices held after cancel" "$busy" 0
ok "cancel stops every rank process"

# ---- a rank process killed: the job fails (max_restarts 0), no rank is left
kid=$(acc_submit "$LONG") || exit 1
acc_wait_step "$kid" 2
victim=$(ranks_of "$kid" | tail -1)
[ -n "$victim" ] || fail "no rank process seen for $kid"
kill -KILL "$victim"
acc_wait_state "$kid" failed 30
err=$(acc_curl "$BASE/v1/jobs/$kid" | jq -r '.error.message')
expect_eq "killed rank: error" "$err" \
    "worker lost its rank processes (the MPI launcher ended without rank 0's report) at step $(acc_curl "$BASE/v1/jobs/$kid" | jq .step)"
for i in $(seq 1 100); do [ -z "$(ranks_of "$kid")" ] && break; sleep 0.1; done
[ -z "$(ranks_of "$kid")" ] || fail "rank processes left after a rank was killed: $(ranks_of "$kid")"
expect_eq "exit failures" "$(acc_curl "$BASE/metrics" | awk '$1 == "accumd_worker_failures_total{cause=\"exit\"}" {print $2}')" 1
acc_stop
ok "a killed rank process fails the job: $err"

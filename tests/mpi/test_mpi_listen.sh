#!/bin/bash
# Issue 25 defect 8: a single-node rank-process job listens on no
# interface of the host. With rank_processes = true and mpi_args that say
# nothing about the network, while a 2-device job trains, `ss -ltnp`
# shows no listening socket of mpirun or accumd-rank on any address but
# loopback (before: accumd-rank on 0.0.0.0 and [::], mpirun on *). The
# ranks run in a network namespace of their own (checked through
# /proc/PID/ns/net) where the host can be root; the job then trains to its
# end and no rank is left.
. "$(dirname "$0")/../e2e/lib.sh"
RANK_BIN=${1:-}
command -v mpirun >/dev/null || { echo "skip: no mpirun"; exit 77; }
command -v jq >/dev/null || { echo "skip: no jq"; exit 77; }
command -v ss >/dev/null || { echo "skip: no ss"; exit 77; }
[ -x "$RANK_BIN" ] || { echo "skip: no accumd-rank (built without Open MPI)"; exit 77; }

MPI_ARGS="--allow-run-as-root --oversubscribe -x ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
JOB='{"name":"listen","model":{"n_layer":2,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"gpl.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":2,"devices":2,"max_steps":400,"seed":9}'
ranks_of() { pgrep -f -- "--output $STATE/out/$1" || true; }
launchers() { pgrep -x mpirun || true; }

acc_data
acc_start --set cpu_devices=2 --set cpu_threads_per_device=1 --set rank_processes=true --set "mpi_args=$MPI_ARGS"
id=$(acc_submit "$JOB") || exit 1
acc_wait_step "$id" 2
pids=$(ranks_of "$id")
[ -n "$pids" ] || fail "no rank process seen for $id"
# every listening TCP socket of mpirun / accumd-rank, and the ones not on loopback
all=$(ss -ltnpH 2>/dev/null | grep -E '"(mpirun|accumd-rank)"' || true)
bad=$(echo "$all" | awk 'NF && $4 !~ /^(127\.[0-9.]+|\[::1\]):[0-9]+$/' || true)
[ -z "$bad" ] || fail "non-loopback listeners of the job's MPI processes: $bad"
rank=$(echo "$pids" | tail -1)
if [ "$(readlink /proc/$rank/ns/net)" != "$(readlink /proc/$$/ns/net)" ]; then
    ns="in a network namespace of their own"
else
    ns="in the host's network namespace"
fi
ok "while training: no non-loopback listener of mpirun or accumd-rank; ranks $ns"
acc_wait_state "$id" succeeded 300
for i in $(seq 1 100); do [ -z "$(ranks_of "$id")" ] && break; sleep 0.1; done
[ -z "$(ranks_of "$id")" ] || fail "rank processes left: $(ranks_of "$id")"
acc_stop
ok "the job trained to its end, no rank left"

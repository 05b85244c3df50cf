#!/usr/bin/env bash
# Rank processes that end early (issue 13): cancelling a 2-process job
# (SIGTERM to mpirun, as the daemon's cancel does) stops every rank within
# 5 s; SIGKILL of one rank process fails the job (mpirun exits non-zero)
# and leaves no rank process behind (the process table is checked); a
# failure inside one rank (a cancel of that rank alone) ends the others
# through MPI_Abort instead of leaving them in a collective.
# Usage: test_mpi_faults.sh ACCUMD_RANK_BINARY
RANK_BIN=$1
TEST=mpi_faults
. "$(dirname "$0")/lib_mpi.sh"

LONG=$(spec long 1 1000000)
# start NAME: a long 2-process job in the background; MPI_PID is mpirun's
start() {
    "${MPIRUN[@]}" -np 2 "$RANK_BIN" --events "$TMP/$1.jsonl" "$LONG" 2>"$TMP/$1.err" &
    MPI_PID=$!
    wait_step "$TMP/$1.jsonl" 2 || fail "$1: no step 2 (log: $(tail -3 "$TMP/$1.err"))"
    [ "$(rank_pids | wc -l)" = 2 ] || fail "$1: want 2 rank processes, have $(rank_pids | wc -l)"
}
# rank_pid R: the pid of rank R (Open MPI puts the rank in its environment)
rank_pid() {
    local p
    for p in $(rank_pids); do
        { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
    done
}
# ended NAME: mpirun's status, once it has exited (10 s at most)
ended() {
    local i
    for ((i = 0; i < 100; i++)); do
        kill -0 "$MPI_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$MPI_PID" 2>/dev/null && fail "$1: mpirun still running after 10 s"
    wait "$MPI_PID"
}

start cancel
kill -TERM "$MPI_PID"
wait_gone 5 || fail "cancel: rank processes left after 5 s: $(ps -o pid,args -p "$(rank_pids | tr '\n' ',' | sed 's/,$//')")"
ended cancel && fail "cancel: mpirun exited 0"
ok "cancel (SIGTERM to mpirun) stops both rank processes within 5 s"

start kill
victim=$(rank_pid 1)
[ -n "$victim" ] || fail "kill: no rank 1 found"
kill -9 "$victim"
wait_gone 10 || fail "kill: rank processes left: $(rank_pids)"
ended kill && fail "kill: mpirun exited 0 after a rank was killed"
ok "SIGKILL of rank 1 fails the job, no rank process left"

# rank 0 alone is cancelled: its trainer stops, it writes "done" and
# MPI_Abort ends rank 1, which is waiting for it in the step's reduction
start abort
r0=$(rank_pid 0)
[ -n "$r0" ] || fail "abort: no rank 0 found"
kill -TERM "$r0"
wait_gone 10 || fail "abort: rank processes left: $(rank_pids)"
ended abort && fail "abort: mpirun exited 0"
[ "$(done_field "$TMP/abort.jsonl" status)" = -7 ] || fail "abort: rank 0's done: $(done_field "$TMP/abort.jsonl" message)"
[ "$(done_field "$TMP/abort.jsonl" message)" = cancelled ] || fail "abort: message $(done_field "$TMP/abort.jsonl" message)"
ok "a rank that stops ends the other through MPI_Abort (rank 0 reported: cancelled)"

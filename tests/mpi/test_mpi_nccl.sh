#!/usr/bin/env bash
# GPUs across rank processes (issue 13): 2 rank processes, one GPU each,
# NCCL wired up over MPI (rank 0's unique id broadcast, ncclCommInitRank),
# vs the same job as 2 rank threads over ncclCommInitAll: the same per-step
# losses (two ranks: a + b, the same in any order), one reduction a step.
# Skips (77) without 2 GPUs or without a CUDA build of accumd-rank.
# Usage: test_mpi_nccl.sh ACCUMD_RANK_BINARY
RANK_BIN=$1
TEST=mpi_nccl
. "$(dirname "$0")/lib_mpi.sh"
command -v nvidia-smi >/dev/null || { echo "skip: no nvidia-smi"; exit 77; }
[ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ] || { echo "skip: fewer than 2 GPUs"; exit 77; }
S=$(spec job 1 4)
"$RANK_BIN" --cuda --local 2 --events "$TMP/t.jsonl" "$S" 2>"$TMP/t.err" || {
    grep -q "built without CUDA" "$TMP/t.err" && { echo "skip: accumd-rank without CUDA"; exit 77; }
    fail "2 GPU threads: $(tail -3 "$TMP/t.err")"
}
"${MPIRUN[@]}" -np 2 "$RANK_BIN" --cuda --events "$TMP/p.jsonl" "$S" || fail "mpirun -np 2 --cuda exited $?"
losses "$TMP/t.jsonl" >"$TMP/t.loss"
losses "$TMP/p.jsonl" >"$TMP/p.loss"
[ "$(wc -l <"$TMP/p.loss")" = 4 ] || fail "$(wc -l <"$TMP/p.loss") steps, want 4"
within "$TMP/t.loss" "$TMP/p.loss" 1e-6 || fail "losses: $(paste -d' ' "$TMP/t.loss" "$TMP/p.loss" | tr '\n' ';')"
[ "$(done_field "$TMP/p.jsonl" allreduce_calls)" = 4 ] || fail "reductions: $(done_field "$TMP/p.jsonl" allreduce_calls)"
ok "2 GPU rank processes over NCCL (id over MPI): the threads' losses, 4 reductions"

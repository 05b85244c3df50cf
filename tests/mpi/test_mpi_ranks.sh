#!/usr/bin/env bash
# Rank processes (issue 13): the same job as 2 and as 4 MPI rank processes
# over TCP on loopback gives the threaded run's per-step losses (within
# 1e-6; the reduction is written to give the same bits, checked too) and
# exactly one gradient reduction per optimizer step; an out-of-memory on
# one rank process adapts on all (the losses of the same injection in
# threads, and within 1e-6 of a run started at the adapted split); a rank
# that cannot read the data fails the job with its rank and the path. ZeRO
# stages 1 and 2 as processes give stage 0's losses bit for bit, and a
# ZeRO-2 checkpoint (moments gathered over MPI) is stage 0's file; ZeRO
# stage 3 as processes gives the threads' stage-3 losses bit for bit, in
# fp32 and in bf16 (bf16 working weights, 16-bit all-gathers), and in bf16
# with the optimizer offloaded (the bf16 partition) the same bits again.
# Usage: test_mpi_ranks.sh ACCUMD_RANK_BINARY
RANK_BIN=$1
TEST=mpi_ranks
. "$(dirname "$0")/lib_mpi.sh"

S1=$(spec job 1 4)
for W in 2 4; do
    "$RANK_BIN" --local "$W" --bucket-bytes 4k --events "$TMP/t$W.jsonl" "$S1" || fail "threads $W"
    "${MPIRUN[@]}" -np "$W" "$RANK_BIN" --bucket-bytes 4k --events "$TMP/p$W.jsonl" "$S1" ||
        fail "mpirun -np $W exited $?"
    losses "$TMP/t$W.jsonl" >"$TMP/t$W.loss"
    losses "$TMP/p$W.jsonl" >"$TMP/p$W.loss"
    [ "$(wc -l <"$TMP/p$W.loss")" = 4 ] || fail "$W processes: $(wc -l <"$TMP/p$W.loss") steps, want 4"
    within "$TMP/t$W.loss" "$TMP/p$W.loss" 1e-6 || fail "$W processes: losses differ from threads: $(paste -d' ' "$TMP/t$W.loss" "$TMP/p$W.loss" | tr '\n' ';')"
    cmp -s "$TMP/t$W.loss" "$TMP/p$W.loss" || fail "$W processes: losses not bit-identical to threads"
    [ "$(done_field "$TMP/p$W.jsonl" world)" = "$W" ] || fail "world $(done_field "$TMP/p$W.jsonl" world), want $W"
    # one reduction per optimizer step (buckets of 4 KiB: several starts each)
    [ "$(done_field "$TMP/p$W.jsonl" allreduce_calls)" = 4 ] ||
        fail "$W processes: $(done_field "$TMP/p$W.jsonl" allreduce_calls) reductions for 4 steps"
    [ "$(done_field "$TMP/p$W.jsonl" bucket_calls)" -gt 4 ] || fail "$W processes: the buckets were not exercised"
    [ "$(done_field "$TMP/p$W.jsonl" bucket_calls)" = "$(done_field "$TMP/t$W.jsonl" bucket_calls)" ] ||
        fail "$W processes: bucket starts differ from threads"
    ok "$W rank processes: the threads' losses bit for bit, 4 reductions for 4 steps"
done
# ZeRO (stage 1 and 2) as rank processes: the reduce-scatter (MPI_Alltoallv
# of the shards' parts) and the parameters' all-gather give stage 0's bits
for Z in 1 2; do
    sed 's|"max_steps"|"devices":2,"zero_optimization":{"stage":'$Z'},"max_steps"|' "$S1" >"$TMP/z$Z.json"
    for W in 2 4; do
        "${MPIRUN[@]}" -np "$W" "$RANK_BIN" --bucket-bytes 4k --events "$TMP/z$Z-$W.jsonl" "$TMP/z$Z.json" ||
            fail "ZeRO $Z: mpirun -np $W exited $?"
        losses "$TMP/z$Z-$W.jsonl" >"$TMP/z$Z-$W.loss"
        [ "$(wc -l <"$TMP/z$Z-$W.loss")" = 4 ] || fail "ZeRO $Z, $W processes: $(wc -l <"$TMP/z$Z-$W.loss") steps"
        cmp -s "$TMP/t$W.loss" "$TMP/z$Z-$W.loss" ||
            fail "ZeRO $Z, $W processes: losses differ from stage 0: $(paste -d' ' "$TMP/t$W.loss" "$TMP/z$Z-$W.loss" | tr '\n' ';')"
        [ "$(done_field "$TMP/z$Z-$W.jsonl" allreduce_calls)" = 4 ] ||
            fail "ZeRO $Z, $W processes: $(done_field "$TMP/z$Z-$W.jsonl" allreduce_calls) reductions for 4 steps"
    done
    ok "ZeRO stage $Z as 2 and 4 rank processes: stage 0's losses bit for bit, one reduction per step"
done
# ZeRO stage 3 as rank processes: the blocks' gathers and reduce-scatters
# over MPI give the threads' stage-3 losses bit for bit, and stage 0's
# within 1e-6 (accumulation steps and clipping: another order of fp32 sums)
sed 's|"max_steps"|"devices":2,"zero_optimization":{"stage":3},"max_steps"|' "$S1" >"$TMP/z3.json"
for W in 2 4; do
    "${MPIRUN[@]}" -np "$W" "$RANK_BIN" --bucket-bytes 4k --events "$TMP/z3-$W.jsonl" "$TMP/z3.json" ||
        fail "ZeRO 3: mpirun -np $W exited $?"
    "$RANK_BIN" --local "$W" --bucket-bytes 4k --events "$TMP/z3t-$W.jsonl" "$TMP/z3.json" || fail "ZeRO 3: threads $W"
    losses "$TMP/z3-$W.jsonl" >"$TMP/z3-$W.loss"
    losses "$TMP/z3t-$W.jsonl" >"$TMP/z3t-$W.loss"
    [ "$(wc -l <"$TMP/z3-$W.loss")" = 4 ] || fail "ZeRO 3, $W processes: $(wc -l <"$TMP/z3-$W.loss") steps"
    cmp -s "$TMP/z3t-$W.loss" "$TMP/z3-$W.loss" || fail "ZeRO 3, $W processes: losses differ from threads"
    within "$TMP/t$W.loss" "$TMP/z3-$W.loss" 1e-6 ||
        fail "ZeRO 3, $W processes: beyond 1e-6 of stage 0: $(paste -d' ' "$TMP/t$W.loss" "$TMP/z3-$W.loss" | tr '\n' ';')"
done
ok "ZeRO stage 3 as 2 and 4 rank processes: the threads' losses bit for bit, stage 0's within 1e-6"
# bf16 at stage 3 (bf16 working weights: the blocks' matrices all-gathered
# as 16-bit values, MPI_UINT16_T) as rank processes: the threads' bits
sed 's|"max_steps"|"precision":"bf16","max_steps"|' "$TMP/z3.json" >"$TMP/z3b.json"
for W in 2 4; do
    "${MPIRUN[@]}" -np "$W" "$RANK_BIN" --bucket-bytes 4k --events "$TMP/z3b-$W.jsonl" "$TMP/z3b.json" ||
        fail "ZeRO 3 bf16: mpirun -np $W exited $?"
    "$RANK_BIN" --local "$W" --bucket-bytes 4k --events "$TMP/z3bt-$W.jsonl" "$TMP/z3b.json" ||
        fail "ZeRO 3 bf16: threads $W"
    losses "$TMP/z3b-$W.jsonl" >"$TMP/z3b-$W.loss"
    losses "$TMP/z3bt-$W.jsonl" >"$TMP/z3bt-$W.loss"
    [ "$(wc -l <"$TMP/z3b-$W.loss")" = 4 ] || fail "ZeRO 3 bf16, $W processes: $(wc -l <"$TMP/z3b-$W.loss") steps"
    cmp -s "$TMP/z3bt-$W.loss" "$TMP/z3b-$W.loss" || fail "ZeRO 3 bf16, $W processes: losses differ from threads"
    ! cmp -s "$TMP/z3-$W.loss" "$TMP/z3b-$W.loss" || fail "ZeRO 3 bf16, $W processes: the fp32 run's losses"
done
ok "ZeRO stage 3 in bf16 as 2 and 4 rank processes: the threads' losses bit for bit"
# and with the optimizer offloaded (the bf16 partition: the matrices' slices
# stored in bf16 on the device, the fp32 master in host memory): the same bits
sed 's|"zero_optimization":{"stage":3}|"zero_optimization":{"stage":3,"offload_optimizer":{"device":"cpu"}}|' \
    "$TMP/z3b.json" >"$TMP/z3bo.json"
grep -q offload_optimizer "$TMP/z3bo.json" || fail "ZeRO 3 bf16 offload: the spec was not rewritten"
for W in 2 4; do
    "${MPIRUN[@]}" -np "$W" "$RANK_BIN" --bucket-bytes 4k --events "$TMP/z3bo-$W.jsonl" "$TMP/z3bo.json" ||
        fail "ZeRO 3 bf16 offload: mpirun -np $W exited $?"
    losses "$TMP/z3bo-$W.jsonl" >"$TMP/z3bo-$W.loss"
    [ "$(wc -l <"$TMP/z3bo-$W.loss")" = 4 ] ||
        fail "ZeRO 3 bf16 offload, $W processes: $(wc -l <"$TMP/z3bo-$W.loss") steps"
    cmp -s "$TMP/z3b-$W.loss" "$TMP/z3bo-$W.loss" ||
        fail "ZeRO 3 bf16 offload, $W processes: losses differ from the device optimizer's"
done
ok "ZeRO stage 3 in bf16 with the optimizer offloaded (bf16 partition) as 2 and 4 rank processes: the same bits"

# a ZeRO-2 checkpoint of rank processes holds the whole state (the moments
# gathered over MPI): the file a stage-0 run of threads writes, byte for byte
"${MPIRUN[@]}" -np 2 "$RANK_BIN" --output "$TMP/zck" "$TMP/z2.json" || fail "ZeRO 2 checkpoint run exited $?"
"$RANK_BIN" --local 2 --output "$TMP/tck" "$S1" || fail "threads checkpoint run"
for f in state.safetensors model.safetensors; do
    cmp -s "$TMP/zck/ckpt-00000004/$f" "$TMP/tck/ckpt-00000004/$f" ||
        fail "ZeRO 2 rank processes: ckpt-00000004/$f differs from stage 0's ($(ls "$TMP/zck" "$TMP/tck" | tr '\n' ' '))"
done
ok "a ZeRO-2 checkpoint of 2 rank processes is stage 0's, byte for byte"

# the 2- and 4-rank runs differ in summation order only
within "$TMP/p2.loss" "$TMP/p4.loss" 1e-5 || fail "2 vs 4 ranks beyond 1e-5"

# OOM on rank 1 in step 2 at micro batch 2: every rank moves to 1 x 4
S2=$(spec oom 2 4)
"${MPIRUN[@]}" -np 2 "$RANK_BIN" --inject-oom 1:1:2 --events "$TMP/o.jsonl" "$S2" || fail "oom run exited $?"
"$RANK_BIN" --local 2 --inject-oom 1:1:2 --events "$TMP/ot.jsonl" "$S2" || fail "oom threads"
"${MPIRUN[@]}" -np 2 "$RANK_BIN" --events "$TMP/o1.jsonl" "$S1" || fail "m=1 run exited $?"
adj=$(jq -r 'select(.event == "oom_adjust") | "\(.from_micro)x\(.from_accum)->\(.to_micro)x\(.to_accum) \(.message)"' "$TMP/o.jsonl")
case "$adj" in "2x2->1x4 device cpu1 out of memory in step 2"*) ;; *) fail "oom_adjust: '$adj'" ;; esac
[ "$(jq -r 'select(.event == "step") | .micro_batch' "$TMP/o.jsonl" | tr '\n' ' ')" = "2 1 1 1 " ] ||
    fail "micro batch per step: $(jq -r 'select(.event == "step") | .micro_batch' "$TMP/o.jsonl" | tr '\n' ' ')"
losses "$TMP/o.jsonl" >"$TMP/o.loss"
losses "$TMP/ot.jsonl" >"$TMP/ot.loss"
losses "$TMP/o1.jsonl" >"$TMP/o1.loss"
cmp -s "$TMP/o.loss" "$TMP/ot.loss" || fail "oom: processes and threads differ"
# step 1 ran at m = 2 (another summation order), the rest at the adapted split
within "$TMP/o.loss" "$TMP/o1.loss" 1e-6 || fail "oom: not the losses of a run at 1 x 4: $(paste -d' ' "$TMP/o.loss" "$TMP/o1.loss" | tr '\n' ';')"
ok "an OOM on rank process 1 adapts on both (same losses as the run at the adapted split)"

# rank 1 cannot read the data (its own spec names a path missing on its "host")
sed "s|$TMP/gpl.txt|$TMP/missing.txt|" "$S1" >"$TMP/bad.json"
if "${MPIRUN[@]}" -np 1 "$RANK_BIN" --events "$TMP/b.jsonl" "$S1" : -np 1 "$RANK_BIN" "$TMP/bad.json" 2>"$TMP/b.err"; then
    fail "a rank without its data: mpirun exited 0"
fi
msg=$(done_field "$TMP/b.jsonl" message)
case "$msg" in *"rank 1 on "*"data.train"*"missing.txt"*) ;; *) fail "no data on rank 1: '$msg'" ;; esac
[ "$(jq -r 'select(.event == "step")' "$TMP/b.jsonl" | wc -l)" = 0 ] || fail "steps ran without the data"
wait_gone 5 || fail "rank processes left: $(rank_pids)"
ok "a rank that cannot read the data fails the job at start: $msg"

#!/usr/bin/env bash
# Two rank processes on two "hosts": network namespaces joined by a veth
# pair (10.231.x.1 and .2), mpirun in the first, the second started through
# an rsh agent that enters its namespace, so the ranks talk over a real IP
# link (TCP, no loopback, no shared memory transport). Same losses as the
# threaded run, bit for bit. Skips (77) where namespaces cannot be made
# (not root, no CAP_SYS_ADMIN, no ip).
# Usage: test_mpi_netns.sh ACCUMD_RANK_BINARY
RANK_BIN=$1
TEST=mpi_netns
. "$(dirname "$0")/lib_mpi.sh"
command -v ip >/dev/null || { echo "skip: no ip"; exit 77; }
NA=accumd-mpi-$$-a NB=accumd-mpi-$$-b
NET=10.231.$(( $$ % 200 + 20 ))
ip netns add "$NA" 2>/dev/null || { echo "skip: ip netns add is not allowed here"; exit 77; }
netns_cleanup() { ip netns del "$NA" 2>/dev/null; ip netns del "$NB" 2>/dev/null; cleanup; }
trap netns_cleanup EXIT
ip netns add "$NB" || fail "ip netns add $NB"
ip link add "va$$" type veth peer name "vb$$" || { echo "skip: no veth here"; exit 77; }
ip link set "va$$" netns "$NA" && ip link set "vb$$" netns "$NB" || fail "moving the veth ends"
ip -n "$NA" addr add "$NET.1/24" dev "va$$" && ip -n "$NB" addr add "$NET.2/24" dev "vb$$" || fail "addresses"
for ns in "$NA" "$NB"; do ip -n "$ns" link set lo up; done
ip -n "$NA" link set "va$$" up && ip -n "$NB" link set "vb$$" up || fail "links up"

printf '%s slots=1\n%s slots=1\n' "$NET.1" "$NET.2" >"$TMP/hosts"
S=$(spec job 1 4)
"$RANK_BIN" --local 2 --events "$TMP/t.jsonl" "$S" || fail "threads"
export MPI_NETNS_MAP="$NET.2=$NB" MPI_NETNS_LOG="$TMP/launches"
ip netns exec "$NA" env "$MPI_ASAN" mpirun --allow-run-as-root --hostfile "$TMP/hosts" -np 2 \
    --mca plm_rsh_agent "$(cd "$(dirname "$0")" && pwd)/rsh_netns.sh" \
    --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
    -x ASAN_OPTIONS ${UBSAN_OPTIONS:+-x UBSAN_OPTIONS} \
    "$RANK_BIN" --events "$TMP/p.jsonl" "$S" 2>"$TMP/p.err" || fail "mpirun over the veth exited $?: $(tail -5 "$TMP/p.err")"
grep -qx "$NET.2 $NB" "$TMP/launches" 2>/dev/null || fail "rank 1 was not started in the second namespace"
losses "$TMP/t.jsonl" >"$TMP/t.loss"
losses "$TMP/p.jsonl" >"$TMP/p.loss"
[ "$(wc -l <"$TMP/p.loss")" = 4 ] || fail "$(wc -l <"$TMP/p.loss") steps, want 4"
cmp -s "$TMP/t.loss" "$TMP/p.loss" || fail "losses over the veth differ from threads: $(paste -d' ' "$TMP/t.loss" "$TMP/p.loss" | tr '\n' ';')"
[ "$(done_field "$TMP/p.jsonl" allreduce_calls)" = 4 ] || fail "reductions: $(done_field "$TMP/p.jsonl" allreduce_calls)"
ok "2 rank processes in two network namespaces over a veth pair: the threads' losses, 4 reductions"

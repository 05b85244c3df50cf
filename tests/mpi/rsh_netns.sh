#!/bin/sh
# mpirun's rsh agent for test_mpi_netns.sh: "ssh" to a host of the test's
# hostfile by running the command in that host's network namespace.
# MPI_NETNS_MAP: "ip=namespace ..."; MPI_NETNS_LOG: where launches are noted.
host=$1
shift
for pair in $MPI_NETNS_MAP; do
    [ "${pair%%=*}" = "$host" ] && ns=${pair#*=}
done
[ -n "${ns:-}" ] || { echo "rsh_netns: unknown host $host" >&2; exit 255; }
echo "$host $ns" >>"$MPI_NETNS_LOG"
exec ip netns exec "$ns" sh -c "$*"

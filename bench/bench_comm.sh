#!/usr/bin/env bash
# The reduction's bandwidth (10 MB, 100 MB) and the 6-layer GPT-2's step
# time, 2 rank threads vs 2 MPI rank processes over TCP on loopback.
# Usage: bench/bench_comm.sh BUILD_DIR   (figures: bench/RESULTS.md, "mpi")
set -euo pipefail
B=${1:-build/dev}
M=(mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self
   --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
"$B/bench/bench_comm" --threads 2 10M 100M
"${M[@]}" -np 2 "$B/bench/bench_comm" 10M 100M
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cp /usr/share/common-licenses/GPL-3 "$T/gpl.txt"
printf '{"name":"gpt2-6","model":{"n_layer":6,"n_head":12,"n_embd":768,"seq_len":128,"vocab_size":256},"data":{"train":"%s/gpl.txt"},"train_batch_size":4,"train_micro_batch_size_per_gpu":1,"max_steps":4}' "$T" >"$T/s.json"
"$B/accumd-rank" --local 2 --events "$T/t.jsonl" "$T/s.json"
"${M[@]}" -np 2 "$B/accumd-rank" --events "$T/p.jsonl" "$T/s.json"
for f in t p; do
    # seconds per step = tokens per step / tokens_per_s; steps 2..4 (1 warms up)
    jq -r 'select(.event == "step" and .step > 1) | 4 * 128 / .tokens_per_s' "$T/$f.jsonl" |
        sort -n | awk -v k="$([ $f = t ] && echo threads || echo processes)" \
            '{ v[NR] = $1 } END { printf "6-layer GPT-2, 2 %s: median step %.3f s (%d steps)\n", k, v[int((NR + 1) / 2)], NR }'
done

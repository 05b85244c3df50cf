# Shared by the rank-process tests (tests/mpi/): a tiny job, mpirun over
# Open MPI's TCP transport on loopback, and the process-table checks.
# Sourced with RANK_BIN set (the accumd-rank binary); TMP is made here.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../support/need.sh"
command -v mpirun >/dev/null || need_missing "no mpirun"
command -v jq >/dev/null || need_missing "no jq"
[ -x "${RANK_BIN:-}" ] || { echo "skip: no accumd-rank (built without Open MPI)"; exit 77; }
TMP=$(mktemp -d /tmp/accumd-mpi.XXXXXX)
cleanup() {
    # only what this test started: processes whose arguments hold $TMP
    for p in $(rank_pids) $(jobs -p); do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL($TEST): $*" >&2; exit 1; }
ok() { echo "ok($TEST): $*"; }
cp /usr/share/common-licenses/GPL-3 "$TMP/gpl.txt"
# spec NAME MICRO MAX_STEPS: the tiny GPT-2 of the e2e tests, two layers
spec() {
    printf '{"name":"%s","model":{"n_layer":2,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"%s/gpl.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":%s,"max_steps":%s}' \
        "$1" "$TMP" "$2" "$3" >"$TMP/$1.json"
    echo "$TMP/$1.json"
}
# Under mpirun, the sanitizer build's leak check is off: Open MPI's plugins
# (dlopen'ed, closed at MPI_Finalize) leave allocations LeakSanitizer can
# neither attribute nor suppress. The --local runs keep it (they never
# start MPI), and every other check of ASan and UBSan stays on.
MPI_ASAN="ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
MPIRUN=(env "$MPI_ASAN" mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self
        --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
# losses FILE: the per-step losses of an events file, one a line
losses() { jq -r 'select(.event == "step") | .loss' "$1"; }
done_field() { jq -r "select(.event == \"done\") | .$2" "$1"; }
# within A B TOL: every line of two loss lists within TOL, same length
within() {
    [ "$(wc -l <"$1")" = "$(wc -l <"$2")" ] || return 1
    paste -d' ' "$1" "$2" | awk -v tol="$3" '{ d = $1 - $2; if (d < 0) d = -d; if (d > tol) bad = 1 } END { exit bad }'
}
# rank_pids: this test's rank processes now (named accumd-rank, $TMP in
# their arguments; mpirun itself is not one)
rank_pids() {
    local p
    for p in $(pgrep -x accumd-rank || true); do
        { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -qF "$TMP/" && echo "$p"
    done
    return 0
}
# wait_gone SECONDS: until none of this test's rank processes is left
wait_gone() {
    local i
    for ((i = 0; i < $1 * 10; i++)); do
        [ -z "$(rank_pids)" ] && return 0
        sleep 0.1
    done
    return 1
}
# wait_step FILE STEP: until the events file reports that step (60 s at most)
wait_step() {
    local i
    for ((i = 0; i < 600; i++)); do
        [ -f "$1" ] && [ "$(jq -r 'select(.event == "step") | .step' "$1" 2>/dev/null | tail -1)" -ge "$2" ] 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

#!/bin/bash
# accumctl against the real daemon: every command, its output and its exit
# code; the daemon found from flags, the environment and the state
# directory; --help that matches the man page; logs -f ends with the job;
# submit --wait exits 0 / 1 / 2 for a job that succeeds / fails / is
# cancelled; bash completion completes commands, options and job ids.
. "$(dirname "$0")/lib.sh"
: "${ACCUMCTL:?ACCUMCTL must point at the accumctl binary}"
SRC=${ACCUMD_SRC:-$(dirname "$0")/../..}

# run_ctl WANT_RC ARGS...: run accumctl, stdout to $OUT, stderr to $ERR,
# and check its exit code
OUT=$ACC_TMP/out
ERR=$ACC_TMP/err
run_ctl() {
    local want=$1 rc
    shift
    "$ACCUMCTL" "$@" >"$OUT" 2>"$ERR"
    rc=$?
    [ "$rc" = "$want" ] || fail "accumctl $*: exit $rc, want $want; stdout: $(head -c 600 "$OUT"); stderr: $(cat "$ERR")"
}

# ---- no daemon needed: help, man page, usage errors, connection errors -----
run_ctl 0 --help
for c in submit ls show logs cancel devices plan metrics "user add"; do
    grep -q "^  ${c%% *} " "$OUT" || fail "--help does not list $c: $(cat "$OUT")"
done
# each command's usage line is the man page's synopsis line (troff unescaped)
man=$(sed -e 's/\\-/-/g' -e 's/\\f[BIR]//g' "$SRC/docs/accumctl.1")
for c in submit ls show logs cancel devices plan metrics "user add"; do
    # shellcheck disable=SC2086
    run_ctl 0 $c --help
    line=$(head -1 "$OUT")
    syn=${line#usage: }
    [ "$syn" != "$line" ] || fail "$c --help: no usage line: $line"
    grep -qxF "$syn" <<<"$man" || fail "$c --help: '$syn' is not a SYNOPSIS line of docs/accumctl.1"
    run_ctl 0 help $c
done
run_ctl 64
run_ctl 64 frobnicate
run_ctl 64 show
run_ctl 64 ls --csv
run_ctl 64 submit "$ACC_TMP/no-such-spec.json"
grep -q "no-such-spec.json" "$ERR" || fail "unreadable spec not named: $(cat "$ERR")"
run_ctl 64 show 'j1/../x'
run_ctl 4 --url http://127.0.0.1:1 ls
grep -q "cannot reach accumd" "$ERR" || fail "connection error: $(cat "$ERR")"
ok "help matches the man page; usage errors 64, no daemon 4"

# ---- the daemon: token required, found from the state directory ------------
acc_data
cp "$STATE/data/gpl.txt" "$STATE/data/vanishing.txt"
acc_start --set require_token=true --set cpu_devices=1 --set cpu_device_memory=256M
tiny_job ok 4 >"$ACC_TMP/ok.json"
tiny_job long 100000 >"$ACC_TMP/long.json"
printf '{"name":"vanish","model":{"n_layer":1,"n_head":2,"n_embd":32,"seq_len":32,"vocab_size":256},"data":{"train":"vanishing.txt"},"train_batch_size":8,"train_micro_batch_size_per_gpu":2,"max_steps":3}' \
    >"$ACC_TMP/vanish.json"
TOKEN=$(cat "$STATE/token")
EMPTY=$ACC_TMP/empty-state
mkdir -p "$EMPTY"

# no token: the daemon's 401, exit 3
ACCUMD_STATE_DIR=$EMPTY run_ctl 3 --url "$BASE" ls
grep -q "HTTP 401 unauthorized" "$ERR" || fail "401 not shown: $(cat "$ERR")"
# from the environment
ACCUMD_STATE_DIR=$EMPTY ACCUMD_URL=$BASE ACCUMD_TOKEN=$TOKEN run_ctl 0 ls
# from flags
ACCUMD_STATE_DIR=$EMPTY run_ctl 0 --url "$BASE" --token "$TOKEN" ls
# from the state directory (accumd.addr and token), flag or environment
run_ctl 0 --state-dir "$STATE" ls
head -1 "$OUT" | grep -q '^ID  *NAME  *OWNER  *STATE' || fail "ls header: $(cat "$OUT")"
export ACCUMD_STATE_DIR=$STATE
run_ctl 0 devices
grep -Eq '^0 +cpu0 +cpu +256\.0 MiB' "$OUT" || fail "devices: $(cat "$OUT")"
run_ctl 0 devices --json
expect_eq "devices --json" "$(jq -r '.devices[0].name' "$OUT")" cpu0
ok "address and token from flags, environment, state directory; 401 is exit 3"

# ---- dry run, plan ---------------------------------------------------------
run_ctl 0 submit --dry-run "$ACC_TMP/ok.json"
grep -q '^batch: *B=8  m x a x w = 2x4x1' "$OUT" || fail "dry run batch: $(cat "$OUT")"
grep -q '^placement: *starts now on cpu0' "$OUT" || fail "dry run placement: $(cat "$OUT")"
grep -Eq '^micro_batch +accum_steps +recompute +predicted_peak_bytes +fits$' "$OUT" || fail "candidates: $(cat "$OUT")"
run_ctl 0 submit --dry-run --json "$ACC_TMP/ok.json"
jq -e '.dry_run == true and (.micro_batch_candidates | length) >= 4' "$OUT" >/dev/null || fail "dry run json: $(cat "$OUT")"
expect_eq "nothing queued by dry runs" "$(acc_curl "$BASE/v1/jobs" | jq '.jobs | length')" 0
run_ctl 0 plan "$ACC_TMP/ok.json" --device-memory 24GiB --devices 4
grep -q 'no POST /v1/plan' "$ERR" && fail "plan fell back to the dry run: $(cat "$ERR")"
grep -q '^hardware: *4 x cpu of 24.0 GiB' "$OUT" || fail "plan header: $(cat "$OUT")"
grep -Eq '^full +0 +off +2 \(a = 1\)' "$OUT" || fail "plan table: $(cat "$OUT")"
# the same modes with the optimizer in host memory: the mode's suffix, the host bytes per rank
grep -Eq '^full\+opt-offload +0 +off +2 \(a = 1\) +[0-9.]+ (B|[KMGT]iB) +[0-9.]+ (B|[KMGT]iB)' "$OUT" ||
    fail "plan table, optimizer offload: $(cat "$OUT")"
run_ctl 64 plan "$ACC_TMP/ok.json" --device-memory lots
run_ctl 64 plan "$ACC_TMP/ok.json" --kind tpu
ok "dry run and plan (POST /v1/plan with the hardware)"

# ---- submit --wait: succeeded (0) ------------------------------------------
run_ctl 0 submit --wait "$ACC_TMP/ok.json"
id1=$(head -1 "$OUT" | awk '{print $1}')
[[ $id1 =~ ^j[0-9]{6}$ ]] || fail "submit: first line: $(head -1 "$OUT")"
head -1 "$OUT" | grep -q "(owner admin)" || fail "owner not shown: $(head -1 "$OUT")"
expect_eq "step lines" "$(grep -c '^step ' "$OUT")" 4
tail -1 "$OUT" | grep -q '^done  *succeeded at step 4' || fail "last line: $(tail -1 "$OUT")"
expect_eq "state after --wait" "$(acc_state "$id1")" succeeded
ok "submit --wait: exit 0, $(grep -c '^step ' "$OUT") steps, done"

# ---- submit from stdin, logs -f to the end, logs, show, metrics -------------
"$ACCUMCTL" submit - <"$ACC_TMP/ok.json" >"$OUT" 2>"$ERR" || fail "submit -: $(cat "$ERR")"
id2=$(awk '{print $1}' "$OUT")
[ "$id2" != "$id1" ] || fail "stdin submit: $(cat "$OUT")"
timeout 60 "$ACCUMCTL" logs -f "$id2" >"$ACC_TMP/follow" 2>"$ERR"
rc=$?
expect_eq "logs -f exit" "$rc" 0
tail -1 "$ACC_TMP/follow" | grep -q '^done  *succeeded at step 4' || fail "logs -f end: $(tail -3 "$ACC_TMP/follow")"
expect_eq "logs -f step lines" "$(grep -c '^step ' "$ACC_TMP/follow")" 4
grep -Eq '^step +1  loss [0-9]+\.[0-9]{4}  lr [0-9.]+e-[0-9]+  \|g\| [0-9.]+ +[0-9]+ tok/s  m=2 a=4  peak [0-9.]+ KiB$' \
    "$ACC_TMP/follow" || fail "step line format: $(grep -m1 '^step' "$ACC_TMP/follow")"
grep -q '^checkpoint step 4: ' "$ACC_TMP/follow" || fail "no checkpoint line"
# the same lines without -f once it ended, and one line per event
run_ctl 0 logs "$id2"
cmp -s "$OUT" "$ACC_TMP/follow" || fail "logs differs from logs -f: $(diff "$OUT" "$ACC_TMP/follow")"
expect_eq "one line per event" "$(wc -l <"$OUT")" "$(acc_curl "$BASE/v1/jobs/$id2" | jq .last_event)"
run_ctl 0 logs --json "$id2"
jq -se 'length > 0 and (.[-1].type == "done")' "$OUT" >/dev/null || fail "logs --json: $(tail -1 "$OUT")"

run_ctl 0 show "$id2"
grep -q "^id: *$id2$" "$OUT" || fail "show id: $(cat "$OUT")"
grep -q '^owner: *admin$' "$OUT" || fail "show owner: $(cat "$OUT")"
grep -q '^state: *succeeded$' "$OUT" || fail "show state: $(cat "$OUT")"
grep -q '^step: *4 of 4$' "$OUT" || fail "show step: $(cat "$OUT")"
grep -q '"train_batch_size": 8' "$OUT" || fail "show spec: $(cat "$OUT")"
run_ctl 3 show j999999
grep -q "HTTP 404 not_found: no job 'j999999'" "$ERR" || fail "show unknown: $(cat "$ERR")"

run_ctl 0 metrics --csv "$id2"
expect_eq "csv header" "$(head -1 "$OUT")" "step,time,loss,lr,grad_norm,tokens_per_s,micro_batch,accum_steps,mem_peak_bytes"
expect_eq "csv rows" "$(tail -n +2 "$OUT" | wc -l)" 4
# the CSV's losses are the API's, to the printed precision
acc_curl "$BASE/v1/jobs/$id2/metrics" | jq -r '.steps[] | "\(.step) \(.loss)"' >"$ACC_TMP/api-loss"
tail -n +2 "$OUT" | awk -F, '{print $1, $3}' | paste -d' ' - "$ACC_TMP/api-loss" |
    awk '{ d = $2 - $4; if ($1 != $3 || d > 1e-8 || d < -1e-8) { print "row " NR ": " $0; bad = 1 } } END { exit bad }' ||
    fail "CSV losses differ from /v1/jobs/$id2/metrics"
run_ctl 0 metrics "$id2"
expect_eq "metrics table rows" "$(wc -l <"$OUT")" 5
ok "submit -, logs -f ends with the job, logs, show, metrics --csv"

# ---- ls ---------------------------------------------------------------------
run_ctl 0 ls
for id in "$id1" "$id2"; do
    grep -Eq "^$id +ok +admin +succeeded +4/4 +[0-9.]+ +2x4x1 +cpu0 " "$OUT" || fail "ls row $id: $(cat "$OUT")"
done
run_ctl 0 ls --state succeeded --json
expect_eq "ls --state succeeded" "$(jq '.jobs | length' "$OUT")" 2
run_ctl 0 ls --state queued
expect_eq "ls --state queued: the header only" "$(wc -l <"$OUT")" 1
run_ctl 3 ls --state done
grep -q 'HTTP 400 invalid (state)' "$ERR" || fail "ls --state done: $(cat "$ERR")"
ok "ls, --state, --json"

# ---- cancel; --wait exits 2 for a cancelled job and 1 for a failed one ------
"$ACCUMCTL" submit --wait --quiet "$ACC_TMP/long.json" >"$ACC_TMP/long.out" 2>&1 &
long_pid=$!
for _ in $(seq 1 200); do
    idl=$(acc_curl "$BASE/v1/jobs?state=running" | jq -r '.jobs[0].id // empty')
    [ -n "$idl" ] && break
    sleep 0.05
done
[ -n "$idl" ] || fail "the long job did not start"
# queued behind it: a job whose data vanishes before it runs (fails at run time)
"$ACCUMCTL" submit --wait "$ACC_TMP/vanish.json" >"$ACC_TMP/vanish.out" 2>&1 &
vanish_pid=$!
for _ in $(seq 1 200); do
    idv=$(acc_curl "$BASE/v1/jobs?state=queued" | jq -r '.jobs[0].id // empty')
    [ -n "$idv" ] && break
    sleep 0.05
done
[ -n "$idv" ] || fail "the vanishing job was not queued"
rm "$STATE/data/vanishing.txt"
# and one more, cancelled while queued (200)
run_ctl 0 submit "$ACC_TMP/ok.json"
idq=$(awk '{print $1}' "$OUT")
grep -q "^$idq queued" "$OUT" || fail "third job not queued: $(cat "$OUT")"
run_ctl 0 cancel "$idq"
expect_eq "cancel queued" "$(cat "$OUT")" "$idq cancelled"
run_ctl 3 cancel "$idq"
grep -q 'HTTP 409 conflict' "$ERR" || fail "second cancel: $(cat "$ERR")"
# the running one (202): its --wait exits 2
run_ctl 0 cancel "$idl"
grep -q "^$idl cancel requested" "$OUT" || fail "cancel running: $(cat "$OUT")"
wait "$long_pid"
expect_eq "submit --wait of a cancelled job" "$?" 2
head -1 "$ACC_TMP/long.out" | grep -q "^$idl running" || fail "--quiet: $(cat "$ACC_TMP/long.out")"
expect_eq "--quiet: the id line only" "$(wc -l <"$ACC_TMP/long.out")" 1
wait "$vanish_pid"
expect_eq "submit --wait of a failed job" "$?" 1
# the start opens data under the roots (safepath.h): "cannot resolve" once gone
tail -1 "$ACC_TMP/vanish.out" | grep -Eq '^done +failed at step 0: .*cannot (open|resolve) .*vanishing.txt' ||
    fail "failed job's last line: $(tail -2 "$ACC_TMP/vanish.out")"
run_ctl 1 logs -f "$idv"
run_ctl 2 logs -f "$idl"
ok "cancel (200, 202, 409); --wait exits 2 cancelled, 1 failed; logs -f the same"

# ---- bash completion --------------------------------------------------------
complete_words() {
    COMP_WORDS=("$@")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMPREPLY=()
    _accumctl
    echo "${COMPREPLY[*]}"
}
# shellcheck disable=SC1091
. "$SRC/etc/bash-completion/accumctl"
got=$(complete_words "$ACCUMCTL" "")
for c in submit ls show logs cancel devices plan metrics user; do
    [[ " $got " == *" $c "* ]] || fail "completion of commands lacks $c: $got"
done
expect_eq "complete 'lo'" "$(complete_words "$ACCUMCTL" lo)" logs
expect_eq "complete submit --w" "$(complete_words "$ACCUMCTL" submit --w)" --wait
expect_eq "complete ls --state r" "$(complete_words "$ACCUMCTL" ls --state r)" running
expect_eq "complete show <id>" "$(complete_words "$ACCUMCTL" show "$id1")" "$id1"
ok "bash completion: commands, options, states, job ids"

unset ACCUMD_STATE_DIR
acc_stop

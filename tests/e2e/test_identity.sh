#!/bin/bash
# Issue 16, whose checkpoint is whose and a start that fails (defects 4, 8,
# 18, 19), against the real daemon:
#  - a fresh state_dir over an old output_root: the new job gets an id whose
#    output dir does not exist, and does not resume the old job's checkpoint;
#  - a stranger's checkpoint planted in a job's output dir is passed over
#    (a checkpoint_rejected event names it) and the job resumes its own;
#  - all of a job's checkpoints corrupt: one checkpoint_rejected event each,
#    a log saying so, and the job starts from step 0;
#  - the address file cannot be written (a directory in its place) with a
#    requeued job present: accumd exits 1 with a clear message, no abort,
#    and the job is still there and resumes at the next good start;
#  - checkpoint_keep is enforced at start too, not only at the next save.
. "$(dirname "$0")/lib.sh"

OUT=$ACC_TMP/out
ARGS=(--set output_root="$OUT" --set cpu_devices=1 --set cpu_device_memory=256M --set cpu_threads_per_device=1
      --set checkpoint_keep=2)
# the job's events after seq $2, from the job store (lib.sh acc_db)
events_since() { acc_db "SELECT json FROM events WHERE job = '$1' AND seq > $2 ORDER BY seq"; }
# has_event FILTER: some event of $ev matches the jq FILTER
has_event() { echo "$ev" | jq -s -e "any(.[]; $1)" >/dev/null; }
nevents() { acc_db "SELECT coalesce(max(seq), 0) FROM events WHERE job = '$1'"; }

# ---- an old life of the output root
STATE=$ACC_TMP/s1
acc_data
acc_start "${ARGS[@]}"
old=$(acc_submit "$(tiny_job old 6 '"checkpoint_interval":2,"seed":1')") || exit 1
acc_wait_state "$old" succeeded 60
acc_stop
[ -d "$OUT/$old/ckpt-00000006" ] || fail "no checkpoint of the old job: $(ls "$OUT/$old")"

# ---- defect 8: a fresh state_dir, the same output_root
STATE=$ACC_TMP/s2
acc_data
acc_start "${ARGS[@]}"
B=$(acc_submit "$(tiny_job fresh 1000000 '"checkpoint_interval":2,"seed":2')") || exit 1
[ "$B" != "$old" ] || fail "the fresh job got the old job's id $old (its output dir exists)"
acc_wait_step "$B" 9
events_since "$B" 0 | grep -q "resumed from" && fail "the fresh job resumed a checkpoint: $(events_since "$B" 0 | grep resumed)"
uid=$(acc_db "SELECT uid FROM jobs WHERE id = '$B'")
expect_eq "the stored status names the same uid" "$(acc_db "SELECT status FROM jobs WHERE id = '$B'" | jq -r .uid)" "$uid"
[[ "$uid" =~ ^[0-9a-f]{32}$ ]] || fail "no job uid in the persisted status: $uid"
acc_kill9
ok "a fresh state_dir over an old output_root: new id $B, nothing resumed"

# ---- defect 4: the address file cannot be written, a requeued job present
rm -f "$STATE/accumd.addr"
mkdir "$STATE/accumd.addr"
"$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$STATE" --set devices=cpu "${ARGS[@]}" \
    >"$ACC_TMP/badstart.log" 2>&1
rc=$?
cat "$ACC_TMP/badstart.log" >>"$STATE/daemon.log"
[ $rc -eq 1 ] || fail "a start that cannot write accumd.addr exited $rc (want 1; >128 is a signal): $(tail -5 "$ACC_TMP/badstart.log")"
grep -q "accumd.addr" "$ACC_TMP/badstart.log" || fail "no clear message naming accumd.addr: $(tail -5 "$ACC_TMP/badstart.log")"
grep -q "placed on" "$ACC_TMP/badstart.log" && fail "a trainer started during a start that failed"
acc_check_log
rmdir "$STATE/accumd.addr"
ok "a failed start (accumd.addr) exits 1 cleanly and starts no trainer"

# ---- defect 8 (uid): a stranger's checkpoint planted in the job's own dir
cp -r "$OUT/$old/ckpt-00000006" "$OUT/$B/ckpt-00000900"
n=$(nevents "$B")
acc_start "${ARGS[@]}"
acc_wait_state "$B" running
acc_wait_step "$B" 12
ev=$(events_since "$B" "$n")
has_event '.type == "checkpoint_rejected" and (.path | endswith("ckpt-00000900")) and (.reason | test("another job"))' ||
    fail "no checkpoint_rejected event for the stranger's checkpoint: $(echo "$ev" | head -5)"
has_event ".type == \"log\" and (.message | test(\"resumed from $OUT/$B/ckpt-\"))" ||
    fail "the job did not resume its own checkpoint: $(echo "$ev" | grep resumed)"
echo "$ev" | grep -q 'resumed from.*ckpt-00000900' && fail "the job resumed the stranger's checkpoint"
ok "a stranger's checkpoint is passed over with an event; the job resumes its own"

# ---- defect 18: every checkpoint corrupt
acc_kill9
rm -rf "$OUT/$B/ckpt-00000900"
nck=0
for d in "$OUT/$B"/ckpt-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]; do
    f=$d/model.safetensors
    printf 'XXXX' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 8)) conv=notrunc 2>/dev/null
    nck=$((nck + 1))
done
[ $nck -ge 1 ] || fail "no checkpoint to corrupt"
n=$(nevents "$B")
acc_start "${ARGS[@]}"
acc_wait_state "$B" running
acc_wait_step "$B" 3
ev=$(events_since "$B" "$n")
got=$(echo "$ev" | jq -s '[.[] | select(.type == "checkpoint_rejected")] | length')
expect_eq "checkpoint_rejected events for $nck corrupt checkpoints" "$got" "$nck"
has_event '.type == "checkpoint_rejected" and (.reason | test("checksum"))' ||
    fail "the reason does not say what is wrong: $(echo "$ev" | grep rejected | head -2)"
has_event '.type == "log" and (.message | test("no usable checkpoint.*step 0"))' ||
    fail "no log event saying the job starts from step 0"
first=$(echo "$ev" | jq -s '[.[] | select(.type == "step")][0].step')
expect_eq "first step after the restart" "$first" 1
grep -q "checkpoint .* not used" "$STATE/daemon.log" || fail "rejected checkpoints not in the daemon log"
ok "corrupt checkpoints: one event each, a log line, a restart from step 0"

# ---- defect 19: checkpoint_keep at start (a data file turned FIFO makes the
# restarted job fail before it can save, so only the start can prune)
acc_wait_step "$B" 9
acc_kill9
newest=$(ls -d "$OUT/$B"/ckpt-* | sort | tail -n 1)
for s in 1 3 5; do cp -r "$newest" "$OUT/$B/$(printf 'ckpt-%08d' $s)" 2>/dev/null || true; done
[ "$(ls -d "$OUT/$B"/ckpt-* | wc -l)" -gt 2 ] || fail "setup: not more than checkpoint_keep checkpoints"
mv "$STATE/data/gpl.txt" "$STATE/data/gpl.saved"
mkfifo "$STATE/data/gpl.txt"
acc_start "${ARGS[@]}"
acc_wait_state "$B" failed 60
left=$(ls -d "$OUT/$B"/ckpt-* | wc -l)
[ "$left" -le 2 ] || fail "checkpoint_keep=2 exceeded after the start: $(ls "$OUT/$B")"
acc_curl "$BASE/v1/jobs/$B" | jq -r .error.message | grep -q FIFO || fail "the FIFO is not named in the job error"
acc_stop
ok "checkpoint_keep is enforced at start ($left left)"

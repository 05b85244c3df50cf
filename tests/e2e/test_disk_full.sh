#!/bin/bash
# Issue 25 defect 9: a full disk costs no work. output_root is a 4 MiB
# tmpfs; once a job has written a checkpoint the file system is filled with
# dd. The next checkpoint fails with ENOSPC and the job pauses instead of
# failing: a "paused: ..." log event says why (No space left on device),
# the job stays running at its step, the previous checkpoint is still
# there, whole, and no partial one is left. The filler removed, the job
# says "resumed: ...", writes that checkpoint and goes on past it; then it
# is cancelled. Needs root (mount -t tmpfs); skips (77) otherwise.
. "$(dirname "$0")/lib.sh"
command -v jq >/dev/null || { echo "skip: no jq"; exit 77; }
command -v sqlite3 >/dev/null || { echo "skip: no sqlite3"; exit 77; }
OUT=$ACC_TMP/outfs
mkdir -p "$OUT"
mount -t tmpfs -o size=4m accumd-test "$OUT" 2>/dev/null || { echo "skip: cannot mount a tmpfs here (needs root)"; exit 77; }
trap 'rc=$?; umount -l "$OUT" 2>/dev/null; (exit $rc); acc_cleanup' EXIT

acc_data
acc_start --set cpu_devices=1 --set cpu_threads_per_device=1 --set "output_root=$OUT"
id=$(acc_submit "$(tiny_job disk 1000000 '"checkpoint_interval":20')") || exit 1
ckpts() { find "$OUT/$id" -maxdepth 1 -name 'ckpt-*' -printf '%f\n' 2>/dev/null | sort; }
newest_step() { ckpts | grep -v partial | tail -1 | sed 's/ckpt-0*//'; }
for i in $(seq 1 600); do [ -n "$(ckpts)" ] && break; sleep 0.1; done
[ -n "$(ckpts)" ] || fail "no first checkpoint in 60 s"

# fill the file system: the next checkpoint cannot be written
dd if=/dev/zero of="$OUT/filler" bs=64k 2>/dev/null
events() { acc_events_text "$id"; }
paused() { events | jq -r 'select(.type == "log") | .message' 2>/dev/null | grep '^paused: ' | head -1; }
for i in $(seq 1 600); do [ -n "$(paused)" ] && break; [ "$(acc_state "$id")" = running ] || break; sleep 0.1; done
state=$(acc_state "$id")
expect_eq "state with the disk full" "$state" running
msg=$(paused)
[ -n "$msg" ] || fail "no paused event in 60 s"
echo "$msg" | grep -q 'No space left on device' || fail "the paused event does not say why: $msg"
step0=$(acc_curl "$BASE/v1/jobs/$id" | jq .step)
sleep 3
expect_eq "step while paused" "$(acc_curl "$BASE/v1/jobs/$id" | jq .step)" "$step0"
ckpts | grep -q partial && fail "a partial checkpoint is left: $(ckpts | tr '\n' ' ')"
prev=$(newest_step)
[ -n "$prev" ] || fail "the previous checkpoint is gone"
for f in model.safetensors state.safetensors; do
    [ -s "$OUT/$id/$(printf 'ckpt-%08d' "$prev")/$f" ] || fail "previous checkpoint $prev: no $f"
done
ok "disk full: paused at step $step0, checkpoint $prev kept, no partial one: $msg"

# room again: the checkpoint is written and training goes on
rm -f "$OUT/filler"
resumed() { events | jq -r 'select(.type == "log") | .message' 2>/dev/null | grep '^resumed: ' | head -1; }
for i in $(seq 1 600); do [ -n "$(resumed)" ] && break; sleep 0.1; done
[ -n "$(resumed)" ] || fail "no resumed event within 60 s of the disk having room"
acc_wait_step "$id" $((step0 + 1))
for i in $(seq 1 600); do [ "$(newest_step)" -gt "$step0" ] 2>/dev/null && break; sleep 0.1; done
[ "$(newest_step)" -gt "$step0" ] || fail "no checkpoint past step $step0 after the disk had room: $(ckpts | tr '\n' ' ')"
expect_eq "state after" "$(acc_state "$id")" running
ok "room again: $(resumed); checkpoint $(newest_step) written"

curl -s -o /dev/null -X DELETE "$BASE/v1/jobs/$id"
acc_wait_state "$id" cancelled 60
acc_stop
ok "cancelled; no step lost"

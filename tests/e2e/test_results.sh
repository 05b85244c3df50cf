#!/bin/bash
# Getting results out (issue 23), through the real daemon over HTTP:
#  1. one batch resolver: a triple that does not hold at the world size is
#     the same 400 from submit and from POST /v1/plan (hardware.devices, and
#     the spec's own devices); accumctl plan exits 1 when nothing fits, 0
#     when something does;
#  2. start where it fits: m 128 on a 2 GiB CPU device, which the planner
#     says does not fit; the dry run says so and names the micro batch the
#     daemon will start at (the largest fitting candidate); with oom.adapt
#     the job starts there (no oom_adjust event) with the same per-step
#     losses as a job submitted at that micro batch; POST /v1/plan's
#     summary recommends the same start with the same words;
#  3. cancel keeps the work: a cancelled job (checkpoint_on_cancel, the
#     default) leaves a checkpoint of its last step, and a job resuming
#     from it (resume_from) continues with the losses of an uninterrupted
#     run; with checkpoint_on_cancel false no checkpoint is left;
#  4. evaluation covers the whole validation set by default: val_loss equals
#     PyTorch's loss (tests/support/llama_ref.py) over all 93 validation
#     windows at the job's final weights, with perplexity and the tokens
#     and samples evaluated; eval_batches 1 caps it at B samples (and equals
#     the reference over those);
#  5. each step event counts tokens: loss-carrying and input tokens,
#     tokens/s x step time = tokens, padding fraction, FLOPs a token
#     (6 N + 6 L C T with N the planner's) and the MFU against the
#     configured device_peak_flops;
#  6. outputs: the export of a full fine-tune (output_dir, in the owner's
#     area) loads in PyTorch and gives the job's final val_loss (above),
#     holds config.json, generation_config.json and the tokenizer, never
#     state.safetensors; a LoRA export holds the adapter and the tokenizer;
#     save_total_limit 2 leaves two checkpoints (checkpoint_keep is 5);
#  7. planner output: parameters in K, recomputation suggested only where
#     the start needs it, LoRA rows with the adapters' gradient bytes;
#  8. GET /v1/jobs/{id}/files: another user gets 403, the owner the list
#     of the job's files (checkpoints and the export in the owner's area)
#     with the size and SHA-256 of each file on disk; GET .../files/{path}
#     gives the file byte for byte (403 for bob), a Range exactly the asked
#     bytes (206, Content-Range), 416 past the end, 404 for a planted
#     symlink, 400 for a path with '..'; accumctl pull gives byte-identical
#     files, resumes an interrupted pull with a Range request and refuses a
#     part whose SHA-256 is wrong (fetching the file whole).
. "$(dirname "$0")/lib.sh"

acc_data
# ---- 1. the same 400 from submit and plan -------------------------------------------
acc_start --set cpu_devices=4 --set cpu_device_memory=256M
SPEC1=$(tiny_job bad 2 | jq -c '.train_batch_size = 32 | .train_micro_batch_size_per_gpu = 2 | .gradient_accumulation_steps = 16')
post() { # post PATH BODY: "CODE BODY"
    local out
    out=$(acc_curl -w '\n%{http_code}' -X POST --data-binary "$2" "$BASE$1")
    echo "${out##*$'\n'} ${out%$'\n'*}"
}
sub=$(post /v1/jobs "$(echo "$SPEC1" | jq -c '.devices = 4')")
expect_eq "submit at 4 devices: status" "${sub%% *}" 400
expect_eq "submit: field" "$(echo "${sub#* }" | jq -r .error.field)" train_batch_size
want=$(echo "${sub#* }" | jq -c .error)
expect_eq "submit: message" "$(echo "$want" | jq -r .message)" "train_batch_size 32 != 2 * 16 * 4 (micro * accum * world)"
pl=$(post /v1/plan "$(echo "$SPEC1" | jq -c '.hardware = {"devices": 4}')")
expect_eq "plan at hardware.devices 4: status" "${pl%% *}" 400
expect_eq "plan at hardware.devices 4: the submit's error" "$(echo "${pl#* }" | jq -c .error)" "$want"
pl=$(post /v1/plan "$(echo "$SPEC1" | jq -c '.devices = 4')")
expect_eq "plan of the spec at 4 devices: the submit's error" "$(echo "${pl#* }" | jq -c .error)" "$want"
pl=$(post /v1/plan "$SPEC1") # at 1 device it holds: 32 = 2 x 16 x 1
expect_eq "plan at 1 device" "${pl%% *}" 200
# 7. recomputation is suggested only where the start needs it: m 2 fits as given
expect_eq "plan message" "$(echo "${pl#* }" | jq -r .summary.message)" \
    "the spec runs as given: micro batch 2 x 16 accumulation steps on 1 device(s)"
echo "$SPEC1" >"$ACC_TMP/bad.json"
"$ACCUMCTL" --url "$BASE" plan "$ACC_TMP/bad.json" --devices 4 >"$ACC_TMP/ctl.out" 2>&1
expect_eq "accumctl plan --devices 4: exit (the daemon's 400)" "$?" 3
grep -q 'train_batch_size 32 != 2 \* 16 \* 4' "$ACC_TMP/ctl.out" || fail "accumctl plan: $(cat "$ACC_TMP/ctl.out")"
echo "$SPEC1" | jq -c '.model.vocab_size = 16384' >"$ACC_TMP/wide.json" # over 1 MiB at any split
"$ACCUMCTL" --url "$BASE" plan "$ACC_TMP/wide.json" --device-memory 1M >"$ACC_TMP/ctl.out" 2>&1
expect_eq "accumctl plan, nothing fits 1 MiB: exit" "$?" 1
grep -q '^summary:.*no way to run this spec fits' "$ACC_TMP/ctl.out" || fail "accumctl plan, nothing fits: $(cat "$ACC_TMP/ctl.out")"
"$ACCUMCTL" --url "$BASE" plan "$ACC_TMP/bad.json" >"$ACC_TMP/ctl.out" 2>&1
expect_eq "accumctl plan, fits 256 MiB: exit" "$?" 0
params=$(echo "${pl#* }" | jq .model.params)
grep -q "^model: *gpt2, $(awk "BEGIN { printf \"%.1f\", $params / 1000 }") K parameters" "$ACC_TMP/ctl.out" ||
    fail "accumctl plan: parameters in K ($params): $(head -1 "$ACC_TMP/ctl.out")"
acc_stop
ok "a bad triple: the same 400 from submit and plan ($(echo "$want" | jq -r .message)); accumctl plan exits 1 when nothing fits"

# ---- 2. m 128 on a 2 GiB device starts where it fits --------------------------------
# a model whose activations are mostly its logits (seq_len x vocab_size):
# m 128 predicts about 2.0 GiB, m 64 about 1.0 GiB, at little compute
BIG=$(tiny_job big 2 '"seed":5' | jq -c '.train_batch_size = 128 | .train_micro_batch_size_per_gpu = 128 |
    .model.seq_len = 256 | .model.n_embd = 4 | .model.n_head = 1 | .model.vocab_size = 16384')
acc_start --set cpu_devices=1 --set cpu_device_memory=2G
plan=$(acc_curl -X POST "$BASE/v1/jobs?dry_run=1" --data-binary "$BIG")
echo "$plan" | jq -e '.micro_batch_candidates[] | select(.micro_batch == 128 and .recompute == false) | .fits == false' \
    >/dev/null || fail "fixture: m 128 should not fit 2 GiB: $plan"
fit=$(echo "$plan" | jq '[.micro_batch_candidates[] | select(.fits and .recompute == false) | .micro_batch] | max')
[ "$fit" != null ] && [ "$fit" -ge 2 ] || fail "fixture: no m >= 2 fits 2 GiB: $plan"
expect_eq "dry run: starts at the largest fitting m" "$(echo "$plan" | jq .batch.micro_batch)" "$fit"
note=$(echo "$plan" | jq -r .micro_batch_note)
echo "$note" | grep -q 'train_micro_batch_size_per_gpu 128 does not fit' || fail "dry run note: $note"
echo "$note" | grep -q "starts at micro batch $fit x $((128 / fit)) accumulation steps" || fail "dry run note: $note"
peak=$(echo "$plan" | jq ".micro_batch_candidates[] | select(.micro_batch == $fit and .recompute == false) | .predicted_peak_bytes")
expect_eq "dry run: the peak of the start" "$(echo "$plan" | jq '.predicted_peak_memory_bytes[0]')" "$peak"
# without oom.adapt it could only run out of memory: refused (docs/api.md)
expect_error POST "/v1/jobs?dry_run=1" "$(echo "$BIG" | jq -c '.oom.adapt = false')" 400 train_micro_batch_size_per_gpu
# POST /v1/plan: the same start, and the note as its summary
pl=$(acc_curl -X POST "$BASE/v1/plan" --data-binary "$BIG")
echo "$pl" | jq -e --argjson m "$fit" '.summary.given_micro_batch_fits == false and .summary.fits and
    .summary.recommended.micro_batch == $m and .summary.recommended.mode == "full"' >/dev/null ||
    fail "plan summary: $(echo "$pl" | jq -c .summary)"
expect_eq "plan message = the dry run's note" "$(echo "$pl" | jq -r .summary.message)" "$note"
big=$(acc_submit "$BIG") || exit 1
acc_wait_state "$big" succeeded 300
ref=$(acc_submit "$(echo "$BIG" | jq -c ".train_micro_batch_size_per_gpu = $fit | .name = \"ref\"")") || exit 1
acc_wait_state "$ref" succeeded 300
ev=$(acc_curl "$BASE/v1/jobs/$big/events?format=ndjson" -m 2)
[ -z "$(echo "$ev" | jq -c 'select(.type == "oom_adjust")')" ] || fail "an oom_adjust event: $ev"
echo "$ev" | jq -r 'select(.type == "log") | .message' | grep -q "starts at micro batch $fit" ||
    fail "no log of the start: $(echo "$ev" | jq -c 'select(.type == "log")')"
expect_eq "split of the job" "$(acc_curl "$BASE/v1/jobs/$big" | jq -c '[.batch.micro_batch, .batch.accum_steps]')" \
    "[$fit,$((128 / fit))]"
l_big=$(acc_curl "$BASE/v1/jobs/$big/metrics" | jq -c '[.steps[].loss]')
l_ref=$(acc_curl "$BASE/v1/jobs/$ref/metrics" | jq -c '[.steps[].loss]')
expect_eq "steps" "$(echo "$l_big" | jq length)" 2
expect_eq "losses of m 128 started where it fits and of m $fit" "$l_big" "$l_ref"
n=$(curl -s "$BASE/metrics" | awk '$1 == "accumd_oom_adjustments_total" { print $2 }')
expect_eq "accumd_oom_adjustments_total" "$n" 0
acc_stop
ok "m 128 on 2 GiB started at m $fit (no oom_adjust), losses $l_big"

# ---- 3. cancel keeps the work ---------------------------------------------------------
STEPS=600 # long enough that the cancel lands mid-run on a fast machine
JOB=$(tiny_job keep $STEPS '"seed":7')
acc_start --set cpu_devices=1 --set cpu_device_memory=256M --set cpu_threads_per_device=1
ref=$(acc_submit "$JOB") || exit 1
acc_wait_state "$ref" succeeded 300
ref_hist=$(acc_curl "$BASE/v1/jobs/$ref/metrics" | jq -c '[.steps[] | [.step, .loss]]')
id=$(acc_submit "$JOB") || exit 1
acc_wait_step "$id" 5
acc_curl -X DELETE "$BASE/v1/jobs/$id" >/dev/null
acc_wait_state "$id" cancelled 60
at=$(acc_curl "$BASE/v1/jobs/$id" | jq .step)
[ "$at" -lt "$STEPS" ] || fail "the job ended before the cancel"
ck=$(acc_curl "$BASE/v1/jobs/$id/events?format=ndjson" -m 2 | jq -c 'select(.type == "checkpoint")')
[ -n "$ck" ] || fail "no checkpoint event after the cancel"
expect_eq "the checkpoint's step" "$(echo "$ck" | tail -1 | jq .step)" "$at"
[ -d "$STATE/out/$id/$(printf 'ckpt-%08d' "$at")" ] || fail "no checkpoint directory: $(ls "$STATE/out/$id")"
res=$(acc_submit "$(echo "$JOB" | jq -c --arg r "$STATE/out/$id" '.resume_from = $r | .name = "resumed"')") || exit 1
acc_wait_state "$res" succeeded 300
hist=$(acc_curl "$BASE/v1/jobs/$res/metrics" | jq -c '[.steps[] | [.step, .loss]]')
expect_eq "resumed history: steps $((at + 1))..$STEPS" "$(echo "$hist" | jq -c '[.[][0]]')" "$(seq $((at + 1)) $STEPS | jq -sc .)"
expect_eq "resumed losses = the uninterrupted run's" "$hist" "$(echo "$ref_hist" | jq -c --argjson a "$at" '[.[] | select(.[0] > $a)]')"
# the switch off: nothing is kept
no=$(acc_submit "$(echo "$JOB" | jq -c '.checkpoint_on_cancel = false')") || exit 1
acc_wait_step "$no" 5
acc_curl -X DELETE "$BASE/v1/jobs/$no" >/dev/null
acc_wait_state "$no" cancelled 60
ls -d "$STATE/out/$no"/ckpt-* 2>/dev/null && fail "checkpoint_on_cancel false left a checkpoint"
expect_error POST /v1/jobs "$(echo "$JOB" | jq -c '.checkpoint_on_cancel = 1')" 400 checkpoint_on_cancel
acc_stop
ok "cancelled at step $at with a checkpoint; resume_from continued with the uninterrupted run's losses"

# ---- 4. evaluation over the whole validation set; 5. tokens that count ----------------
# The reference is PyTorch (tests/support/llama_ref.py, written from the
# architecture): the job's final weights (its last checkpoint, float32)
# over every validation sample, each text window of seq_len + 1 bytes.
PY=/usr/bin/python3
SUP="$ACCUMD_SRC/tests/support"
. "$SUP/need.sh"
"$PY" -c 'import torch' 2>/dev/null || need_missing "no torch in $PY"
"$PY" "$SUP/make_tiny_llama.py" "$STATE/data/tiny" --variant big --seed 3 >/dev/null || fail "make_tiny_llama"
head -c 3000 /usr/share/common-licenses/GPL-3 >"$STATE/data/val.txt" # 93 windows of 33 bytes
acc_start --set cpu_devices=1 --set cpu_device_memory=512M --set cpu_threads_per_device=1 --set device_peak_flops=1e12 \
    --set checkpoint_keep=5
EV='{"name":"ev","model":{"from":"tiny","seq_len":32},"data":{"train":"gpl.txt","val":"val.txt","format":"text"},"train_batch_size":4,"max_steps":2,"eval_interval":2,"seed":3}'
full=$(acc_submit "$(echo "$EV" | jq -c '.output_dir = "tiny-ft/v1"')") || exit 1
cap=$(acc_submit "$(echo "$EV" | jq -c '.eval_batches = 1 | .name = "cap" | .max_steps = 4 | .eval_interval = 4 |
    .checkpoint_interval = 1 | .save_total_limit = 2')") || exit 1
acc_wait_state "$full" succeeded 300
acc_wait_state "$cap" succeeded 300
evf=$(acc_curl "$BASE/v1/jobs/$full/events?format=ndjson" -m 2 | jq -c 'select(.type == "eval")' | tail -1)
evc=$(acc_curl "$BASE/v1/jobs/$cap/events?format=ndjson" -m 2 | jq -c 'select(.type == "eval")' | tail -1)
echo "$evf" | jq -e '.step == 2 and .val_samples == 93 and .val_tokens == 93 * 32' >/dev/null ||
    fail "the whole set: $evf"
echo "$evc" | jq -e '.val_samples == 4 and .val_tokens == 4 * 32' >/dev/null || fail "eval_batches 1: $evc"
echo "$evf" | jq -e '((.perplexity - (.val_loss | exp)) | fabs) < 1e-9 * .perplexity' >/dev/null || fail "perplexity: $evf"
# 6. outputs: the export (no optimizer state, the tokenizer files) in the
# owner's area under the spec's output_dir, else in the job's own
model_f=$(acc_curl "$BASE/v1/jobs/$full" | jq -r .outputs.export)
model_c=$(acc_curl "$BASE/v1/jobs/$cap" | jq -r .outputs.export)
expect_eq "output_dir in the owner's area" "$model_f" "$STATE/out/anonymous/tiny-ft/v1"
expect_eq "export without output_dir" "$model_c" "$STATE/out/$cap/export"
for d in "$model_f" "$model_c"; do
    for f in config.json generation_config.json model.safetensors tokenizer.json; do
        [ -f "$d/$f" ] || fail "export $d has no $f: $(ls "$d")"
    done
    [ -e "$d/state.safetensors" ] && fail "export $d holds the optimizer state"
done
expect_eq "save_total_limit 2: checkpoints left" "$(cd "$STATE/out/$cap" && ls -d ckpt-* | tr '\n' ' ')" "ckpt-00000003 ckpt-00000004 "
expect_eq "save_total_limit 2: checkpoints listed" "$(acc_curl "$BASE/v1/jobs/$cap" | jq '.outputs.checkpoints | length')" 2
expect_error POST /v1/jobs "$(echo "$EV" | jq -c '.output_dir = "../x"')" 400 output_dir
expect_error POST /v1/jobs "$(echo "$EV" | jq -c '.output_dir = "/abs"')" 400 output_dir
expect_error POST /v1/jobs "$(echo "$EV" | jq -c '.save_total_limit = 0')" 400 save_total_limit
lo=$(acc_submit "$(echo "$EV" | jq -c '.lora = {"r": 4} | .name = "lora" | .max_steps = 1 | del(.data.val, .eval_interval)')") || exit 1
acc_wait_state "$lo" succeeded 300
lex=$(acc_curl "$BASE/v1/jobs/$lo" | jq -r .outputs.export)
for f in adapter_config.json adapter_model.safetensors tokenizer.json; do
    [ -f "$lex/$f" ] || fail "LoRA export has no $f: $(ls "$lex")"
done
[ -e "$lex/state.safetensors" ] && fail "LoRA export holds the optimizer state"
[ -e "$STATE/out/$lo/ckpt-00000001/state.safetensors" ] || fail "the LoRA checkpoint lost its state"
# 7. LoRA rows: the adapters' gradient buffer (their fp32 gradients and the trainer's 64 slots)
pl=$(acc_curl -X POST "$BASE/v1/plan" --data-binary "$(echo "$EV" | jq -c '.lora = {"r": 4}')")
tp=$(echo "$pl" | jq .lora.trainable_params)
echo "$pl" | jq -e --argjson tp "$tp" '[.rows[] | select(.mode == "lora")] | length > 0 and
    all(.gradients_bytes == 4 * ($tp + 64))' >/dev/null || fail "LoRA rows' gradients ($tp trainable): $(echo "$pl" | jq -c '[.rows[] | select(.mode == "lora") | .gradients_bytes]')"

"$PY" - "$SUP" "$STATE/data/val.txt" "$model_f" "$(echo "$evf" | jq .val_loss)" 93 "$model_c" \
    "$(echo "$evc" | jq .val_loss)" 4 <<'PYEOF' || fail "val_loss differs from the PyTorch reference"
import sys, torch
sys.path.insert(0, sys.argv[1])
from llama_ref import load_params, forward
data = open(sys.argv[2], "rb").read()
T = 32
for d, got, n in ((sys.argv[3], float(sys.argv[4]), int(sys.argv[5])), (sys.argv[6], float(sys.argv[7]), int(sys.argv[8]))):
    cfg, P = load_params(d, True)
    w = torch.tensor([list(data[i * T:i * T + T + 1]) for i in range(n)], dtype=torch.long)
    with torch.no_grad():
        logits = forward(cfg, P, w[:, :T])
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1)).item()
    print(f"{n} samples: job {got:.9f}, PyTorch {ref:.9f} on the export {d}")
    assert abs(got - ref) <= 2e-5 * abs(ref), (d, got, ref)
PYEOF
# every step: loss-carrying and input tokens (text data: all B x seq_len),
# per second of the step, no padding
st=$(acc_curl "$BASE/v1/jobs/$full/events?format=ndjson" -m 2 | jq -c 'select(.type == "step")')
expect_eq "step events" "$(echo "$st" | wc -l)" 2
echo "$st" | jq -e '.loss_tokens == 128 and .input_tokens == 128 and .padding_fraction == 0 and .step_time_s > 0
    and ((.loss_tokens_per_s * .step_time_s - .loss_tokens) | fabs) <= 1e-9 * .loss_tokens
    and ((.input_tokens_per_s * .step_time_s - .input_tokens) | fabs) <= 1e-9 * .input_tokens
    and (.mfu - .flops_per_token * .input_tokens / .step_time_s / 1e12 | fabs) <= 1e-9 * .mfu' >/dev/null ||
    fail "step token rates: $st"
# FLOPs a token: 6 N + 6 L C T (tiny "big": 2 layers of 64 channels), N the planner's count
params=$(acc_curl -X POST "$BASE/v1/plan" --data-binary "$EV" | jq .model.params)
expect_eq "flops_per_token" "$(echo "$st" | head -1 | jq .flops_per_token)" "$(jq -n "6 * $params + 6 * 2 * 64 * 32")"
acc_stop
ok "val_loss over all 93 validation samples = PyTorch's ($(echo "$evf" | jq -c '[.val_loss, .perplexity, .val_tokens]')); eval_batches 1 caps it at 4; token rates $(echo "$st" | head -1 | jq -c '[.loss_tokens_per_s, .padding_fraction]')"

# ---- 8. a job's files: its owner (or an admin) lists them, another user gets 403 --------
USERS=$ACC_TMP/users
"$ACCUMCTL" user add alice --users-file "$USERS" --json >"$ACC_TMP/alice.json" || fail "user add alice"
"$ACCUMCTL" user add bob --users-file "$USERS" --json >"$ACC_TMP/bob.json" || fail "user add bob"
ALICE=$(jq -r .token "$ACC_TMP/alice.json") BOB=$(jq -r .token "$ACC_TMP/bob.json")
acc_start --set cpu_devices=1 --set cpu_device_memory=512M --set users_file="$USERS"
TOKEN=$ALICE
fj=$(acc_submit "$(echo "$EV" | jq -c '.name = "files" | .output_dir = "mine" | del(.data.val, .eval_interval)')") || exit 1
acc_wait_state "$fj" succeeded 300
TOKEN=$BOB
expect_error GET "/v1/jobs/$fj/files" "" 403 ""
TOKEN=$ALICE
ls=$(acc_curl "$BASE/v1/jobs/$fj/files")
echo "$ls" | jq -e --arg j "$fj" '.job == $j and (.files | length) > 0' >/dev/null || fail "files: $ls"
# every file of the checkpoint and of the export in alice's area, with the size and SHA-256 on disk
want=$( (cd "$STATE/out/$fj" && find . -type f | sed 's|^\./||'; cd "$STATE/out/alice/mine" && find . -type f | sed 's|^\./|export/|') | sort)
expect_eq "listed paths" "$(echo "$ls" | jq -r '.files[].path' | sort)" "$want"
while read -r p size sum; do
    case $p in export/*) f=$STATE/out/alice/mine/${p#export/} ;; *) f=$STATE/out/$fj/$p ;; esac
    expect_eq "$p: size" "$size" "$(stat -c %s "$f")"
    expect_eq "$p: sha256" "$sum" "$(sha256sum "$f" | cut -d' ' -f1)"
done < <(echo "$ls" | jq -r '.files[] | "\(.path) \(.size) \(.sha256)"')
echo "$ls" | jq -e '[.files[].path] | any(. == "export/model.safetensors") and
    any(test("^ckpt-[0-9]+/state[.]safetensors$"))' >/dev/null || fail "export or checkpoint state missing: $ls"
echo "$ls" | jq -e '[.files[].path | select(startswith("export/"))] | all(endswith("state.safetensors") | not)' \
    >/dev/null || fail "the export lists optimizer state: $ls"
# downloads: byte-identical, a Range is exactly the asked bytes, 403 for bob
f=$STATE/out/$fj/ckpt-00000002/model.safetensors
size=$(stat -c %s "$f")
TOKEN=$BOB
expect_error GET "/v1/jobs/$fj/files/ckpt-00000002/model.safetensors" "" 403 ""
TOKEN=$ALICE
code=$(acc_curl -o "$ACC_TMP/dl" -w '%{http_code}' "$BASE/v1/jobs/$fj/files/ckpt-00000002/model.safetensors")
expect_eq "download status" "$code" 200
cmp -s "$ACC_TMP/dl" "$f" || fail "the download differs from the file"
code=$(acc_curl -o "$ACC_TMP/dl" -w '%{http_code}' "$BASE/v1/jobs/$fj/files/export/tokenizer.json")
expect_eq "export download status" "$code" 200
cmp -s "$ACC_TMP/dl" "$STATE/out/alice/mine/tokenizer.json" || fail "the export download differs"
for r in "10-99 10 90" "$((size - 16))- $((size - 16)) 16" "-5 $((size - 5)) 5" "0-0 0 1" "100-$((size * 2)) 100 $((size - 100))"; do
    set -- $r
    h=$(acc_curl -D - -o "$ACC_TMP/part" -H "Range: bytes=$1" "$BASE/v1/jobs/$fj/files/ckpt-00000002/model.safetensors" | tr -d '\r')
    echo "$h" | grep -q '^HTTP/1.1 206' || fail "Range $1: $h"
    echo "$h" | grep -qi "^Content-Range: bytes $2-$(($2 + $3 - 1))/$size$" || fail "Range $1: Content-Range: $h"
    cmp -s "$ACC_TMP/part" <(tail -c +$(($2 + 1)) "$f" | head -c "$3") || fail "Range $1: not the asked bytes"
done
expect_eq "Range past the end" "$(acc_curl -o /dev/null -w '%{http_code}' -H "Range: bytes=$size-" "$BASE/v1/jobs/$fj/files/ckpt-00000002/model.safetensors")" 416
expect_eq "two ranges" "$(acc_curl -o /dev/null -w '%{http_code}' -H 'Range: bytes=0-1,4-5' "$BASE/v1/jobs/$fj/files/ckpt-00000002/model.safetensors")" 400
expect_eq "no such file" "$(acc_curl -o /dev/null -w '%{http_code}' "$BASE/v1/jobs/$fj/files/ckpt-00000002/nope")" 404
expect_eq "a path out" "$(acc_curl --path-as-is -o /dev/null -w '%{http_code}' "$BASE/v1/jobs/$fj/files/../$fj/x")" 400
# accumctl pull: byte-identical files; an interrupted pull (a .part holding
# the first bytes of a file) goes on with a Range request (accumctl counts a 206)
"$ACCUMCTL" --url "$BASE" --token "$BOB" pull "$fj" "$ACC_TMP/bobs" >/dev/null 2>&1
expect_eq "accumctl pull by bob: exit (403)" "$?" 3
out=$("$ACCUMCTL" --url "$BASE" --token "$ALICE" pull "$fj" "$ACC_TMP/pulled") || fail "accumctl pull: $out"
echo "$out" | grep -q '0 resumed' || fail "a fresh pull resumed: $out"
n=0
while read -r p; do
    case $p in export/*) src=$STATE/out/alice/mine/${p#export/} ;; *) src=$STATE/out/$fj/$p ;; esac
    cmp -s "$src" "$ACC_TMP/pulled/$p" || fail "pulled $p differs"
    n=$((n + 1))
done < <(echo "$ls" | jq -r '.files[].path')
[ "$n" -gt 3 ] || fail "only $n files pulled"
rm "$ACC_TMP/pulled/ckpt-00000002/model.safetensors"
head -c 1000 "$f" >"$ACC_TMP/pulled/ckpt-00000002/model.safetensors.part"
out=$("$ACCUMCTL" --url "$BASE" --token "$ALICE" pull "$fj" "$ACC_TMP/pulled") || fail "accumctl pull again: $out"
echo "$out" | grep -q '1 resumed' || fail "accumctl pull did not resume: $out"
cmp -s "$f" "$ACC_TMP/pulled/ckpt-00000002/model.safetensors" || fail "the resumed file differs"
[ -e "$ACC_TMP/pulled/ckpt-00000002/model.safetensors.part" ] && fail "a .part left behind"
# a .part with wrong bytes: the SHA-256 check refuses it and the file is fetched whole
rm "$ACC_TMP/pulled/ckpt-00000002/model.safetensors"
head -c 1000 /dev/zero >"$ACC_TMP/pulled/ckpt-00000002/model.safetensors.part"
out=$("$ACCUMCTL" --url "$BASE" --token "$ALICE" pull "$fj" "$ACC_TMP/pulled") || fail "accumctl pull over a bad part: $out"
echo "$out" | grep -q '0 resumed' || fail "a bad part counted as resumed: $out"
cmp -s "$f" "$ACC_TMP/pulled/ckpt-00000002/model.safetensors" || fail "pulled over a bad part: differs"
ln -s /etc/passwd "$STATE/out/$fj/leak"
expect_eq "a symlink planted in the outputs" "$(acc_curl -o /dev/null -w '%{http_code}' "$BASE/v1/jobs/$fj/files/leak")" 404
acc_stop
ok "GET /v1/jobs/{id}/files: 403 for another user; the owner's list matches the files on disk (size, sha256); downloads byte-identical, Range exact (206), 416 past the end"

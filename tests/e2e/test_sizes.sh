#!/bin/bash
# Sizes computed from a spec's numbers never wrap (issue 16, defect 1): a
# job whose activations need more than 2^64 bytes is refused at submit with
# a 400 naming the field -- dry run or not -- instead of being predicted at
# a wrapped small size, marked as fitting, accepted and crashing the
# trainer; the daemon keeps serving, and a sane job still runs.
. "$(dirname "$0")/lib.sh"

acc_data
acc_start --set cpu_devices=1 --set cpu_device_memory=256M

# 256 layers x 65536 channels x 2^16 sequences x 2^20 tokens: about 2^66
# bytes of activations at this micro batch (2^50 at micro batch 1)
huge='{"model":{"n_layer":256,"n_head":256,"n_embd":65536,"seq_len":1048576,"vocab_size":256},
       "data":{"train":"gpl.txt"},"train_batch_size":65536,"train_micro_batch_size_per_gpu":65536}'
expect_error POST /v1/jobs "$huge" 400 train_micro_batch_size_per_gpu
expect_error POST "/v1/jobs?dry_run=1" "$huge" 400 train_micro_batch_size_per_gpu
n=$(acc_curl "$BASE/v1/jobs" | jq 'if type == "array" then length else (.jobs | length) end')
expect_eq "jobs after the refusals" "$n" "0"
ok "a spec needing more than 2^64 bytes is a 400 naming the field"

# "auto" at the same shape: the planner's rows past 2^64 never fit; m = 1
# (2^50 bytes) does not fit 256M either, so the job is refused or fails
# with the numbers -- but the prediction is never a wrapped small number
plan=$(acc_curl -X POST --data-binary "${huge/\"train_micro_batch_size_per_gpu\":65536/\"train_micro_batch_size_per_gpu\":\"auto\"}" "$BASE/v1/jobs?dry_run=1")
fits=$(echo "$plan" | jq '[.micro_batch_candidates[]? | select(.fits)] | length')
expect_eq "fitting candidates of the huge auto job" "$fits" "0"
small=$(echo "$plan" | jq '[.micro_batch_candidates[]? | select(.predicted_peak_bytes < 1099511627776)] | length')
expect_eq "candidates predicted under 1 TiB" "$small" "0"
ok "no candidate of the huge job is predicted small or fitting"

id=$(acc_submit "$(tiny_job sane 2)") || exit 1
acc_wait_state "$id" succeeded
ok "the daemon still runs jobs"
acc_stop

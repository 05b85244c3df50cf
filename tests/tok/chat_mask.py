#!/usr/bin/env python3
"""Checks chat_check's output for one (tokenizer, template):
  - the ids are Hugging Face tokenizers' ids of the rendered text WITHOUT
    special tokens (tok_ref.mjs's "ids"), and BOS appears exactly as often as
    the template wrote it (never a second one from the tokenizer);
  - one run of loss-carrying tokens per assistant turn, holding that turn's
    content and ending with the end-of-turn token; nothing of the system or
    user turns carries loss.
Usage: chat_mask.py CONVS.jsonl OURS.jsonl REF.jsonl NAME EOT BOS [refuse]
  (`refuse`: conversations where an assistant turn precedes a later user
  turn must be refused -- the template rewrites earlier turns)."""
import json
import sys

convs_path, ours_path, ref_path, name, eot, bos = sys.argv[1:7]
refuse_rewrites = len(sys.argv) > 7
convs = [json.loads(l)["messages"] for l in open(convs_path, encoding="utf-8")]
ours = [json.loads(l) for l in open(ours_path, encoding="utf-8")]
refs = iter(json.loads(l) for l in open(ref_path, encoding="utf-8") if l.strip())
bad = []
checked = 0
for i, (msgs, o) in enumerate(zip(convs, ours)):
    roles = [m["role"] for m in msgs]
    rewrites = any(r == "assistant" and "user" in roles[k + 1:] for k, r in enumerate(roles))
    if "error" in o:
        if not (refuse_rewrites and rewrites):
            bad.append(f"conv {i}: refused: {o['error']}")
        elif "messages[" not in o["error"]:
            bad.append(f"conv {i}: refusal does not name the turn: {o['error']}")
        continue
    if refuse_rewrites and rewrites:
        bad.append(f"conv {i}: a rewriting template was not refused")
        continue
    ref = next(refs)
    checked += 1
    if o["ids"] != ref["ids"]:
        bad.append(f"conv {i}: ids differ from Hugging Face's (no special tokens)")
    if bos:
        nb = o["ids"].count(o["bos_id"])
        if nb != o["text"].count(bos):
            bad.append(f"conv {i}: {nb} BOS ids for {o['text'].count(bos)} written by the template")
        if o["ids"][:2] == [o["bos_id"]] * 2:
            bad.append(f"conv {i}: doubled BOS")
    asst = [m["content"] for m in msgs if m["role"] == "assistant"]
    runs = o["runs"]
    if len(runs) != len(asst):
        bad.append(f"conv {i}: {len(runs)} loss runs for {len(asst)} assistant turns: {runs!r}")
        continue
    for k, (run, content) in enumerate(zip(runs, asst)):
        want = content.strip()
        if "</think>" in want:
            want = want.split("</think>")[-1].strip()
        if want not in run or not run.rstrip("\n").endswith(eot):
            bad.append(f"conv {i} turn {k}: loss run {run!r} is not {want!r} + {eot!r}")
        for m in msgs:
            if m["role"] != "assistant" and m["content"].strip() and m["content"].strip() in run:
                bad.append(f"conv {i} turn {k}: {m['role']} text carries loss: {run!r}")
for line in bad[:10]:
    print(f"FAIL {name}: {line}")
print(f"chat_mask {name}: {checked} conversations checked, {len(bad)} problems")
sys.exit(1 if bad or not checked else 0)

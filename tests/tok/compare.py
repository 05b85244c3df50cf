#!/usr/bin/python3
"""Compares tok_dump's output with the reference's, line by line: every id
list equal (with and without special tokens), every decode equal, and
decode(encode(x)) == x for the lines where the tokenizer promises it
(ROUNDTRIP=all, or =nfc: only lines already in NFC; lines holding any of the
comma-separated ROUNDTRIP_SKIP strings are not checked). Exit 1 on any
difference, printing the first few. Usage: compare.py INPUT ACCUMD REF NAME"""
import json, os, sys, unicodedata

inp, ours, ref, name = sys.argv[1:5]
rt = os.environ.get("ROUNDTRIP", "all")
skip = [x for x in os.environ.get("ROUNDTRIP_SKIP", "").split(",") if x]
texts = [json.loads(l)["text"] for l in open(inp, encoding="utf-8")]
a = [json.loads(l) for l in open(ours, encoding="utf-8")]
b = [json.loads(l) for l in open(ref, encoding="utf-8") if l.strip()]
bad = []
if len(a) != len(texts) or len(b) != len(texts):
    print(f"{name}: line counts differ: input {len(texts)}, accumd {len(a)}, reference {len(b)}")
    sys.exit(1)
ntok = nbytes = rtcount = 0
for i, (t, x, y) in enumerate(zip(texts, a, b)):
    ntok += len(y["ids"])
    nbytes += len(t.encode())
    for k in ("ids", "ids_special", "decoded"):
        if x[k] != y[k]:
            bad.append(f"line {i+1} {k}: accumd {str(x[k])[:200]} != reference {str(y[k])[:200]} (text {t[:80]!r})")
    if any(x in t for x in skip):
        continue
    if rt == "all" or (rt == "nfc" and unicodedata.normalize("NFC", t) == t):
        rtcount += 1
        if x["decoded"] != t:
            bad.append(f"line {i+1}: decode(encode(x)) != x: {x['decoded'][:80]!r} vs {t[:80]!r}")
for m in bad[:10]:
    print(f"{name}: {m}")
print(f"{name}: {len(texts)} texts, {nbytes} bytes, {ntok} tokens, {rtcount} round trips checked, {len(bad)} differences")
# the floor: at least 1 MB of text compared (the licence texts come
# from the machine's /usr/share/doc; a thinner machine must not pass quietly)
if nbytes < 1_000_000:
    print(f"{name}: only {nbytes} bytes compared, fewer than 1 MB")
    sys.exit(1)
sys.exit(1 if bad else 0)

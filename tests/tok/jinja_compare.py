#!/usr/bin/env python3
"""Compare accumd's renders with Jinja2's: every output byte-equal; where
Jinja2 raised (raise_exception), accumd must fail too."""
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        return {r["id"]: r for r in map(json.loads, f)}


ours, ref = load(sys.argv[1]), load(sys.argv[2])
bad = 0
for cid, r in ref.items():
    o = ours.get(cid)
    if o is None:
        print(f"FAIL {cid}: missing"); bad += 1; continue
    if "error" in r:
        if "error" not in o:
            print(f"FAIL {cid}: Jinja2 raised {r['error']!r}, accumd rendered {o.get('out')!r}"); bad += 1
        continue
    if o.get("out") != r["out"]:
        print(f"FAIL {cid}:\n  jinja2: {r['out']!r}\n  accumd: {o.get('out', o.get('error'))!r}"); bad += 1
print(f"jinja_ref: {len(ref) - bad}/{len(ref)} cases byte-equal")
sys.exit(1 if bad else 0)

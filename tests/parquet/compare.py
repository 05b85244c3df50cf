"""compare.py [--only COL] EXPECTED.jsonl OURS.jsonl NAME: the rows accumd's
Parquet reader gave (OURS) equal the rows the writer was given (EXPECTED),
row by row, value by value (strings byte for byte, numbers exactly), with
--only the one column. Prints the first difference."""
import json
import sys

args = sys.argv[1:]
only = None
if args[0] == "--only":
    only, args = args[1], args[2:]
exp_path, ours_path, name = args
with open(exp_path, encoding="utf-8") as f:
    exp = [json.loads(l) for l in f if l.strip()]
with open(ours_path, encoding="utf-8") as f:
    ours = [json.loads(l) for l in f if l.strip()]
if only is not None:
    exp = [{only: r[only]} for r in exp]


def same(a, b):
    # exact: bool is not int, 1 and 1.0 are the same number
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


if len(exp) != len(ours):
    print(f"FAIL {name}: {len(ours)} rows read, {len(exp)} written")
    sys.exit(1)
for i, (e, o) in enumerate(zip(exp, ours)):
    if not same(e, o):
        print(f"FAIL {name}: row {i} differs\n  written: {json.dumps(e)[:400]}\n  read:    {json.dumps(o)[:400]}")
        sys.exit(1)
sys.exit(0)

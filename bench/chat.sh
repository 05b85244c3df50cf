#!/usr/bin/env bash
# Chat preparation throughput on one thread: conversations rendered with the
# chat template, tokenized (no special tokens added) and masked (prefix
# renders for train_on "assistant"), by tests/tok/chat_check, on generated
# multi-turn conversations (system + 3 user/assistant pairs of licence
# text). Prints conversations/s and MB/s of rendered text per template.
# Usage: bash bench/chat.sh BUILD_DIR [CONVERSATIONS]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: bench/chat.sh BUILD_DIR [CONVERSATIONS]}
n=${2:-2000}
here=$top/tests/tok
lock_hash=$(sha256sum "$here/package-lock.json" | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/accumd-npm/tok-$lock_hash
[ -f "$cache/.complete" ] || { echo "run the tok_ref test first (npm cache)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work/convs.jsonl" "$n" <<'PY'
import glob, json, sys
words = " ".join(open(p, encoding="utf-8", errors="replace").read() for p in sorted(glob.glob("/usr/share/common-licenses/*"))[:6]).split()
out, n = open(sys.argv[1], "w", encoding="utf-8"), int(sys.argv[2])
k = 0
def chunk(m):
    global k
    k = (k + m) % (len(words) - m)
    return " ".join(words[k:k + m])
for i in range(n):
    msgs = [{"role": "system", "content": chunk(20)}]
    for t in range(3):
        msgs += [{"role": "user", "content": chunk(40)}, {"role": "assistant", "content": chunk(120)}]
    out.write(json.dumps({"messages": msgs}) + "\n")
PY
for spec in "llama3_1 auto" "llama3_1 llama-3" "llama2 mistral"; do
    set -- $spec
    d=$cache/node_modules/@lenml/tokenizer-$1/models
    t0=$(date +%s.%N)
    "$build/tests/chat_check" "$d" "$2" "$work/convs.jsonl" > "$work/out.jsonl"
    t1=$(date +%s.%N)
    /usr/bin/python3 - "$work/out.jsonl" "$t0" "$t1" "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
assert all("text" in r for r in rows)
mb = sum(len(r["text"].encode()) for r in rows) / 1e6
dt = float(sys.argv[3]) - float(sys.argv[2])
print(json.dumps({"tokenizer": sys.argv[4], "template": sys.argv[5], "conversations": len(rows),
                  "seconds": round(dt, 2), "conv_per_s": round(len(rows) / dt), "MB_per_s": round(mb / dt, 2)}))
PY
done

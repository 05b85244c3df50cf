#!/usr/bin/env python3
"""Write a tiny Hugging Face tokenizer directory with the standard library:
byte-level BPE without merges (ids 0 <s>, 1 </s>, 2..257 the ByteLevel
characters of bytes 0..255: vocabulary 258).

    byte_tokenizer.py DIR [CHAT_TEMPLATE_FILE]

DIR/tokenizer.json and DIR/tokenizer_config.json (DIR is created); the
template file's text, when given, is the config's chat_template."""
import json
import os
import sys

d = sys.argv[1]
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
chars = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {chars[b]: b + 2 for b in range(256)}


def special(i, s):
    return {"id": i, "content": s, "special": True, "single_word": False,
            "lstrip": False, "rstrip": False, "normalized": False}


bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
tok = {"version": "1.0", "added_tokens": [special(0, "<s>"), special(1, "</s>")], "normalizer": None,
       "pre_tokenizer": bl, "decoder": bl, "post_processor": None,
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                 "ignore_merges": False, "vocab": vocab, "merges": []}}
cfg = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False}
if len(sys.argv) > 2:
    cfg["chat_template"] = open(sys.argv[2]).read()
os.makedirs(d)
json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"))

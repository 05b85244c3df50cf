#!/usr/bin/env python3
"""An independent safetensors reader for the tests (standard library only).

Usage: st_read.py FILE [--expect-gpt2 N_LAYER N_EMBD VOCAB SEQ]

Parses the 8-byte header length and the JSON header, checks every tensor's
dtype, shape and byte range (ranges must tile the data exactly), and prints
one line per tensor: name dtype shape sum-of-values. With --expect-gpt2 it
also checks the Hugging Face GPT-2 tensor names and shapes. Exits 1 on any
problem.
"""
import json
import struct
import sys

SIZES = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "U8": 1, "U16": 2}


def die(msg):
    print(f"st_read: {msg}", file=sys.stderr)
    sys.exit(1)


def values(dtype, raw):
    if dtype == "F32":
        return struct.unpack(f"<{len(raw) // 4}f", raw)
    if dtype == "F64":
        return struct.unpack(f"<{len(raw) // 8}d", raw)
    if dtype == "I32":
        return struct.unpack(f"<{len(raw) // 4}i", raw)
    if dtype == "I64":
        return struct.unpack(f"<{len(raw) // 8}q", raw)
    if dtype == "BF16":
        return [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    return list(raw)


def gpt2_shapes(n_layer, c, vocab, seq):
    want = {"wte.weight": [vocab, c], "wpe.weight": [seq, c],
            "ln_f.weight": [c], "ln_f.bias": [c]}
    for i in range(n_layer):
        p = f"h.{i}."
        want.update({
            p + "ln_1.weight": [c], p + "ln_1.bias": [c],
            p + "attn.c_attn.weight": [c, 3 * c], p + "attn.c_attn.bias": [3 * c],
            p + "attn.c_proj.weight": [c, c], p + "attn.c_proj.bias": [c],
            p + "ln_2.weight": [c], p + "ln_2.bias": [c],
            p + "mlp.c_fc.weight": [c, 4 * c], p + "mlp.c_fc.bias": [4 * c],
            p + "mlp.c_proj.weight": [4 * c, c], p + "mlp.c_proj.bias": [c],
        })
    return want


def main():
    if len(sys.argv) < 2:
        die(__doc__)
    blob = open(sys.argv[1], "rb").read()
    if len(blob) < 8:
        die("file shorter than 8 bytes")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if 8 + hlen > len(blob):
        die(f"header length {hlen} past the end of the file")
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = blob[8 + hlen:]
    meta = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in meta.values()):
        die("metadata values must be strings")
    ranges = []
    for name, e in header.items():
        dt, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
        if dt not in SIZES:
            die(f"{name}: unknown dtype {dt}")
        n = 1
        for d in shape:
            if not isinstance(d, int) or d < 0:
                die(f"{name}: bad shape {shape}")
            n *= d
        if end - b != n * SIZES[dt] or b < 0 or end > len(data):
            die(f"{name}: byte range [{b}, {end}) does not fit shape {shape} {dt}")
        ranges.append((b, end, name))
        vals = values(dt, data[b:end])
        print(f"{name} {dt} {shape} {sum(vals):.9g}")
    ranges.sort()
    pos = 0
    for b, end, name in ranges:
        if b != pos:
            die(f"{name}: ranges overlap or leave a gap at {pos}")
        pos = end
    if pos != len(data):
        die(f"{len(data) - pos} bytes after the last tensor")
    for k, v in sorted(meta.items()):
        print(f"meta {k}={v}")
    if "--expect-gpt2" in sys.argv:
        i = sys.argv.index("--expect-gpt2")
        nl, c, vocab, seq = (int(x) for x in sys.argv[i + 1:i + 5])
        for name, shape in gpt2_shapes(nl, c, vocab, seq).items():
            if name not in header:
                die(f"missing GPT-2 tensor {name}")
            if header[name]["shape"] != shape:
                die(f"{name}: shape {header[name]['shape']}, want {shape}")


if __name__ == "__main__":
    main()

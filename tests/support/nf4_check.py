#!/usr/bin/python3
"""accumd's NF4 quantization (core/model/nf4.c) against a reference
written here from the format's description (issue 21): blocks of 64, an
fp32 absmax per block, each value times the fp32 reciprocal of its absmax
coded as the number of the 15 fp32 midpoints of the NF4 values strictly
below it, two codes a byte (even index high), a partial block padded with
zeros; double quantization: absmax minus its mean (double sum, left to
right) in blocks of 256 to the nearest value of the signed 8-bit dynamic
map (ties to the lower index), an fp32 absmax per nested block.

Usage: nf4_check.py NF4_DUMP
"""
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

f32, f64 = np.float32, np.float64
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=f32)
MIDS = ((NF4[:-1].astype(f64) + NF4[1:].astype(f64)) / 2).astype(f32)
failures = []


def dynamic_map():
    vals = []
    for i, scale in enumerate([1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0]):
        k = 2 ** i + 1
        b = np.array([0.1 + 0.9 * j / (k - 1) for j in range(k)], dtype=f64).astype(f32)
        means = ((b[:-1].astype(f64) + b[1:].astype(f64)) / 2).astype(f32)
        v = (scale * means.astype(f64)).astype(f32)
        vals += list(v) + list(-v)
    vals += [f32(0.0), f32(1.0)]
    assert len(vals) == 256
    return np.sort(np.array(vals, dtype=f32))


def quantize(x):
    n = len(x)
    nb = (n + 63) // 64
    pad = np.zeros(nb * 64, dtype=f32)
    pad[:n] = x
    blocks = pad.reshape(nb, 64)
    absmax = np.abs(blocks).max(axis=1).astype(f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        recip = (f32(1.0) / absmax).astype(f32)
        scaled = (blocks * recip[:, None]).astype(f32).reshape(-1)
    codes = (MIDS[None, :] < scaled[:, None]).sum(axis=1).astype(np.uint8)
    nbytes = (n + 1) // 2
    codes = codes[: 2 * nbytes]
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)
    return packed, absmax


def double_quant(absmax, dmap):
    s = 0.0
    for a in absmax:
        s += float(a)
    off = f32(s / len(absmax))
    v = (absmax - off).astype(f32)
    nn = (len(v) + 255) // 256
    q = np.zeros(len(v), dtype=np.uint8)
    nested = np.zeros(nn, dtype=f32)
    for b in range(nn):
        blk = v[b * 256:(b + 1) * 256]
        a2 = f32(np.abs(blk).max())
        nested[b] = a2
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = (blk * (f32(1.0) / a2)).astype(f32)
        d = np.abs(sc.astype(f64)[:, None] - dmap.astype(f64)[None, :])
        q[b * 256:b * 256 + len(blk)] = np.argmin(d, axis=1)  # first minimum: the lower index
    return q, nested, off


def check(what, ok, detail=""):
    print(f"  {'ok' if ok else 'FAIL':4} {what} {detail}")
    if not ok:
        failures.append(what)


def run_case(dump, name, x, tmp):
    x = np.asarray(x, dtype=f32)
    inp, outp = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.bin")
    x.tofile(inp)
    subprocess.run([dump, inp, outp], check=True)
    raw = open(outp, "rb").read()
    n = struct.unpack_from("<Q", raw, 0)[0]
    at = 8

    def take(count, dt):
        nonlocal at
        a = np.frombuffer(raw, dtype=dt, count=count, offset=at)
        at += count * np.dtype(dt).itemsize
        return a

    nb = (n + 63) // 64
    nn = (nb + 255) // 256
    packed, absmax = take((n + 1) // 2, np.uint8), take(nb, f32)
    qabs, nested, off = take(nb, np.uint8), take(nn, f32), take(1, f32)[0]
    dmap, dq, dq32 = take(256, f32), take(n, f32), take(n, f32)
    check(f"{name}: count", n == len(x), f"{n}")
    rp, ra = quantize(x)
    rmap = dynamic_map()
    rq, rn, roff = double_quant(ra, rmap)
    check(f"{name}: packed codes", np.array_equal(packed, rp),
          f"{(packed != rp).sum()} of {len(rp)} bytes differ")
    check(f"{name}: absmax", ra.tobytes() == absmax.tobytes())
    check(f"{name}: dynamic map", rmap.tobytes() == dmap.tobytes())
    check(f"{name}: absmax codes", np.array_equal(qabs, rq), f"{(qabs != rq).sum()} differ")
    check(f"{name}: nested absmax", rn.tobytes() == nested.tobytes())
    check(f"{name}: offset", f32(roff).tobytes() == f32(off).tobytes(), f"{off} vs {roff}")
    # dequantized = code value x absmax exactly (fp32), from either absmax
    codes = np.zeros(2 * len(rp), dtype=np.uint8)
    codes[0::2], codes[1::2] = rp >> 4, rp & 15
    codes = codes[:n]
    blk = np.arange(n) // 64
    am2 = ((rmap[rq] * rn[np.arange(nb) // 256]).astype(f32) + roff).astype(f32)
    want = (NF4[codes] * am2[blk]).astype(f32)
    want32 = (NF4[codes] * ra[blk]).astype(f32)
    check(f"{name}: dequantized (double quant)", want.tobytes() == dq.tobytes())
    check(f"{name}: dequantized (fp32 absmax)", want32.tobytes() == dq32.tobytes())
    return rp


def main():
    dump = sys.argv[1]
    rng = np.random.default_rng(21)
    with tempfile.TemporaryDirectory() as tmp:
        # a partial last block and an odd count
        run_case(dump, "random 64*37+13", rng.standard_normal(64 * 37 + 13).astype(f32) * 0.02, tmp)
        # several nested blocks, the last one partial
        run_case(dump, "random 64*600+5", rng.standard_normal(64 * 600 + 5).astype(f32), tmp)
        # an all-zero block between others
        x = rng.standard_normal(64 * 5).astype(f32)
        x[128:192] = 0.0
        p = run_case(dump, "all-zero block", x, tmp)
        check("all-zero block: codes 0", np.all(p[64:96] == 0))
        # values exactly on the midpoints (absmax 1: scaled = x), and 1 ulp above
        x = np.zeros(64 * 2, dtype=f32)
        x[0] = 1.0
        x[1:16] = MIDS
        x[16:31] = np.nextafter(MIDS, f32(2.0))
        x[64] = -1.0
        x[65:80] = MIDS
        p = run_case(dump, "midpoints", x, tmp)
        codes = np.zeros(2 * len(p), dtype=np.uint8)
        codes[0::2], codes[1::2] = p >> 4, p & 15
        check("midpoints: the lower code", list(codes[1:16]) == list(range(15)), str(codes[1:16]))
        check("above midpoints: the upper code", list(codes[16:31]) == list(range(1, 16)))
        # one block (the nested block is all zero after the offset), odd count
        run_case(dump, "one value", np.array([0.5], dtype=f32), tmp)
        run_case(dump, "odd 63", rng.standard_normal(63).astype(f32), tmp)
    if failures:
        print(f"nf4_check: {len(failures)} failure(s): {failures}")
        sys.exit(1)
    print("nf4_check: all ok")


if __name__ == "__main__":
    main()

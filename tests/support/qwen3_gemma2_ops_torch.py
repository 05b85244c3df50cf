#!/usr/bin/python3
"""Qwen3's and Gemma 2's ops of the CPU backend against PyTorch.

Usage: qwen3_gemma2_ops_torch.py QWEN3_GEMMA2_OPS_DUMP

Runs the dumper (tests/support/qwen3_gemma2_ops_dump.c) into a temporary
folder, then recomputes every result from the dumped inputs in float64
with PyTorch, written from the architectures: soft-capping as
cap * tanh(x / cap); the gate as gelu(gate, approximate="tanh") * up;
Gemma's RMSNorm as x * rsqrt(mean(x^2) + eps) * (1 + w); Qwen3's q/k norm
as that RMSNorm (weight w, no offset) over the last axis (head_dim) of
[B, T, H, hs]; rotary embedding (rotate-half); attention with grouped
key/value heads repeated per group, scores (q k^T) * scale, capped as
cap * tanh(s / cap), a causal mask restricted to the query's own document
and to keys with t - u < window, softmax. The gradients by autograd from the
same upstream gradient (loss = sum(out * g)). Every tensor must agree to
1e-5 of its largest value. Exits 1 on a mismatch, 77 without torch.
"""
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError:
    if os.environ.get("ACCUMD_REQUIRE_REFS"):
        print("FAIL: no torch in this Python (ACCUMD_REQUIRE_REFS is set)")
        sys.exit(1)
    print("no torch in this Python: skipped")
    sys.exit(77)

TOL = 1e-5
failures = 0


def load(folder):
    meta, tensors = {}, {}
    with open(os.path.join(folder, "manifest.txt")) as f:
        for line in f:
            parts = line.split()
            if parts[1] not in ("f32", "i32"):
                meta[parts[0]] = parts[1:]
                continue
            name, dtype, dims = parts[0], parts[1], [int(x) for x in parts[2:]]
            raw = np.fromfile(os.path.join(folder, f"{name}.{dtype}"),
                              dtype="<f4" if dtype == "f32" else "<i4")
            t = torch.from_numpy(raw.reshape(dims).copy())
            tensors[name] = t.double() if dtype == "f32" else t.long()
    return meta, tensors


def check(name, got, want):
    global failures
    want = want.detach()
    scale = max(want.abs().max().item(), 1e-30)
    err = (got - want).abs().max().item() / scale
    ok = err <= TOL
    print(f"{'ok' if ok else 'FAIL':4} {name:22} rel {err:.2e} (max |torch| {scale:.3g})")
    if not ok:
        failures += 1


def rmsnorm(x, w, eps, offset=0.0):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + w)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def attention(q, k, v, pos, scale, cap, window):
    """q [B,T,H,hs], k and v [B,T,KV,hs]; pos [B,T] positions in documents."""
    nh, nkv = q.shape[2], k.shape[2]
    k = k.repeat_interleave(nh // nkv, dim=2)
    v = v.repeat_interleave(nh // nkv, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B,H,T,hs]
    s = (q @ k.transpose(-1, -2)) * scale
    s = cap * torch.tanh(s / cap)
    T = s.shape[-1]
    t = torch.arange(T)[:, None]
    u = torch.arange(T)[None, :]
    doc_start = t - pos[:, :, None]  # [B,T,1]: the first key of the query's document
    allowed = (u <= t) & (t - u < window) & (u >= doc_start)  # [B,T,T]
    s = s.masked_fill(~allowed[:, None, :, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.softmax(s, dim=-1) @ v
    return out.transpose(1, 2), lse


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.argv[1], tmp], check=True)
        meta, t = load(tmp)
    eps = float(meta["eps"][0])
    cap_logits, cap_att = (float(x) for x in meta["caps"])
    scale, window = float(meta["scale"][0]), int(meta["window"][0])
    theta = float(meta["rope"][0])

    x = t["cap_x"].clone().requires_grad_()
    y = cap_logits * torch.tanh(x / cap_logits)
    (y * t["cap_g"]).sum().backward()
    check("softcap out", t["cap_out"], y)
    check("softcap dx", t["cap_dx"], x.grad)

    gate = t["gg_gate"].clone().requires_grad_()
    up = t["gg_up"].clone().requires_grad_()
    h = torch.nn.functional.gelu(gate, approximate="tanh") * up
    (h * t["gg_g"]).sum().backward()
    check("geglu out", t["gg_out"], h)
    check("geglu dgate", t["gg_dgate"], gate.grad)
    check("geglu dup", t["gg_dup"], up.grad)

    x = t["rms1_x"].clone().requires_grad_()
    w = t["rms1_w"].clone().requires_grad_()
    out = rmsnorm(x, w, eps, offset=1.0)
    (out * t["rms1_g"]).sum().backward()
    check("rmsnorm (1 + w) out", t["rms1_out"], out)
    check("rmsnorm (1 + w) dx", t["rms1_dx"], x.grad)
    check("rmsnorm (1 + w) dw", t["rms1_dw"], w.grad)

    hs = t["att_q"].shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    ang = t["att_pos"].double()[..., None] * inv
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos()[:, :, None, :], emb.sin()[:, :, None, :]
    q = t["att_q"].clone().requires_grad_()
    k = t["att_k"].clone().requires_grad_()
    v = t["att_v"].clone().requires_grad_()
    qw = t["att_qw"].clone().requires_grad_()
    kw = t["att_kw"].clone().requires_grad_()
    qn, kn = rmsnorm(q, qw, eps), rmsnorm(k, kw, eps)  # per head: the last axis
    qr, kr = qn * cos + rotate_half(qn) * sin, kn * cos + rotate_half(kn) * sin
    out, lse = attention(qr, kr, v, t["att_pos"], scale, cap_att, window)
    (out * t["att_g"]).sum().backward()
    check("q norm per head", t["att_qn"], qn)
    check("attention out", t["att_out"], out)
    check("attention lse", t["att_lse"], lse)
    check("dq (through norm)", t["att_dq"], q.grad)
    check("dk (through norm)", t["att_dk"], k.grad)
    check("dv", t["att_dv"], v.grad)
    check("q_norm dw", t["att_dqw"], qw.grad)
    check("k_norm dw", t["att_dkw"], kw.grad)

    if failures:
        print(f"{failures} tensor(s) differ from PyTorch")
        sys.exit(1)
    print("all Qwen3 / Gemma 2 ops agree with PyTorch")


if __name__ == "__main__":
    main()

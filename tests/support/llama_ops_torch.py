#!/usr/bin/python3
"""The LLaMA-family ops of the CPU backend against PyTorch.

Usage: llama_ops_torch.py LLAMA_OPS_DUMP

Runs the dumper (tests/support/llama_ops_dump.c) into a temporary folder,
then recomputes every result from the dumped inputs in float64 with
PyTorch, written the way Hugging Face's LLaMA writes these layers:
RMSNorm as x * rsqrt(mean(x^2) + eps) * w, rotary embedding as
q * cos + rotate_half(q) * sin with cos / sin repeated over both halves,
SwiGLU as silu(gate) * up, grouped-query attention by repeating each
key/value head over its group, a causal mask and softmax; the gradients by
autograd from the same upstream gradient (loss = sum(out * g)). The rotary
frequencies with llama3 scaling are computed here from Meta's definition,
vectorised with torch.where. Every tensor must agree to 1e-5 of its
largest value (fp32 kernels against float64). Exits 1 on a mismatch.
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

TOL = 1e-5


def load(folder):
    meta, tensors = {}, {}
    with open(os.path.join(folder, "manifest.txt")) as f:
        for line in f:
            parts = line.split()
            if parts[0] in ("eps", "rope"):
                meta[parts[0]] = parts[1:]
                continue
            name, dtype, dims = parts[0], parts[1], [int(x) for x in parts[2:]]
            raw = np.fromfile(os.path.join(folder, f"{name}.{dtype}"),
                              dtype="<f4" if dtype == "f32" else "<i4")
            t = torch.from_numpy(raw.reshape(dims).copy())
            tensors[name] = t.double() if dtype == "f32" else t.long()
    return meta, tensors


failures = 0


def check(name, got, want):
    global failures
    want = want.detach()
    scale = max(want.abs().max().item(), 1e-30)
    err = (got - want).abs().max().item() / scale
    ok = err <= TOL
    print(f"{'ok' if ok else 'FAIL':4} {name:18} rel {err:.2e} (max |torch| {scale:.3g})")
    if not ok:
        failures += 1


def inv_freq_llama3(theta, hs, factor, low, high, old_ctx):
    inv = 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, blended, scaled)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, cos, sin):  # x [B,T,H,hs]; cos, sin [B,T,hs]
    return x * cos[:, :, None, :] + rotate_half(x) * sin[:, :, None, :]


def attention(q, k, v):  # [B,T,H,hs], k and v [B,T,KV,hs]
    nh, nkv, hs = q.shape[2], k.shape[2], q.shape[3]
    k = k.repeat_interleave(nh // nkv, dim=2)
    v = v.repeat_interleave(nh // nkv, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B,H,T,hs]
    s = q @ k.transpose(-1, -2) / math.sqrt(hs)
    T = s.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B,H,T]
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

    check("embed_out", t["embed_out"], t["wte"][t["tok"]])
    dwte = torch.zeros_like(t["wte"]).index_add_(0, t["tok"], t["embed_g"])
    check("embed_dwte", t["embed_dwte"], dwte)

    x = t["rms_x"].clone().requires_grad_()
    w = t["rms_w"].clone().requires_grad_()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    out = x * rstd * w
    (out * t["rms_g"]).sum().backward()
    check("rmsnorm out", t["rms_out"], out)
    check("rmsnorm rstd", t["rms_rstd"], rstd.squeeze(-1))
    check("rmsnorm dx", t["rms_dx"], x.grad)
    check("rmsnorm dw", t["rms_dw"], w.grad)

    gate = t["sw_gate"].clone().requires_grad_()
    up = t["sw_up"].clone().requires_grad_()
    h = torch.nn.functional.silu(gate) * up
    (h * t["sw_g"]).sum().backward()
    check("swiglu out", t["sw_out"], h)
    check("swiglu dgate", t["sw_dgate"], gate.grad)
    check("swiglu dup", t["sw_dup"], up.grad)

    theta, kind, factor, low, high, old_ctx = meta["rope"]
    assert kind == "llama3"
    hs = t["att_q"].shape[-1]
    inv = inv_freq_llama3(float(theta), hs, float(factor), float(low), float(high),
                          float(old_ctx))
    ang = t["att_pos"].double()[..., None] * inv  # [B,T,hs/2]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q = t["att_q"].clone().requires_grad_()
    k = t["att_k"].clone().requires_grad_()
    v = t["att_v"].clone().requires_grad_()
    qr, kr = rope(q, cos, sin), rope(k, cos, sin)
    qr.retain_grad()
    kr.retain_grad()
    out, lse = attention(qr, kr, v)
    (out * t["att_g"]).sum().backward()
    check("rope q", t["att_q_rot"], qr)
    check("rope k", t["att_k_rot"], kr)
    check("gqa out", t["att_out"], out)
    check("gqa lse", t["att_lse"], lse)
    check("gqa dq (rotated)", t["att_dq_rot"], qr.grad)
    check("gqa dk (rotated)", t["att_dk_rot"], kr.grad)
    check("gqa dv", t["att_dv"], v.grad)
    # lean activations (issue 20): the tiled attention on the same inputs
    check("lean out", t["lean_out"], out)
    check("lean lse", t["lean_lse"], lse)
    check("lean dq (rotated)", t["lean_dq_rot"], qr.grad)
    check("lean dk (rotated)", t["lean_dk_rot"], kr.grad)
    check("lean dv", t["lean_dv"], v.grad)
    check("rope_bwd dq", t["att_dq"], q.grad)
    check("rope_bwd dk", t["att_dk"], k.grad)

    if failures:
        print(f"{failures} tensor(s) differ from PyTorch")
        sys.exit(1)
    print("all LLaMA ops agree with PyTorch")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""bf16 activation storage (blocks.h "bf16 activation storage") against a
PyTorch reference written here, and against accumd's own fp32 run.

Usage: bf16_check.py HF_DUMP   (the tests/support/hf_dump binary)
Exit 77 (skip) when this Python has no torch.

accumd in bf16 (hf_dump --bf16: precision bf16 and model_config.act_bf16)
rounds to bf16 (to nearest, ties to even) at fixed points, and the
reference below rounds at the same points, in fp32 otherwise:
  - every linear-layer product (the blocks' and the LM head's), forward
    and backward: both operands rounded, fp32 accumulation (dx = r(dy)
    r(W), dW = r(dy)^T r(x));
  - the residual stream after every block but the last (the next block,
    the backward and the recomputation all see the rounded value; the
    rounding passes gradients through unchanged);
  - stored mode only, what a block's backward reads of its activations,
    for every block but the last: RMSNorm's input (the post-attention
    norm; the input norm's input is the rounded residual already), the
    attention's q, k (after RoPE) and v, the SwiGLU's gate and up (and the
    projections' inputs, which the bf16 products round anyway); the
    statistics (rstd, log-sum-exp) stay fp32. With recompute the inner
    activations are rebuilt in fp32 and only the residual stream is.
fp32 master weights and AdamW (torch.optim.AdamW, decay on 2-D tensors).

Checks, on a 4-layer LLaMA with grouped-query attention (make_tiny_llama
"deep+gqa"), 20 AdamW steps on one batch:
  - stored and recompute: the gradients at the loaded weights within
    5e-3 (worst tensor, relative to its largest value) of the reference
    rounding at the same points, and less than half as far from it as from
    the reference rounding as the other mode does (so the test tells the
    rounding points apart; fp32's gradients are further still: bf16
    products);
  - stored and recompute: per-step losses within 1e-3 relative of the
    reference that rounds at the same points (AdamW turns the products'
    one-bf16-step differences into ~1e-4 after a few steps, for any two
    bf16 implementations);
  - both within 1e-2 relative of accumd's fp32 run, and not equal to it;
  - stored and recompute differ (the rounded kept arrays are in effect),
    their first losses are equal bit for bit (the forward is the same).
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    if os.environ.get("ACCUMD_REQUIRE_REFS"):
        print("FAIL: bf16_check: no torch in this Python (ACCUMD_REQUIRE_REFS is set)")
        sys.exit(1)
    print("bf16_check: no torch in this Python: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from llama_ref import inv_freq, load_params, read_batch, rope, st_read  # noqa: E402

PY = sys.executable
STEPS = 20
OPT = {"lr": 1e-3, "wd": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
failures = []


def r16(t):
    """t rounded to bf16 (torch rounds to nearest, ties to even), as fp32."""
    return t.to(torch.bfloat16).to(torch.float32)


class Round(torch.autograd.Function):
    """The residual stream rounded; the gradient passes unchanged."""
    @staticmethod
    def forward(ctx, x):
        return r16(x)

    @staticmethod
    def backward(ctx, g):
        return g


class Linear(torch.autograd.Function):
    """y = r(x) r(W)^T, fp32 accumulation; backward rounds dy too."""
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return r16(x) @ r16(w).t()

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        g = r16(dy)
        dw = g.reshape(-1, g.shape[-1]).t() @ r16(x).reshape(-1, x.shape[-1])
        return g @ r16(w), dw


class RMSNorm(torch.autograd.Function):
    """x rstd w; the backward reads the kept input (rounded when `keep`)
    and the forward's fp32 rstd."""
    @staticmethod
    def forward(ctx, x, w, eps, keep):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(r16(x) if keep else x, w, rstd)
        return x * rstd * w

    @staticmethod
    def backward(ctx, g):
        x, w, rstd = ctx.saved_tensors
        gw = g * w
        dot = (gw * x).sum(-1, keepdim=True)
        dx = rstd * gw - dot * rstd.pow(3) / x.shape[-1] * x
        dw = (g * x * rstd).reshape(-1, x.shape[-1]).sum(0)
        return dx, dw, None, None


class SwiGLU(torch.autograd.Function):
    """silu(gate) up; the backward reads the kept gate and up."""
    @staticmethod
    def forward(ctx, gate, up, keep):
        ctx.save_for_backward(r16(gate) if keep else gate, r16(up) if keep else up)
        return torch.nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx, dh):
        g, u = ctx.saved_tensors
        sg = torch.sigmoid(g)
        return dh * u * sg * (1 + g * (1 - sg)), dh * g * sg, None


class Attention(torch.autograd.Function):
    """Causal grouped-query attention, q [B,NH,T,hs], k, v [B,NKV,T,hs];
    the backward rebuilds the probabilities from the kept q, k and the
    fp32 log-sum-exp (accumd's full-matrix backward: <p, dp> per row)."""
    @staticmethod
    def forward(ctx, q, k, v, keep):
        rep = q.shape[1] // k.shape[1]
        scale = 1.0 / q.shape[-1] ** 0.5
        T = q.shape[2]
        mask = torch.full((T, T), float("-inf")).triu(1)
        s = q @ k.repeat_interleave(rep, 1).transpose(-1, -2) * scale + mask
        lse = torch.logsumexp(s, -1, keepdim=True)
        out = torch.exp(s - lse) @ v.repeat_interleave(rep, 1)
        kept = [r16(t) if keep else t for t in (q, k, v)]
        ctx.save_for_backward(*kept, lse, mask)
        ctx.rep, ctx.scale = rep, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lse, mask = ctx.saved_tensors
        rep, scale = ctx.rep, ctx.scale
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        p = torch.exp(q @ kk.transpose(-1, -2) * scale + mask - lse)
        dp = dout @ vv.transpose(-1, -2)
        ds = p * (dp - (p * dp).sum(-1, keepdim=True)) * scale
        B, NH, T, hs = q.shape
        def fold(t):  # the query heads' sums onto their key/value head
            return t.view(B, NH // rep, rep, T, hs).sum(2)
        return ds @ kk, fold(ds.transpose(-1, -2) @ q), fold(p.transpose(-1, -2) @ dout), None


def forward(cfg, P, tokens, stored):
    """Mean-loss logits of accumd's bf16 forward (see the module's text)."""
    B, T = tokens.shape
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(cfg)[None, :]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    x = P["model.embed_tokens.weight"][tokens]
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        keep = stored and l < cfg.L - 1  # the last block is never stored
        h = RMSNorm.apply(x, P[p + "input_layernorm.weight"], cfg.eps, False)

        def proj(m, heads):
            y = Linear.apply(h, P[p + f"self_attn.{m}_proj.weight"])
            return y.view(B, T, heads, cfg.hs).transpose(1, 2)

        q, k, v = proj("q", cfg.NH), proj("k", cfg.NKV), proj("v", cfg.NKV)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = Attention.apply(q, k, v, keep).transpose(1, 2).reshape(B, T, cfg.NH * cfg.hs)
        x = x + Linear.apply(y, P[p + "self_attn.o_proj.weight"])
        h = RMSNorm.apply(x, P[p + "post_attention_layernorm.weight"], cfg.eps, keep)
        f = SwiGLU.apply(Linear.apply(h, P[p + "mlp.gate_proj.weight"]),
                         Linear.apply(h, P[p + "mlp.up_proj.weight"]), keep)
        x = x + Linear.apply(f, P[p + "mlp.down_proj.weight"])
        if l < cfg.L - 1:
            x = Round.apply(x)
    x = RMSNorm.apply(x, P["model.norm.weight"], cfg.eps, False)
    return Linear.apply(x, P["lm_head.weight"])


def reference_grads(d, batch, stored):
    """{"grad.NAME": d mean loss / d NAME} at the loaded weights."""
    cfg, P = load_params(d, False)
    tokens, targets = read_batch(batch)
    logits = forward(cfg, P, tokens, stored)
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                      targets.reshape(-1)).backward()
    return {"grad." + n: p.grad for n, p in P.items()}


def grad_diff(ours, ref):
    """The worst tensor's max |diff| / max |ref|."""
    w = 0.0
    for n, g in ref.items():
        a, b = ours[n].double(), g.double()
        w = max(w, ((a - b).abs().max() / b.abs().max()).item())
    return w


def reference_losses(d, batch, stored):
    torch.manual_seed(0)
    cfg, P = load_params(d, False)
    assert not cfg.tied and not cfg.bias and cfg.scaling is None
    tokens, targets = read_batch(batch)
    decay = [p for p in P.values() if p.dim() == 2]
    nodecay = [p for p in P.values() if p.dim() != 2]
    o = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["wd"]},
                           {"params": nodecay, "weight_decay": 0.0}],
                          lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
    losses = []
    for _ in range(STEPS):
        o.zero_grad()
        logits = forward(cfg, P, tokens, stored)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        loss.backward()
        losses.append(loss.item())
        o.step()
    return torch.tensor(losses, dtype=torch.float64)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def ours(dump, d, batch, tag, extra):
    """accumd's dump: "losses" of the steps, "grad.NAME" at the loaded weights."""
    out = f"{d}.{tag}.ours"
    opt = ["--lr", str(OPT["lr"]), "--wd", str(OPT["wd"]), "--beta1", str(OPT["beta1"]),
           "--beta2", str(OPT["beta2"]), "--eps", str(OPT["eps"])]
    run([dump, d, batch, out, "--steps", str(STEPS)] + opt + extra)
    return st_read(out)


def worst(a, b):
    return ((a - b).abs() / b.abs()).max().item()


def check(what, ok, detail):
    print(f"  {'ok' if ok else 'FAIL':4} {what}: {detail}")
    if not ok:
        failures.append(what)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    dump = sys.argv[1]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="accumd-bf16-") as tmp:
        d, batch = os.path.join(tmp, "deep"), os.path.join(tmp, "deep.batch")
        run([PY, os.path.join(HERE, "make_tiny_llama.py"), d, "--variant", "deep+gqa",
             "--seed", "5", "--batch", batch, "4", "16"])
        f32all = ours(dump, d, batch, "fp32", [])
        f32 = f32all["losses"].double()
        got = {}
        grads = {m: reference_grads(d, batch, m == "stored") for m in ("stored", "recompute")}
        for mode, extra in (("stored", ["--bf16"]), ("recompute", ["--bf16", "--recompute"])):
            dumped = ours(dump, d, batch, mode, extra)
            o = dumped["losses"].double()
            ref = reference_losses(d, batch, mode == "stored")
            got[mode] = o
            other = "recompute" if mode == "stored" else "stored"
            own, alt = grad_diff(dumped, grads[mode]), grad_diff(dumped, grads[other])
            check(f"{mode}: gradients against the reference rounding at the same points",
                  own <= 5e-3 and 2 * own < alt,
                  f"worst {own:.2e} (5e-3; the {other} rounding's {alt:.2e}, "
                  f"fp32's {grad_diff(dumped, {n: f32all[n] for n in grads[mode]}):.2e})")
            print(f"{mode}: losses {o[0].item():.6f} -> {o[-1].item():.6f} "
                  f"(fp32 {f32[0].item():.6f} -> {f32[-1].item():.6f})")
            check(f"{mode}: {STEPS} losses against the reference rounding at the same points",
                  worst(o, ref) <= 1e-3, f"worst {worst(o, ref):.2e} (1e-3)")
            check(f"{mode}: against accumd's fp32 run", 0 < worst(o, f32) <= 1e-2,
                  f"worst {worst(o, f32):.2e} (1e-2, not 0)")
        s, rc = got["stored"], got["recompute"]
        check("stored and recompute: the same first loss (the same forward)",
              s[0].item() == rc[0].item(), f"{s[0].item():.9g} vs {rc[0].item():.9g}")
        check("stored and recompute: different later losses (the kept arrays rounded)",
              worst(s, rc) > 0, f"worst {worst(s, rc):.2e}")
    if failures:
        print(f"bf16_check: {len(failures)} FAILED: {', '.join(failures)}")
        sys.exit(1)
    print("bf16_check: all passed")


if __name__ == "__main__":
    main()

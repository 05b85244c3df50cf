#!/usr/bin/python3
"""Independent Qwen3 and Gemma 2 references for the tests (PyTorch, no
transformers), written from the architectures, not from accumd's C.

Qwen3 (model_type "qwen3"): token embedding; per layer RMSNorm ->
attention (q/k/v projections, biases when attention_bias; q and k viewed
as heads of head_dim and each head RMSNorm-ed with q_norm / k_norm, a
[head_dim] weight, before the rotary embedding; grouped-query attention,
scores / sqrt(head_dim), causal softmax; o_proj) -> residual -> RMSNorm ->
SwiGLU MLP -> residual; final RMSNorm; lm_head or the tied embedding.

Gemma 2 (model_type "gemma2"): token embedding times sqrt(hidden_size)
(the factor rounded to the hidden dtype); RMSNorm with the weight as
(1 + w) everywhere; per layer input_layernorm -> attention (rotary, scores
(q k^T) * query_pre_attn_scalar^-1/2, soft-capped as cap * tanh(s / cap)
with attn_logit_softcapping, causal, and on sliding layers only keys with
t - u < sliding_window; the sliding layers are those layer_types names
"sliding_attention", or without layer_types the even layers 0, 2, ...) ->
post_attention_layernorm -> residual; pre_feedforward_layernorm -> MLP
down(gelu_tanh(gate(x)) * up(x)) -> post_feedforward_layernorm ->
residual; final norm; the tied embedding as the head; logits soft-capped
with final_logit_softcapping.

Reads a Hugging Face directory with llama_ref's safetensors reader.

Usage (as llama_ref.py):
  qwen3_gemma2_ref.py run DIR BATCH OUT [--steps N] [--lr X] [--wd X]
                          [--beta1 X] [--beta2 X] [--eps X] [--double]
      OUT (safetensors, F32): "logits" [B, T, V], "loss" [1],
      "grad.NAME" of every parameter at the loaded weights, "losses" [N]
      before each of N AdamW steps (decay on 2-D tensors only).
  qwen3_gemma2_ref.py loss DIR BATCH   prints the mean loss.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import inv_freq, load_dir, mean_loss, read_batch, rope, st_write  # noqa: E402


class Config:
    def __init__(self, c):
        self.kind = c["model_type"]
        assert self.kind in ("qwen3", "gemma2"), f"model_type {self.kind}"
        self.V = c["vocab_size"]
        self.C = c["hidden_size"]
        self.L = c["num_hidden_layers"]
        self.NH = c["num_attention_heads"]
        self.NKV = c.get("num_key_value_heads") or self.NH
        self.hs = c.get("head_dim") or self.C // self.NH
        self.I = c["intermediate_size"]
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.theta = c.get("rope_theta", 10000.0)
        self.scaling = c.get("rope_scaling")
        self.bias = c.get("attention_bias", False)
        gemma = self.kind == "gemma2"
        self.tied = c.get("tie_word_embeddings", gemma)
        self.qscale = (c.get("query_pre_attn_scalar") or self.hs) ** -0.5 if gemma else self.hs ** -0.5
        self.att_cap = c.get("attn_logit_softcapping") if gemma else None
        self.final_cap = c.get("final_logit_softcapping") if gemma else None
        types = c.get("layer_types")
        if not gemma:
            self.sliding = [False] * self.L
        elif types:
            self.sliding = [t == "sliding_attention" for t in types]
        else:
            self.sliding = [l % 2 == 0 for l in range(self.L)]
        self.window = c.get("sliding_window") if gemma else None


def param_names(cfg):
    names = ["model.embed_tokens.weight"]
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        names.append(p + "input_layernorm.weight")
        for m in ("q", "k", "v", "o"):
            names.append(p + f"self_attn.{m}_proj.weight")
            if cfg.bias:
                names.append(p + f"self_attn.{m}_proj.bias")
        if cfg.kind == "qwen3":
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names.append(p + "post_attention_layernorm.weight")
        if cfg.kind == "gemma2":
            names += [p + "pre_feedforward_layernorm.weight", p + "post_feedforward_layernorm.weight"]
        names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
    names.append("model.norm.weight")
    if not cfg.tied:
        names.append("lm_head.weight")
    return names


def param_shape(cfg, n):
    if n.endswith("q_norm.weight") or n.endswith("k_norm.weight"):
        return [cfg.hs]
    if n.endswith("norm.weight"):
        return [cfg.C]
    rows = {"q": cfg.NH * cfg.hs, "k": cfg.NKV * cfg.hs, "v": cfg.NKV * cfg.hs, "o": cfg.C}
    if n.endswith(".bias"):
        return [rows[n.split("self_attn.")[1][0]]]
    if n in ("model.embed_tokens.weight", "lm_head.weight"):
        return [cfg.V, cfg.C]
    if "o_proj" in n:
        return [cfg.C, cfg.NH * cfg.hs]
    if "_proj" in n and "self_attn" in n:
        return [rows[n.split("self_attn.")[1][0]], cfg.C]
    if "gate_proj" in n or "up_proj" in n:
        return [cfg.I, cfg.C]
    return [cfg.C, cfg.I]  # down_proj


def rmsnorm(x, w, eps, gemma):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (1.0 + w) if gemma else y * w


def forward(cfg, P, tokens, lora=None):
    """Logits [B, T, V]. lora: None or (x, weight name) -> the adapter's
    addition to x @ W^T."""
    def lin(x, name):
        y = x @ P[name].t()
        if cfg.bias and name.replace(".weight", ".bias") in P:
            y = y + P[name.replace(".weight", ".bias")]
        return y if lora is None else y + lora(x, name)

    gemma = cfg.kind == "gemma2"
    B, T = tokens.shape
    emb = P["model.embed_tokens.weight"]
    dt = emb.dtype
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(cfg)[None, :]
    cos, sin = torch.cos(ang).to(dt), torch.sin(ang).to(dt)
    t_i = torch.arange(T)[:, None]
    u_i = torch.arange(T)[None, :]
    x = emb[tokens]
    if gemma:
        x = x * torch.tensor(cfg.C ** 0.5, dtype=dt)
    rep = cfg.NH // cfg.NKV
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"], cfg.eps, gemma)
        q = lin(h, p + "self_attn.q_proj.weight").view(B, T, cfg.NH, cfg.hs)
        k = lin(h, p + "self_attn.k_proj.weight").view(B, T, cfg.NKV, cfg.hs)
        v = lin(h, p + "self_attn.v_proj.weight").view(B, T, cfg.NKV, cfg.hs)
        if not gemma:  # Qwen3: each head normalised over head_dim
            q = rmsnorm(q, P[p + "self_attn.q_norm.weight"], cfg.eps, False)
            k = rmsnorm(k, P[p + "self_attn.k_norm.weight"], cfg.eps, False)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) * cfg.qscale
        if cfg.att_cap:
            s = cfg.att_cap * torch.tanh(s / cfg.att_cap)
        allowed = u_i <= t_i
        if cfg.sliding[l]:
            allowed = allowed & (t_i - u_i < cfg.window)
        s = s.masked_fill(~allowed, float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, cfg.NH * cfg.hs)
        y = lin(y, p + "self_attn.o_proj.weight")
        if gemma:
            y = rmsnorm(y, P[p + "post_attention_layernorm.weight"], cfg.eps, True)
            x = x + y
            h = rmsnorm(x, P[p + "pre_feedforward_layernorm.weight"], cfg.eps, True)
            g = torch.nn.functional.gelu(lin(h, p + "mlp.gate_proj.weight"), approximate="tanh")
            y = lin(g * lin(h, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
            x = x + rmsnorm(y, P[p + "post_feedforward_layernorm.weight"], cfg.eps, True)
        else:
            x = x + y
            h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], cfg.eps, False)
            g = torch.nn.functional.silu(lin(h, p + "mlp.gate_proj.weight"))
            x = x + lin(g * lin(h, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
    x = rmsnorm(x, P["model.norm.weight"], cfg.eps, gemma)
    head = emb if cfg.tied else P["lm_head.weight"]
    logits = x @ head.t()
    if cfg.final_cap:
        logits = cfg.final_cap * torch.tanh(logits / cfg.final_cap)
    return logits


def load_params(d, double):
    c, tensors = load_dir(d)
    cfg = Config(c)
    dt = torch.float64 if double else torch.float32
    names = param_names(cfg)
    extra = set(tensors) - set(names) - ({"lm_head.weight"} if cfg.tied else set())
    assert not extra, f"{d}: tensors outside the layout: {sorted(extra)}"
    P = {}
    for n in names:
        assert list(tensors[n].shape) == param_shape(cfg, n), f"{n}: shape {list(tensors[n].shape)}"
        P[n] = tensors[n].to(dt).clone().requires_grad_(True)
    return cfg, P


def cmd_run(args):
    d, batch, out = args[0], args[1], args[2]
    opt = {"--steps": 0, "--lr": 1e-3, "--wd": 0.0, "--beta1": 0.9, "--beta2": 0.999, "--eps": 1e-8}
    double, i = False, 3
    while i < len(args):
        if args[i] == "--double":
            double, i = True, i + 1
            continue
        opt[args[i]] = float(args[i + 1])
        i += 2
    cfg, P = load_params(d, double)
    tokens, targets = read_batch(batch)
    logits = forward(cfg, P, tokens)
    loss = mean_loss(logits, targets)
    loss.backward()
    res = {"logits": logits.detach().float(), "loss": loss.detach().float().reshape(1)}
    for n, p in P.items():
        res["grad." + n] = p.grad.detach().float().clone()
    steps = int(opt["--steps"])
    if steps > 0:
        decay = [p for p in P.values() if p.dim() == 2]
        nodecay = [p for p in P.values() if p.dim() != 2]
        o = torch.optim.AdamW([{"params": decay, "weight_decay": opt["--wd"]},
                               {"params": nodecay, "weight_decay": 0.0}],
                              lr=opt["--lr"], betas=(opt["--beta1"], opt["--beta2"]), eps=opt["--eps"])
        losses = []
        for _ in range(steps):
            o.zero_grad()
            loss = mean_loss(forward(cfg, P, tokens), targets)
            loss.backward()
            losses.append(loss.item())
            o.step()
        res["losses"] = torch.tensor(losses, dtype=torch.float32)
    st_write(out, res)


def cmd_loss(args):
    cfg, P = load_params(args[0], True)
    tokens, targets = read_batch(args[1])
    with torch.no_grad():
        print(f"{mean_loss(forward(cfg, P, tokens), targets).item():.9g}")


def main():
    torch.set_num_threads(1)
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "loss"):
        sys.exit(__doc__)
    {"run": cmd_run, "loss": cmd_loss}[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""An independent LLaMA reference for the tests (PyTorch, no transformers).

Written from the architecture, not from accumd's C: token embedding (no
positions); per layer RMSNorm -> attention (q/k/v projections, optional
q/k/v biases as Qwen2 has them, rotary embedding in the rotate-half layout
with rope_theta and rope_scaling none / linear / llama3, grouped-query
attention with num_key_value_heads, causal softmax, o_proj) -> residual ->
RMSNorm -> SwiGLU MLP down(silu(gate(x)) * up(x)) -> residual; final
RMSNorm; lm_head (or the embedding when tie_word_embeddings). It reads a
Hugging Face directory (config.json, model.safetensors or the shards of
model.safetensors.index.json; F32 / BF16 / F16) with the small safetensors
reader below (8-byte little-endian header length, JSON header, raw data).

Usage:
  llama_ref.py run DIR BATCH OUT [--steps N] [--lr X] [--wd X] [--beta1 X]
                                  [--beta2 X] [--eps X] [--double]
      BATCH: a safetensors file with I32 "tokens" and "targets" [B, T].
      OUT gets (safetensors, F32): "logits" [B, T, V] and "loss" [1] of the
      loaded weights, "grad.NAME" for every parameter (d mean loss / d w, at
      the loaded weights; a tied lm_head has no entry of its own), and
      "losses" [N]: the loss before each of N AdamW steps (torch.optim.AdamW;
      weight decay on 2-D tensors only, none on norms and biases).
  llama_ref.py loss DIR BATCH      prints the mean loss of the batch.
Exit 0 on success; any error is a Python exception (exit 1).
"""
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2),
          "I32": (torch.int32, 4), "I64": (torch.int64, 8)}
TORCH_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
               torch.int32: "I32", torch.int64: "I64"}


# ---- safetensors, by hand

def st_read(path):
    """{name: tensor} of a safetensors file (tensors in their stored dtype)."""
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = blob[8 + hlen:]
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        dt, esize = DTYPES[e["dtype"]]
        b, end = e["data_offsets"]
        n = 1
        for d in e["shape"]:
            n *= d
        assert end - b == n * esize, f"{path}: {name}: byte range does not fit its shape"
        raw = bytearray(data[b:end])
        if dt == torch.bfloat16:  # bf16 = the upper half of an f32
            t = torch.frombuffer(raw, dtype=torch.int16).to(torch.int32) if n else torch.zeros(0, dtype=torch.int32)
            t = (t << 16).view(torch.float32).to(torch.bfloat16)
        else:
            t = torch.frombuffer(raw, dtype=dt).clone() if n else torch.zeros(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out


def st_write(path, tensors, metadata=None):
    """Write {name: tensor} (each in its own dtype) as safetensors."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            raw = (t.to(torch.float32).view(torch.int32) >> 16).to(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        header[name] = {"dtype": TORCH_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_dir(d):
    """(config, {name: float tensor}) of a Hugging Face directory."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            tensors.update(st_read(os.path.join(d, fn)))
    else:
        tensors = st_read(os.path.join(d, "model.safetensors"))
    return cfg, tensors


# ---- the model

class Config:
    def __init__(self, c):
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
        self.tied = c.get("tie_word_embeddings", False)
        # Qwen2: q/k/v biases always; LLaMA attention_bias: q/k/v and o
        self.qwen2 = c.get("model_type") == "qwen2"
        self.bias = self.qwen2 or c.get("attention_bias", False)
        self.obias = self.bias and not self.qwen2


def inv_freq(cfg):
    """Rotation frequency of each pair (i, i + hs/2), float64."""
    hs = cfg.hs
    f = 1.0 / (cfg.theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    s = cfg.scaling
    kind = (s or {}).get("rope_type", (s or {}).get("type", "default"))
    if s is None or kind == "default":
        return f
    if kind == "linear":  # positions slowed down by the factor
        return f / s["factor"]
    if kind == "llama3":  # long wavelengths slowed, short kept, a ramp between
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        orig = s["original_max_position_embeddings"]
        out = []
        for x in f.tolist():
            wave = 2 * math.pi / x
            if wave < orig / hi:
                out.append(x)
            elif wave > orig / lo:
                out.append(x / factor)
            else:
                a = (orig / wave - lo) / (hi - lo)
                out.append((1 - a) * x / factor + a * x)
        return torch.tensor(out, dtype=torch.float64)
    raise ValueError(f"rope_scaling type {kind} not supported")


def rope(x, cos, sin):
    """x [B, H, T, hs] rotated: pairs (i, i + hs/2) by the angle of position t."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def param_names(cfg):
    names = ["model.embed_tokens.weight"]
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        names += [p + "input_layernorm.weight"]
        for m in ("q", "k", "v"):
            names.append(p + f"self_attn.{m}_proj.weight")
            if cfg.bias:
                names.append(p + f"self_attn.{m}_proj.bias")
        names.append(p + "self_attn.o_proj.weight")
        if cfg.obias:
            names.append(p + "self_attn.o_proj.bias")
        names += [p + "post_attention_layernorm.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
    names.append("model.norm.weight")
    if not cfg.tied:
        names.append("lm_head.weight")
    return names


def forward(cfg, P, tokens, lora=None):
    """Logits [B, T, V] for tokens [B, T] (P: {name: tensor}). lora: None or
    a function (x, weight name) -> the adapter's addition to x @ W^T (the
    LoRA check writes PEFT's formula there)."""
    def lin(x, name):
        y = x @ P[name].t()
        return y if lora is None else y + lora(x, name)

    B, T = tokens.shape
    dt = P["model.embed_tokens.weight"].dtype
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(cfg)[None, :]
    cos, sin = torch.cos(ang).to(dt), torch.sin(ang).to(dt)
    mask = torch.full((T, T), float("-inf"), dtype=dt).triu(1)
    x = P["model.embed_tokens.weight"][tokens]
    rep = cfg.NH // cfg.NKV
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"], cfg.eps)

        def proj(m, heads):
            y = lin(h, p + f"self_attn.{m}_proj.weight")
            if cfg.bias:
                y = y + P[p + f"self_attn.{m}_proj.bias"]
            return y.view(B, T, heads, cfg.hs).transpose(1, 2)

        q, k, v = proj("q", cfg.NH), proj("k", cfg.NKV), proj("v", cfg.NKV)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(cfg.hs) + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, cfg.NH * cfg.hs)
        y = lin(y, p + "self_attn.o_proj.weight")
        if cfg.obias:
            y = y + P[p + "self_attn.o_proj.bias"]
        x = x + y
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], cfg.eps)
        g = torch.nn.functional.silu(lin(h, p + "mlp.gate_proj.weight"))
        u = lin(h, p + "mlp.up_proj.weight")
        x = x + lin(g * u, p + "mlp.down_proj.weight")
    x = rmsnorm(x, P["model.norm.weight"], cfg.eps)
    head = P["model.embed_tokens.weight"] if cfg.tied else P["lm_head.weight"]
    return x @ head.t()


def mean_loss(logits, targets):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def load_params(d, double):
    c, tensors = load_dir(d)
    cfg = Config(c)
    dt = torch.float64 if double else torch.float32
    names = param_names(cfg)
    extra = set(tensors) - set(names) - ({"lm_head.weight"} if cfg.tied else set())
    extra = {n for n in extra if not n.endswith("rotary_emb.inv_freq")}
    assert not extra, f"{d}: tensors outside the layout: {sorted(extra)}"
    P = {n: tensors[n].to(dt).clone().requires_grad_(True) for n in names}
    return cfg, P


def read_batch(path):
    b = st_read(path)
    return b["tokens"].long(), b["targets"].long()


def cmd_run(args):
    d, batch, out = args[0], args[1], args[2]
    opt = {"--steps": 0, "--lr": 1e-3, "--wd": 0.0, "--beta1": 0.9, "--beta2": 0.999, "--eps": 1e-8}
    i = 3
    double = False
    while i < len(args):
        if args[i] == "--double":
            double = True
            i += 1
            continue
        opt[args[i]] = float(args[i + 1])
        i += 2
    torch.manual_seed(0)
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

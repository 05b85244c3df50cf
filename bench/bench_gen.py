#!/usr/bin/python3
"""Generation throughput on CPU (issue 24): accumd's engine (generate.h,
through tests/support/gen_dump) next to PyTorch on the same weights, the
same machine, the same run, with and without a key/value cache on both
sides. The model is the bench_llama shape (6 layers, 384 channels, 6 heads
/ 2 key/value heads, SwiGLU 1024, vocab 32000, untied head), random weights,
fp32, written here as a Hugging Face directory.

Usage: bench_gen.py GEN_DUMP [--threads N] [--prompt P] [--new N] [--runs R]
Prints one table row per side and mode: prefill tokens/s (the prompt's
tokens over the time to the first logits) and decode tokens/s (new tokens
over the time after it), each the median of R runs; greedy decoding, so
both sides produce their tokens from the same logits.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
from llama_ref import st_write  # noqa: E402

L, C, NH, NKV, I, V, POS = 6, 384, 6, 2, 1024, 32000, 512
HS = C // NH


def make_dir(d):
    g = torch.Generator().manual_seed(1)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "hidden_size": C, "intermediate_size": I, "num_hidden_layers": L,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "max_position_embeddings": POS, "tie_word_embeddings": False,
           "torch_dtype": "float32"}
    P = {"model.embed_tokens.weight": torch.randn(V, C, generator=g),
         "model.norm.weight": torch.ones(C), "lm_head.weight": 0.05 * torch.randn(V, C, generator=g)}
    for l in range(L):
        p = f"model.layers.{l}."
        P[p + "input_layernorm.weight"] = torch.ones(C)
        P[p + "post_attention_layernorm.weight"] = torch.ones(C)
        for m, r in (("q", NH * HS), ("k", NKV * HS), ("v", NKV * HS)):
            P[p + f"self_attn.{m}_proj.weight"] = torch.randn(r, C, generator=g) / math.sqrt(C)
        P[p + "self_attn.o_proj.weight"] = torch.randn(C, C, generator=g) / math.sqrt(C)
        P[p + "mlp.gate_proj.weight"] = torch.randn(I, C, generator=g) / math.sqrt(C)
        P[p + "mlp.up_proj.weight"] = torch.randn(I, C, generator=g) / math.sqrt(C)
        P[p + "mlp.down_proj.weight"] = torch.randn(C, I, generator=g) / math.sqrt(I)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    st_write(os.path.join(d, "model.safetensors"), P, {"format": "pt"})
    return P


# ---- PyTorch: the same model, incremental (cache) or whole (no cache)

def rope_tables():
    inv = 1.0 / (10000.0 ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))
    ang = torch.arange(POS, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def forward(P, cs, ids, p0, cache):
    """Logits of the last of ids (positions p0..), cache: per layer [k, v] or None."""
    cos, sin = cs[0][p0:p0 + len(ids)], cs[1][p0:p0 + len(ids)]
    T = len(ids)

    def rot(x):
        a, b = x[..., : HS // 2], x[..., HS // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    x = P["model.embed_tokens.weight"][ids]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, P[p + "input_layernorm.weight"])
        q = rot((h @ P[p + "self_attn.q_proj.weight"].t()).view(T, NH, HS).transpose(0, 1))
        k = rot((h @ P[p + "self_attn.k_proj.weight"].t()).view(T, NKV, HS).transpose(0, 1))
        v = (h @ P[p + "self_attn.v_proj.weight"].t()).view(T, NKV, HS).transpose(0, 1)
        if cache is not None:
            if cache[l] is not None:
                k, v = torch.cat([cache[l][0], k], 1), torch.cat([cache[l][1], v], 1)
            cache[l] = (k, v)
        k, v = k.repeat_interleave(NH // NKV, 0), v.repeat_interleave(NH // NKV, 0)
        s = q @ k.transpose(-1, -2) / math.sqrt(HS)
        if T > 1:  # query t (position p0 + t) sees keys u <= p0 + t
            s = s + torch.full((T, k.shape[1]), float("-inf")).triu(p0 + 1)
        y = torch.softmax(s, -1) @ v
        x = x + y.transpose(0, 1).reshape(T, C) @ P[p + "self_attn.o_proj.weight"].t()
        h = rms(x, P[p + "post_attention_layernorm.weight"])
        f = torch.nn.functional.silu(h @ P[p + "mlp.gate_proj.weight"].t()) * (h @ P[p + "mlp.up_proj.weight"].t())
        x = x + f @ P[p + "mlp.down_proj.weight"].t()
    return rms(x[-1:], P["model.norm.weight"]) @ P["lm_head.weight"].t()


def torch_gen(P, cs, prompt, n, use_cache):
    with torch.inference_mode():
        t0 = time.perf_counter()
        cache = [None] * L if use_cache else None
        ids = list(prompt)
        lg = forward(P, cs, torch.tensor(ids), 0, cache)
        t1 = time.perf_counter()
        out = []
        for _ in range(n):
            tok = int(torch.argmax(lg))
            out.append(tok)
            ids.append(tok)
            if len(out) == n:
                break
            if use_cache:
                lg = forward(P, cs, torch.tensor([tok]), len(ids) - 1, cache)
            else:
                lg = forward(P, cs, torch.tensor(ids), 0, None)
        t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gen_dump")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d = tempfile.mkdtemp(prefix="bench_gen.")
    P = make_dir(d)
    cs = rope_tables()
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, V, (a.prompt,), generator=g).tolist()
    rows = []
    for mode in ("cache", "no cache"):
        acc, ref = [], []
        for _ in range(a.runs):
            cmd = [a.gen_dump, d, "--prompt", ",".join(map(str, prompt)), "--max", str(a.new),
                   "--threads", str(a.threads), "--positions", str(a.prompt + a.new)] + (["--no-cache"] if mode == "no cache" else [])
            r = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)
            acc.append((a.prompt / r["prefill_s"], (len(r["tokens"]) - 1) / r["decode_s"], r["tokens"]))
            toks, tp, td = torch_gen(P, cs, prompt, a.new, mode == "cache")
            ref.append((a.prompt / tp, (len(toks) - 1) / td, toks))
        same = sum(x == y for x, y in zip(acc[0][2], ref[0][2]))
        for side, v in (("accumd", acc), ("PyTorch " + torch.__version__, ref)):
            rows.append((side, mode, statistics.median(x[0] for x in v),
                         statistics.median(x[1] for x in v)))
        print(f"# {mode}: {same}/{a.new} greedy tokens the same on both sides", flush=True)
    print(f"| side | KV cache | prefill tok/s ({a.prompt}-token prompt) | decode tok/s ({a.new} new) |")
    print("|---|---|---|---|")
    for side, mode, pf, dc in rows:
        print(f"| {side} | {mode} | {pf:.0f} | {dc:.1f} |")


main()

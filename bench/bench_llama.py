#!/usr/bin/python3
"""The bench_llama model in PyTorch (tests/support/llama_ref.py's forward,
autograd, torch.optim.AdamW, fp32) on the same machine: tokens/s of
forward + backward + AdamW, median of --steps after --warmup.

Usage: bench_llama.py [--threads 2] [--batch 8] [--steps 6] [--warmup 2]
                      [--layers 6] [--channels 384] [--heads 6] [--kv-heads 2]
                      [--mlp 1024] [--seq 128] [--vocab 32000]
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
from llama_ref import Config, forward, mean_loss, param_names  # noqa: E402


def main():
    a = {"--threads": 2, "--batch": 8, "--steps": 6, "--warmup": 2, "--layers": 6, "--channels": 384,
         "--heads": 6, "--kv-heads": 2, "--mlp": 1024, "--seq": 128, "--vocab": 32000}
    args = sys.argv[1:]
    for i in range(0, len(args), 2):
        a[args[i]] = int(args[i + 1])
    torch.set_num_threads(a["--threads"])
    cfg = Config({"vocab_size": a["--vocab"], "hidden_size": a["--channels"],
                  "num_hidden_layers": a["--layers"], "num_attention_heads": a["--heads"],
                  "num_key_value_heads": a["--kv-heads"], "intermediate_size": a["--mlp"],
                  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "model_type": "llama"})
    g = torch.Generator().manual_seed(1)
    P = {}
    for n in param_names(cfg):
        if n.endswith("norm.weight"):
            t = torch.ones(cfg.C)
        elif "embed" in n or "lm_head" in n:
            t = 0.02 * torch.randn(cfg.V, cfg.C, generator=g)
        elif "q_proj" in n:
            t = 0.02 * torch.randn(cfg.NH * cfg.hs, cfg.C, generator=g)
        elif "k_proj" in n or "v_proj" in n:
            t = 0.02 * torch.randn(cfg.NKV * cfg.hs, cfg.C, generator=g)
        elif "o_proj" in n:
            t = 0.02 * torch.randn(cfg.C, cfg.NH * cfg.hs, generator=g)
        elif "down" in n:
            t = 0.02 * torch.randn(cfg.C, cfg.I, generator=g)
        else:
            t = 0.02 * torch.randn(cfg.I, cfg.C, generator=g)
        P[n] = t.requires_grad_(True)
    B, T = a["--batch"], a["--seq"]
    tok = torch.randint(0, cfg.V, (B, T), generator=g)
    tgt = torch.randint(0, cfg.V, (B, T), generator=g)
    opt = torch.optim.AdamW(list(P.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    times = []
    for s in range(a["--warmup"] + a["--steps"]):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = mean_loss(forward(cfg, P, tok), tgt)
        loss.backward()
        opt.step()
        if s >= a["--warmup"]:
            times.append(time.perf_counter() - t0)
    times.sort()
    step = times[len(times) // 2]
    print(f"pytorch {torch.__version__} step (median) {step:.4f} s, loss {loss.item():.4f}")
    print(f"pytorch tokens/s  {B * T / step:.0f}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Tiny random Hugging Face Qwen3 and Gemma 2 checkpoints for the tests.

Usage: make_tiny_qwen3_gemma2.py OUTDIR --variant NAME[+NAME...] [--seed N]
                                 [--batch FILE B T]
Variants (one of qwen3 / gemma2, then modifiers):
  qwen3     Qwen3ForCausalLM: 4 heads, 2 KV heads, head_dim 16 (not
            hidden / heads = 8), q_norm / k_norm, untied head
  gemma2    Gemma2ForCausalLM: 4 heads, 2 KV heads, head_dim 16,
            query_pre_attn_scalar 24, soft-capping small enough to bend
            these logits (attention 1, final 4), sliding_window 5 on the
            even layers, 3 layers, tied head
  tied      tie_word_embeddings (Qwen3)
  bias      attention_bias (Qwen3: q/k/v/o biases)
  types     Gemma 2's layer_types written out (sliding, full, sliding)
  hfcaps    Gemma 2's published caps (attention 50, final 30)
  sharded   3 shards + model.safetensors.index.json
  bf16      tensors stored BF16 (torch_dtype bfloat16)
Writes config.json, generation_config.json, tokenizer.json and the
weights (make_tiny_llama.save); --batch FILE B T writes I32 "tokens" and
"targets" [B, T].
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import st_write  # noqa: E402
from make_tiny_llama import save  # noqa: E402
from qwen3_gemma2_ref import Config, param_names, param_shape  # noqa: E402


def make_config(variants):
    base = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64,
            "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
            "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "float32", "transformers_version": "4.51.0", "use_cache": True}
    if "qwen3" in variants:
        c = dict(base, architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=2,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu",
                 tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
                 max_window_layers=2)
    elif "gemma2" in variants:
        c = dict(base, architectures=["Gemma2ForCausalLM"], model_type="gemma2", num_hidden_layers=3,
                 rms_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
                 hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                 attn_logit_softcapping=1.0, final_logit_softcapping=4.0, sliding_window=5,
                 cache_implementation="hybrid", tie_word_embeddings=True, pad_token_id=0)
    else:
        sys.exit("a variant needs qwen3 or gemma2")
    for v in variants:
        if v == "tied":
            c["tie_word_embeddings"] = True
        elif v == "bias":
            c["attention_bias"] = True
        elif v == "types":
            c["layer_types"] = ["sliding_attention" if l % 2 == 0 else "full_attention"
                                for l in range(c["num_hidden_layers"])]
        elif v == "hfcaps":
            c.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
        elif v == "bf16":
            c["torch_dtype"] = "bfloat16"
        elif v not in ("qwen3", "gemma2", "sharded"):
            sys.exit(f"unknown variant {v}")
    return c


def make_params(c, seed):
    cfg = Config(c)
    g = torch.Generator().manual_seed(seed)
    P = {}
    for n in param_names(cfg):
        shape = param_shape(cfg, n)
        if n.endswith("norm.weight"):  # Gemma's are offsets from 1
            t = (0.0 if cfg.kind == "gemma2" else 1.0) + 0.1 * torch.randn(shape, generator=g)
        elif n.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=g)
        else:
            t = 0.8 * torch.randn(shape, generator=g) / (shape[1] ** 0.5)
        P[n] = t
    return P


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out, args = sys.argv[1], sys.argv[2:]
    variant, seed, batch = "qwen3", 1, None
    i = 0
    while i < len(args):
        if args[i] == "--variant":
            variant, i = args[i + 1], i + 2
        elif args[i] == "--seed":
            seed, i = int(args[i + 1]), i + 2
        elif args[i] == "--batch":
            batch, i = (args[i + 1], int(args[i + 2]), int(args[i + 3])), i + 4
        else:
            sys.exit(f"unknown argument {args[i]}")
    variants = variant.split("+")
    c = make_config(variants)
    dtype = torch.bfloat16 if "bf16" in variants else torch.float32
    save(out, c, make_params(c, seed), 3 if "sharded" in variants else 1, dtype)
    if batch:
        path, B, T = batch
        g = torch.Generator().manual_seed(seed + 1000)
        seq = torch.randint(0, c["vocab_size"], (B, T + 1), generator=g, dtype=torch.int64)
        st_write(path, {"tokens": seq[:, :-1].to(torch.int32), "targets": seq[:, 1:].to(torch.int32)})


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Tiny random Hugging Face LLaMA-family checkpoints for the tests.

Usage: make_tiny_llama.py OUTDIR [--variant NAME] [--seed N] [--batch FILE B T]
                                 [--bad KIND]
Variants (combinable with '+', e.g. gqa+bf16+sharded):
  mha       4 heads, 4 KV heads (the default base)
  gqa       4 heads, 2 KV heads
  theta500k rope_theta 500000 (LLaMA-3)
  llama3    rope_scaling llama3 (factor 8, low 1, high 4, original 16)
  linear    rope_scaling linear (factor 2)
  tied      tie_word_embeddings (no lm_head.weight)
  qwen2     Qwen2ForCausalLM: q/k/v biases
  bias      LLaMA attention_bias: q/k/v/o biases
  mistral   MistralForCausalLM
  sharded   3 shards + model.safetensors.index.json
  bf16      tensors stored BF16 (torch_dtype bfloat16); f16 likewise F16
  big       2 layers of 64 channels, vocab 300 (split / planner tests)
  vocab32k  vocab 32000 (Mistral's tokenizer), 128 positions (SFT tests)
  deep      4 layers (bf16 activation storage: three blocks stored)
The directory also gets generation_config.json and a tokenizer.json (copied
by accumd on save). --batch FILE B T writes a batch (I32 tokens, targets
[B, T]) for llama_ref.py / the C tests. --bad KIND breaks the checkpoint
(one of: arch, model_type, missing, extra, shape, dtype, rope, shard,
config_dtype) for the error tests.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import Config, param_names, st_write  # noqa: E402


def make_config(variants):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96,
         "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 64,
         "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
         "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2,
         "torch_dtype": "float32", "transformers_version": "4.44.0", "use_cache": True}
    for v in variants:
        if v == "gqa":
            c["num_key_value_heads"] = 2
        elif v == "theta500k":
            c["rope_theta"] = 500000.0
        elif v == "llama3":
            c["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
        elif v == "linear":
            c["rope_scaling"] = {"type": "linear", "factor": 2.0}
        elif v == "tied":
            c["tie_word_embeddings"] = True
        elif v == "qwen2":
            c["architectures"], c["model_type"] = ["Qwen2ForCausalLM"], "qwen2"
            del c["attention_bias"]
            c["use_sliding_window"] = False
        elif v == "mistral":
            c["architectures"], c["model_type"] = ["MistralForCausalLM"], "mistral"
            del c["attention_bias"]
            c["sliding_window"] = 4096
        elif v == "bias":
            c["attention_bias"] = True
        elif v == "bf16":
            c["torch_dtype"] = "bfloat16"
        elif v == "f16":
            c["torch_dtype"] = "float16"
        elif v == "big":
            c.update(hidden_size=64, intermediate_size=96, vocab_size=300)
        elif v == "deep":
            c["num_hidden_layers"] = 4
        elif v == "vocab32k":
            c.update(vocab_size=32000, max_position_embeddings=128)
        elif v in ("mha", "sharded", ""):
            pass
        else:
            sys.exit(f"unknown variant {v}")
    return c


def make_params(c, seed):
    cfg = Config(c)
    g = torch.Generator().manual_seed(seed)
    P = {}
    for n in param_names(cfg):
        if n.endswith("layernorm.weight") or n == "model.norm.weight":
            shape = [cfg.C]
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif n.endswith(".bias"):
            rows = {"q": cfg.NH * cfg.hs, "k": cfg.NKV * cfg.hs, "v": cfg.NKV * cfg.hs, "o": cfg.C}
            t = 0.1 * torch.randn([rows[n.split("self_attn.")[1][0]]], generator=g)
        else:
            if n == "model.embed_tokens.weight" or n == "lm_head.weight":
                shape = [cfg.V, cfg.C]
            elif "q_proj" in n:
                shape = [cfg.NH * cfg.hs, cfg.C]
            elif "k_proj" in n or "v_proj" in n:
                shape = [cfg.NKV * cfg.hs, cfg.C]
            elif "o_proj" in n:
                shape = [cfg.C, cfg.NH * cfg.hs]
            elif "gate_proj" in n or "up_proj" in n:
                shape = [cfg.I, cfg.C]
            else:
                shape = [cfg.C, cfg.I]
            t = 0.2 * torch.randn(shape, generator=g) / (shape[1] ** 0.5) * 4
        P[n] = t
    return P


def save(out, c, P, nshards, dtype):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "_from_model_config": True}, f)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}, f)
    P = {n: t.to(dtype) for n, t in P.items()}
    names = list(P)
    if nshards <= 1:
        st_write(os.path.join(out, "model.safetensors"), P, {"format": "pt"})
        return
    per = (len(names) + nshards - 1) // nshards
    wmap, total = {}, 0
    for s in range(nshards):
        fn = f"model-{s + 1:05d}-of-{nshards:05d}.safetensors"
        part = {n: P[n] for n in names[s * per:(s + 1) * per]}
        st_write(os.path.join(out, fn), part, {"format": "pt"})
        for n, t in part.items():
            wmap[n] = fn
            total += t.numel() * t.element_size()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)


def break_it(out, kind, c, P, nshards, dtype):
    """The checkpoint with one defect of `kind`."""
    if kind == "arch":
        c["architectures"] = ["FalconForCausalLM"]
    elif kind == "model_type":
        del c["architectures"]
        c["model_type"] = "falcon"
    elif kind == "missing":
        del P["model.layers.1.mlp.up_proj.weight"]
    elif kind == "extra":
        P["model.layers.0.self_attn.extra.weight"] = torch.zeros(4)
    elif kind == "shape":
        P["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(8, c["hidden_size"])
    elif kind == "dtype":
        P["model.norm.weight"] = torch.zeros(c["hidden_size"], dtype=torch.int32)
    elif kind == "config_dtype":
        c["torch_dtype"] = "bfloat16"  # but the tensors are F32
    elif kind == "rope":
        c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    elif kind != "shard":
        sys.exit(f"unknown defect {kind}")
    conv = {n: (t if t.dtype == torch.int32 else t.to(dtype)) for n, t in P.items()}
    save(out, c, {n: t for n, t in conv.items()}, nshards, dtype)
    if kind == "shard":
        os.remove(os.path.join(out, f"model-00002-of-{nshards:05d}.safetensors"))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out, args = sys.argv[1], sys.argv[2:]
    variant, seed, bad, batch = "mha", 1, None, None
    i = 0
    while i < len(args):
        if args[i] == "--variant":
            variant, i = args[i + 1], i + 2
        elif args[i] == "--seed":
            seed, i = int(args[i + 1]), i + 2
        elif args[i] == "--bad":
            bad, i = args[i + 1], i + 2
        elif args[i] == "--batch":
            batch, i = (args[i + 1], int(args[i + 2]), int(args[i + 3])), i + 4
        else:
            sys.exit(f"unknown argument {args[i]}")
    variants = variant.split("+")
    c = make_config(variants)
    P = make_params(c, seed)
    nshards = 3 if "sharded" in variants or bad == "shard" else 1
    dtype = torch.bfloat16 if "bf16" in variants else torch.float16 if "f16" in variants else torch.float32
    if bad:
        break_it(out, bad, c, P, nshards, dtype)
    else:
        save(out, c, P, nshards, dtype)
    if batch:
        path, B, T = batch
        g = torch.Generator().manual_seed(seed + 1000)
        seq = torch.randint(0, c["vocab_size"], (B, T + 1), generator=g, dtype=torch.int64)
        st_write(path, {"tokens": seq[:, :-1].to(torch.int32), "targets": seq[:, 1:].to(torch.int32)})


if __name__ == "__main__":
    main()

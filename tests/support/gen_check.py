#!/usr/bin/python3
"""accumd's generation (core/model/generate.h) against a PyTorch reference
written here.

Usage: gen_check.py GEN_DUMP   (the tests/support/gen_dump binary)
Exit 77 (skip) when this Python has no torch.

On tiny checkpoints generated here (LLaMA with grouped-query attention,
Qwen2 with its q/k/v biases, GPT-2 with a byte-level tokenizer):
  - greedy generation of 20 tokens equals argmax decoding by full forward
    passes of the reference below (float64), for each family;
  - the key/value cache gives the tokens a full forward per token gives
    (greedy and sampled);
  - a seeded sampled generation gives the same tokens on every run and on
    1 or 2 threads, and another seed gives other tokens;
  - LoRA adapters applied unmerged generate what the merged model does (and
    not what the base model does), also read back from their PEFT directory;
  - max_new_tokens, an eos id (given and from generation_config.json) and
    stop strings end the generation; the streamed pieces make up the text;
  - a conversation is rendered with the generation prompt;
  - a model with bf16 weights keeps its key/value cache in bf16: its greedy
    tokens equal the reference's with the keys (after RoPE) and values
    rounded to bf16 where they are cached, and differ from the reference's
    with an fp32 cache.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    if os.environ.get("ACCUMD_REQUIRE_REFS"):
        print("FAIL: gen_check: no torch in this Python (ACCUMD_REQUIRE_REFS is set)")
        sys.exit(1)
    print("gen_check: no torch in this Python: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from llama_ref import st_read, st_write  # noqa: E402  (safetensors files only)

PY = sys.executable
GEN = sys.argv[1]
failures = []


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def gen(d, *args):
    out = run([GEN, d] + [str(a) for a in args]).strip().splitlines()
    return json.loads(out[-1]), [json.loads(x) for x in out[:-1]]


def check(what, ok, detail):
    print(f"  {'ok' if ok else 'FAIL':4} {what}: {detail}")
    if not ok:
        failures.append(what)


# ---- checkpoints

def make_decoder(d, qwen2, seed, dtype="float32", qk_scale=1.0):
    """A LLaMA (or Qwen2) directory: 4 query heads, 2 key/value heads; its
    weights stored in `dtype` (float32 or bfloat16); q and k weights
    qk_scale times larger (sharper attention)."""
    V, C, L, NH, NKV, I = 96, 32, 2, 4, 2, 48
    g = torch.Generator().manual_seed(seed)
    c = {"architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
         "model_type": "qwen2" if qwen2 else "llama", "vocab_size": V, "hidden_size": C,
         "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": NH,
         "num_key_value_heads": NKV, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "max_position_embeddings": 64, "tie_word_embeddings": False, "hidden_act": "silu",
         "torch_dtype": dtype, "bos_token_id": 1, "eos_token_id": 2}
    hs = C // NH

    def rnd(*shape, s=1.0):
        return s * torch.randn(*shape, generator=g)

    P = {"model.embed_tokens.weight": rnd(V, C), "model.norm.weight": 1 + rnd(C, s=0.1),
         "lm_head.weight": rnd(V, C, s=0.5)}
    for l in range(L):
        p = f"model.layers.{l}."
        P[p + "input_layernorm.weight"] = 1 + rnd(C, s=0.1)
        P[p + "post_attention_layernorm.weight"] = 1 + rnd(C, s=0.1)
        for m, rows in (("q", NH * hs), ("k", NKV * hs), ("v", NKV * hs)):
            P[p + f"self_attn.{m}_proj.weight"] = rnd(rows, C, s=C ** -0.5 * (qk_scale if m != "v" else 1.0))
            if qwen2:
                P[p + f"self_attn.{m}_proj.bias"] = rnd(rows, s=0.2)
        P[p + "self_attn.o_proj.weight"] = rnd(C, NH * hs, s=(NH * hs) ** -0.5)
        P[p + "mlp.gate_proj.weight"] = rnd(I, C, s=C ** -0.5)
        P[p + "mlp.up_proj.weight"] = rnd(I, C, s=C ** -0.5)
        P[p + "mlp.down_proj.weight"] = rnd(C, I, s=I ** -0.5)
    save(d, c, P, torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    return c


def make_gpt2(d, seed):
    """A GPT-2 directory (Conv1D weights [in, out]) over the byte tokenizer's 258 ids."""
    V, C, L, NH, NP = 258, 32, 2, 4, 64
    run([PY, os.path.join(HERE, "byte_tokenizer.py"), d])  # creates d
    g = torch.Generator().manual_seed(seed)
    c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V,
         "n_embd": C, "n_layer": L, "n_head": NH, "n_positions": NP, "n_ctx": NP,
         "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
         "torch_dtype": "float32", "bos_token_id": 0, "eos_token_id": 1}

    def rnd(*shape, s=1.0):
        return s * torch.randn(*shape, generator=g)

    P = {"wte.weight": rnd(V, C, s=0.3), "wpe.weight": rnd(NP, C, s=0.5),
         "ln_f.weight": 1 + rnd(C, s=0.1), "ln_f.bias": rnd(C, s=0.1)}
    for l in range(L):
        p = f"h.{l}."
        for n in ("ln_1", "ln_2"):
            P[p + n + ".weight"] = 1 + rnd(C, s=0.1)
            P[p + n + ".bias"] = rnd(C, s=0.1)
        for n, i, o in (("attn.c_attn", C, 3 * C), ("attn.c_proj", C, C),
                        ("mlp.c_fc", C, 4 * C), ("mlp.c_proj", 4 * C, C)):
            P[p + n + ".weight"] = rnd(i, o, s=3 * i ** -0.5)
            P[p + n + ".bias"] = rnd(o, s=0.1)
    save(d, c, P)
    return c


def save(d, c, P, dtype=torch.float32):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": c["eos_token_id"]}, f)
    st_write(os.path.join(d, "model.safetensors"), {n: t.to(dtype) for n, t in P.items()},
             {"format": "pt"})


# ---- the reference: full forward passes, float64

def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def bf16(t):
    """t rounded to bf16 through fp32 (as the engine's fp32 values are)."""
    return t.float().bfloat16().double()


def decoder_logits(c, P, ids, kv16=False):
    T, C, NH, NKV = len(ids), c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hs, eps, qwen2 = C // NH, c["rms_norm_eps"], c["model_type"] == "qwen2"
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)

    def rot(x):  # [H, T, hs], pairs (i, i + hs/2)
        a, b = x[..., : hs // 2], x[..., hs // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    x = P["model.embed_tokens.weight"][torch.tensor(ids)]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"], eps)

        def proj(m, H):
            y = h @ P[p + f"self_attn.{m}_proj.weight"].t()
            if qwen2:
                y = y + P[p + f"self_attn.{m}_proj.bias"]
            return y.view(T, H, hs).transpose(0, 1)

        q, k, v = rot(proj("q", NH)), rot(proj("k", NKV)), proj("v", NKV)
        if kv16:  # a 16-bit model's cache: keys (after RoPE) and values stored as bf16
            k, v = bf16(k), bf16(v)
        k, v = k.repeat_interleave(NH // NKV, 0), v.repeat_interleave(NH // NKV, 0)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hs) + mask, -1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ P[p + "self_attn.o_proj.weight"].t()
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
        f = torch.nn.functional.silu(h @ P[p + "mlp.gate_proj.weight"].t())
        x = x + (f * (h @ P[p + "mlp.up_proj.weight"].t())) @ P[p + "mlp.down_proj.weight"].t()
    x = rmsnorm(x, P["model.norm.weight"], eps)
    return x[-1] @ P["lm_head.weight"].t()


def gpt2_logits(c, P, ids):
    T, C, NH = len(ids), c["n_embd"], c["n_head"]
    hs = C // NH
    ln = torch.nn.functional.layer_norm
    gelu = lambda z: 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))  # noqa: E731
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    x = P["wte.weight"][torch.tensor(ids)] + P["wpe.weight"][:T]
    for l in range(c["n_layer"]):
        p = f"h.{l}."
        h = ln(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], 1e-5)
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = (t.view(T, NH, hs).transpose(0, 1) for t in qkv.split(C, -1))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hs) + mask, -1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
        h = ln(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], 1e-5)
        f = gelu(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"])
        x = x + f @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
    x = ln(x, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
    return x[-1] @ P["wte.weight"].t()


def ref_greedy(d, c, prompt, n, kv16=False):
    P = {k: t.double() for k, t in st_read(os.path.join(d, "model.safetensors")).items()}
    ids, out, gaps = list(prompt), [], []
    for _ in range(n):
        lg = gpt2_logits(c, P, ids) if c["model_type"] == "gpt2" else decoder_logits(c, P, ids, kv16)
        top = torch.topk(lg, 2).values
        gaps.append((top[0] - top[1]).item())
        ids.append(int(torch.argmax(lg)))
        out.append(ids[-1])
    return out, min(gaps)


# ---- the checks

def main():
    tmp = tempfile.mkdtemp(prefix="gen_check.")
    models = {"llama": os.path.join(tmp, "llama"), "qwen2": os.path.join(tmp, "qwen2"),
              "gpt2": os.path.join(tmp, "gpt2")}
    cfgs = {"llama": make_decoder(models["llama"], False, 11),
            "qwen2": make_decoder(models["qwen2"], True, 12),
            "gpt2": make_gpt2(models["gpt2"], 13)}
    prompt = [3, 17, 42, 5, 60, 8]
    pstr = ",".join(map(str, prompt))
    for name, d in models.items():
        print(f"{name}:")
        want, gap = ref_greedy(d, cfgs[name], prompt, 20)
        got, _ = gen(d, "--prompt", pstr, "--max", 20)
        check(f"{name} greedy = reference argmax", got["tokens"] == want,
              f"{got['tokens']} vs {want} (smallest top-2 gap {gap:.2e})")
        check(f"{name} greedy varies", len(set(want)) > 3, f"{len(set(want))} distinct tokens")
        nc, _ = gen(d, "--prompt", pstr, "--max", 20, "--no-cache")
        check(f"{name} cache = no cache (greedy)", nc["tokens"] == got["tokens"], str(nc["tokens"]))
        check(f"{name} max_new_tokens", len(got["tokens"]) == 20 and got["reason"] == "length",
              f"{len(got['tokens'])} {got['reason']}")
        samp = ["--prompt", pstr, "--max", 20, "--temp", 1.0, "--top-k", 40, "--top-p", 0.95,
                "--rep", 1.1, "--seed", 1234]
        s1, _ = gen(d, *samp)
        s2, _ = gen(d, *samp, "--threads", 2)
        s3, _ = gen(d, *samp)
        s4, _ = gen(d, *samp, "--no-cache")
        other, _ = gen(d, *samp[:-1], 99)
        check(f"{name} seeded sampling repeats (1 and 2 threads)",
              s1["tokens"] == s2["tokens"] == s3["tokens"], str(s1["tokens"]))
        check(f"{name} sampled: cache = no cache", s4["tokens"] == s1["tokens"], str(s4["tokens"]))
        check(f"{name} another seed, other tokens", other["tokens"] != s1["tokens"],
              str(other["tokens"]))
        # eos: the 5th greedy token given as eos, then through generation_config.json
        eos = got["tokens"][4]
        first = got["tokens"].index(eos)
        e1, _ = gen(d, "--prompt", pstr, "--max", 20, "--eos", eos)
        check(f"{name} eos id", e1["tokens"] == got["tokens"][:first] and e1["reason"] == "eos",
              f"{e1['tokens']} {e1['reason']}")
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": [1000, eos]}, f)
        e2, _ = gen(d, "--prompt", pstr, "--max", 20, "--eos-dir")
        check(f"{name} eos from generation_config.json", e2["tokens"] == e1["tokens"],
              f"{e2['tokens']} {e2['reason']}")
        # LoRA unmerged vs the merged model
        merged = d + "-merged"
        targets = "all-linear"
        adir = d + "-adapter"
        lo, _ = gen(d, "--prompt", pstr, "--max", 20, "--lora", f"4,8,{targets}", "--lora-seed", 5,
                    "--save-merged", merged, "--save-adapter", adir)
        mg, _ = gen(merged, "--prompt", pstr, "--max", 20)
        check(f"{name} LoRA unmerged = merged", lo["tokens"] == mg["tokens"], str(lo["tokens"]))
        ad, _ = gen(d, "--prompt", pstr, "--max", 20, "--adapter", adir)
        check(f"{name} LoRA from its PEFT directory = merged", ad["tokens"] == mg["tokens"],
              str(ad["tokens"]))
        check(f"{name} LoRA changes the output", lo["tokens"] != got["tokens"], "")

    # a 16-bit model: its key/value cache in bf16, against the reference with
    # the keys and values rounded to bf16 where they are cached; the rounding
    # must show (another answer than the unrounded reference's) for the
    # check to mean something
    d = os.path.join(tmp, "llama-bf16")
    c16 = make_decoder(d, False, 21, "bfloat16", qk_scale=4.0)
    print("llama bf16:")
    want16, gap16 = ref_greedy(d, c16, prompt, 20, kv16=True)
    want32, _ = ref_greedy(d, c16, prompt, 20)
    got16, _ = gen(d, "--prompt", pstr, "--max", 20)
    check("bf16 cache greedy = reference with a bf16 cache", got16["tokens"] == want16,
          f"{got16['tokens']} vs {want16} (smallest top-2 gap {gap16:.2e})")
    check("the bf16 rounding changes the answer (the check above discriminates)", want16 != want32,
          f"fp32-cache reference {want32}")

    # text: stop strings, streaming, chat rendering (GPT-2 over the byte tokenizer)
    d = models["gpt2"]
    print("gpt2 text:")
    full, pieces = gen(d, "--text", "Hello there", "--tok", d, "--max", 40, "--stream")
    text = full["text"]
    check("streamed pieces make up the text", "".join(p["piece"] for p in pieces) == text,
          repr(text))
    stop = text[10:13] if len(text) >= 13 else text[-2:]
    cut = text[: text.find(stop)]
    st, pieces = gen(d, "--text", "Hello there", "--tok", d, "--max", 40, "--stop", stop,
                     "--stream")
    check("stop string cuts the text", st["text"] == cut and st["reason"] == "stop",
          f"{st['text']!r} vs {cut!r} ({st['reason']})")
    check("nothing past the stop string streamed",
          "".join(p["piece"] for p in pieces) == cut, "")
    want = list(b"Hello there")
    check("text prompt encoded", full["prompt"] == [b + 2 for b in want], str(full["prompt"][:8]))
    msgs = json.dumps([{"role": "user", "content": "Hi"}])
    ch, _ = gen(d, "--chat", msgs, "--tok", d, "--template", "chatml", "--max", 5)
    tail = [b + 2 for b in b"<|im_start|>assistant\n"]
    check("chat rendered with the generation prompt", ch["prompt"][-len(tail):] == tail,
          f"{len(ch['prompt'])} prompt tokens")
    if failures:
        print(f"FAIL: {len(failures)} check(s): {', '.join(failures)}")
        sys.exit(1)
    print("gen_check: all ok")


main()

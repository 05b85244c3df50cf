#!/usr/bin/python3
"""accumd's Qwen3 and Gemma 2 families against the PyTorch reference
(qwen3_gemma2_ref.py, written from the architectures).

Usage: qwen3_gemma2_check.py HF_DUMP   (the tests/support/hf_dump binary)
Exit 77 (skip) when this Python has no torch (1 with ACCUMD_REQUIRE_REFS).

On tiny checkpoints generated here (make_tiny_qwen3_gemma2.py): Qwen3
untied, tied with attention biases and sharded; Gemma 2 with caps that bend
the tiny model, with layer_types and BF16 tensors, with the published caps:
  - logits, the loss, every parameter's gradient (per tensor, relative to
    its largest reference value) and the losses of 10 AdamW steps within
    1e-5 (fp32 both sides);
  - the same with the batch in micro batches of 1 (accumulation) and of 2
    in recompute mode;
  - LoRA on every linear layer: the adapters' gradients at accumd's seeded
    start and the losses of 10 AdamW steps of the adapters alone (PEFT's
    formula, lora_check.lora_fn) within 1e-5, the frozen weights unchanged;
  - Hugging Face directory in, Hugging Face directory out: the saved
    directory has exactly the input's tensor names and shapes and its
    config.json keys, loads back to identical tensors, and the reference's
    loss on a directory saved after 5 steps is accumd's.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    if os.environ.get("ACCUMD_REQUIRE_REFS"):
        print("FAIL: qwen3_gemma2_check: no torch in this Python (ACCUMD_REQUIRE_REFS is set)")
        sys.exit(1)
    print("qwen3_gemma2_check: no torch in this Python: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen3_gemma2_ref as ref_mod  # noqa: E402
from llama_ref import load_dir, mean_loss, read_batch, st_read  # noqa: E402
from lora_check import lora_fn  # noqa: E402

PY = sys.executable
STEPS = 10
TOL = 1e-5
OPT = ["--lr", "1e-3", "--wd", "0.1", "--beta1", "0.9", "--beta2", "0.95", "--eps", "1e-8"]
LORA_OPT = ["--lr", "1e-2", "--wd", "0.0", "--beta1", "0.9", "--beta2", "0.95", "--eps", "1e-8"]
failures = []


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def rel(a, b):
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def check(what, ok, detail):
    print(f"  {'ok' if ok else 'FAIL':4} {what}: {detail}")
    if not ok:
        failures.append(what)


def worst_grad(ours, ref, names):
    worst, wname = 0.0, ""
    for n in names:
        r = rel(ours[n], ref[n]) if n in ours else float("inf")
        if r > worst:
            worst, wname = r, n
    return worst, wname


def compare(tag, ours, ref):
    check(f"{tag} logits", rel(ours["logits"], ref["logits"]) <= TOL,
          f"{rel(ours['logits'], ref['logits']):.2e}")
    lo, lr = ours["loss"].item(), ref["loss"].item()
    check(f"{tag} loss", abs(lo - lr) <= TOL * abs(lr), f"{lo:.7f} vs {lr:.7f}")
    names = [n for n in ref if n.startswith("grad.")]
    ngot = len([n for n in ours if n.startswith("grad.")])
    worst, wname = worst_grad(ours, ref, names)
    check(f"{tag} gradients ({len(names)} tensors)", worst <= TOL and ngot == len(names),
          f"worst {worst:.2e} ({wname}), accumd has {ngot}")
    lo, lr = ours["losses"].double(), ref["losses"].double()
    d = ((lo - lr).abs() / lr.abs()).max().item()
    check(f"{tag} {STEPS} AdamW losses", d <= TOL and len(lo) == STEPS,
          f"worst {d:.2e}; {lr[0].item():.5f} -> {lr[-1].item():.5f}")


def make(tmp, variant, seed):
    d = os.path.join(tmp, variant)
    run([PY, os.path.join(HERE, "make_tiny_qwen3_gemma2.py"), d, "--variant", variant,
         "--seed", str(seed), "--batch", d + ".batch", "4", "16"])
    return d, d + ".batch"


def ours(dump, d, batch, tag, extra=(), steps=STEPS, opt=OPT):
    out = f"{d}.{tag}.ours"
    run([dump, d, batch, out, "--steps", str(steps)] + opt + list(extra))
    return st_read(out)


def reference(d, batch):
    out = d + ".ref"
    run([PY, os.path.join(HERE, "qwen3_gemma2_ref.py"), "run", d, batch, out, "--steps", str(STEPS)]
        + OPT)
    return st_read(out)


def lora_case(dump, d, batch, tag):
    """all-linear adapters, r 4, alpha 8: gradients at accumd's start and 10
    AdamW steps of the adapters alone, against autograd with PEFT's formula."""
    got = ours(dump, d, batch, "lora", ["--lora", "4,8,all-linear"], opt=LORA_OPT)
    cfg, P = ref_mod.load_params(d, False)
    for p in P.values():
        p.requires_grad_(False)
    tokens, targets = read_batch(batch)
    ad = {n[len("param."):]: t.clone().requires_grad_(True) for n, t in got.items()
          if n.startswith("param.")}
    check(f"{tag} lora: adapters on all 7 linears of every layer", len(ad) == 2 * 7 * cfg.L,
          f"{len(ad)} tensors")
    loss = mean_loss(ref_mod.forward(cfg, P, tokens, lora_fn(ad, 8 / 4)), targets)
    loss.backward()
    worst, wname = worst_grad(got, {"grad." + n: t.grad for n, t in ad.items()},
                              ["grad." + n for n in ad])
    check(f"{tag} lora: adapter gradients", worst <= TOL, f"worst {worst:.2e} ({wname})")
    o = torch.optim.AdamW(list(ad.values()), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    losses = []
    for _ in range(STEPS):
        o.zero_grad()
        loss = mean_loss(ref_mod.forward(cfg, P, tokens, lora_fn(ad, 8 / 4)), targets)
        loss.backward()
        losses.append(loss.item())
        o.step()
    lr, lo = torch.tensor(losses, dtype=torch.float64), got["losses"].double()
    dd = ((lo - lr).abs() / lr.abs()).max().item()
    check(f"{tag} lora: {STEPS} AdamW losses", dd <= TOL and lr[-1] < lr[0],
          f"worst {dd:.2e}; {lr[0].item():.5f} -> {lr[-1].item():.5f}")
    check(f"{tag} lora: frozen weights unchanged", got["frozen_changed"].item() == 0,
          f"{int(got['frozen_changed'].item())} floats changed")


def round_trip(dump, d, batch, tag):
    c_in, t_in = load_dir(d)
    saved = d + ".saved"
    first = ours(dump, d, batch, "rt1", ["--save", saved], steps=0)
    c_out, t_out = load_dir(saved)
    same = {n: list(t.shape) for n, t in t_in.items()} == {n: list(t.shape) for n, t in t_out.items()}
    check(f"{tag} saved tensor names and shapes = the input's", same, f"{len(t_out)} tensors")
    keys = ["architectures", "model_type", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "hidden_size", "head_dim", "intermediate_size", "vocab_size",
            "rms_norm_eps", "rope_theta", "tie_word_embeddings", "query_pre_attn_scalar",
            "attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "layer_types"]
    diff = [k for k in keys if k in c_in and c_in[k] != c_out.get(k)]
    check(f"{tag} saved config.json keys", not diff, f"differ: {diff}" if diff else "alike")
    second = ours(dump, saved, batch, "rt2", steps=0)
    params = [n for n in first if n.startswith("param.")]
    check(f"{tag} load, save, load: identical tensors",
          params and all(torch.equal(first[n], second[n]) for n in params), f"{len(params)} tensors")
    trained = d + ".trained"
    after = ours(dump, d, batch, "tr", ["--save", trained], steps=5)
    ol = ours(dump, trained, batch, "tr2", steps=0)["loss"].item()
    rl = float(run([PY, os.path.join(HERE, "qwen3_gemma2_ref.py"), "loss", trained, batch]).strip())
    check(f"{tag} reference loss after 5 steps, saved", abs(rl - ol) <= TOL * abs(rl) and
          ol < after["losses"][0].item(), f"{rl:.7f} vs {ol:.7f}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    dump = sys.argv[1]
    torch.set_num_threads(1)
    variants = ["qwen3", "qwen3+tied+bias+sharded", "gemma2", "gemma2+types+bf16", "gemma2+hfcaps"]
    with tempfile.TemporaryDirectory(prefix="accumd-qg-") as tmp:
        for i, v in enumerate(variants):
            print(f"{v}:")
            d, batch = make(tmp, v, seed=i + 1)
            ref = reference(d, batch)
            compare(v, ours(dump, d, batch, "full"), ref)
            if v in ("qwen3", "gemma2"):
                compare(v + " micro 1", ours(dump, d, batch, "m1", ["--micro", "1"]), ref)
                compare(v + " micro 2 recompute", ours(dump, d, batch, "m2r",
                                                       ["--micro", "2", "--recompute"]), ref)
                lora_case(dump, d, batch, v)
                round_trip(dump, d, batch, v)
    if failures:
        print(f"qwen3_gemma2_check: {len(failures)} FAILED: {', '.join(failures)}")
        sys.exit(1)
    print("qwen3_gemma2_check: all passed")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""accumd's LoRA against the PyTorch reference (llama_ref.py with PEFT's
formula written here: y = W x + (alpha / r) B (A x)).

Usage: lora_check.py HF_DUMP   (the tests/support/hf_dump binary)
Exit 77 (skip) when this Python has no torch.

On tiny generated checkpoints (one stored in bf16, one in f16: accumd keeps
their frozen base in that dtype on the device, the reference widens the same
values), with accumd's seeded initial adapters (B is 0
at init, so they are first moved by 5 AdamW steps in a second run):
  - the loss and every adapter gradient within 1e-4 of autograd's (float64),
    also split into micro batches with recompute;
  - the frozen weights bit-for-bit unchanged after training;
  - the adapter directory: PEFT's config keys and tensor names and shapes,
    and the reference with that adapter applied gives accumd's loss;
  - the merged model's logits equal base + adapter's within 1e-5.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("lora_check: no torch in this Python: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
from llama_ref import st_read  # noqa: E402

PY = sys.executable
OPT = ["--lr", "1e-2", "--wd", "0.0", "--beta1", "0.9", "--beta2", "0.95", "--eps", "1e-8"]
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
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


def peft_names(cfg, targets, r):
    """PEFT's adapter tensor names and shapes for these modules."""
    out = {}
    dims = {"q_proj": (cfg.NH * cfg.hs, cfg.C), "k_proj": (cfg.NKV * cfg.hs, cfg.C),
            "v_proj": (cfg.NKV * cfg.hs, cfg.C), "o_proj": (cfg.C, cfg.NH * cfg.hs),
            "gate_proj": (cfg.I, cfg.C), "up_proj": (cfg.I, cfg.C), "down_proj": (cfg.C, cfg.I)}
    for l in range(cfg.L):
        for m in targets:
            base = f"base_model.model.model.layers.{l}.{'self_attn' if m in ATTN else 'mlp'}.{m}"
            o, i = dims[m]
            out[base + ".lora_A.weight"] = [r, i]
            out[base + ".lora_B.weight"] = [o, r]
    return out


def lora_fn(adapters, scale):
    """PEFT's LoRA layer: x -> scale * (x A^T) B^T, adapters by PEFT name."""
    def f(x, wname):
        mod = "base_model.model." + wname[: -len(".weight")]
        a = adapters.get(mod + ".lora_A.weight")
        if a is None:
            return 0
        return scale * ((x @ a.t()) @ adapters[mod + ".lora_B.weight"].t())
    return f


def ref_grads(d, batch, adapters, scale):
    cfg, P = llama_ref.load_params(d, True)
    tokens, targets = llama_ref.read_batch(batch)
    ad = {n: t.double().clone().requires_grad_(True) for n, t in adapters.items()}
    loss = llama_ref.mean_loss(llama_ref.forward(cfg, P, tokens, lora_fn(ad, scale)), targets)
    loss.backward()
    return cfg, loss.item(), {n: t.grad for n, t in ad.items()}


def ref_logits(d, batch, adapters=None, scale=0.0):
    cfg, P = llama_ref.load_params(d, True)
    tokens, targets = llama_ref.read_batch(batch)
    with torch.no_grad():
        ad = None if adapters is None else lora_fn({n: t.double() for n, t in adapters.items()}, scale)
        logits = llama_ref.forward(cfg, P, tokens, ad)
        return logits, llama_ref.mean_loss(logits, targets).item()


def dump(hf_dump, d, batch, out, extra):
    run([hf_dump, d, batch, out] + OPT + extra)
    return st_read(out)


def grads_case(hf_dump, tmp, d, batch, tag, spec, targets, r, alpha, extra=()):
    """accumd's adapter gradients at moved adapters against autograd's."""
    moved = dump(hf_dump, d, batch, f"{d}.{tag}.moved", ["--lora", spec, "--steps", "5",
                                                         "--adapter", f"{d}.{tag}.ad"])
    # the adapter after 5 steps, as a fresh start: gradients there (B != 0)
    ad = st_read(os.path.join(f"{d}.{tag}.ad", "adapter_model.safetensors"))
    cfg, loss, g = ref_grads(d, batch, ad, alpha / r)
    ours_final = moved["final_loss"].item()
    check(f"{tag}: loss after 5 steps = reference with the saved adapter",
          abs(ours_final - loss) <= 1e-5 * abs(loss), f"{ours_final:.7f} vs {loss:.7f}")
    check(f"{tag}: training moved the loss", ours_final < moved["losses"][0].item(),
          f"{moved['losses'][0].item():.5f} -> {ours_final:.5f}")
    check(f"{tag}: frozen weights bit-for-bit unchanged", moved["frozen_changed"].item() == 0,
          f"{int(moved['frozen_changed'].item())} floats changed")
    want = peft_names(cfg, targets, r)
    got = {n: list(t.shape) for n, t in ad.items()}
    check(f"{tag}: adapter tensor names and shapes (PEFT's)", got == want, f"{len(got)} tensors")
    with open(os.path.join(f"{d}.{tag}.ad", "adapter_config.json")) as f:
        ac = json.load(f)
    check(f"{tag}: adapter_config.json", ac.get("peft_type") == "LORA" and ac.get("r") == r and
          ac.get("lora_alpha") == alpha and ac.get("task_type") == "CAUSAL_LM" and
          ac.get("bias") == "none" and sorted(ac.get("target_modules", [])) == sorted(targets) and
          ac.get("base_model_name_or_path") == d and ac.get("lora_dropout") == 0.0, json.dumps(ac)[:120])
    # gradients: accumd at the same adapters (written back as its "init")
    cur = dump(hf_dump, d, batch, f"{d}.{tag}.g", ["--lora", spec, "--steps", "0",
                                                   "--set-adapter", f"{d}.{tag}.ad"] + list(extra))
    worst, wname = 0.0, ""
    for n, ref in g.items():
        r_ = rel(cur["grad." + n], ref)
        if r_ > worst:
            worst, wname = r_, n
    check(f"{tag}: adapter gradients within 1e-4 of autograd {' '.join(extra)}",
          worst <= 1e-4 and len(g) == len([n for n in cur if n.startswith("grad.")]),
          f"worst {worst:.2e} ({wname}), {len(g)} tensors")
    check(f"{tag}: loss {' '.join(extra)}", abs(cur["loss"].item() - loss) <= 1e-5 * abs(loss),
          f"{cur['loss'].item():.7f} vs {loss:.7f}")
    half = next((v for v in tag.split("+") if v in ("bf16", "f16")), None)
    check(f"{tag}: frozen base kept in {half or 'fp32'} on the device",
          cur["base16"].item() == (1.0 if half else 0.0), f"base16 = {cur['base16'].item()}")
    # the merged model against base + adapter
    lm, _ = ref_logits(os.path.join(f"{d}.{tag}.ad", "merged"), batch)
    la, _ = ref_logits(d, batch, ad, alpha / r)
    check(f"{tag}: merged logits = base + adapter within 1e-5", rel(lm, la) <= 1e-5, f"{rel(lm, la):.2e}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    hf_dump = sys.argv[1]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="accumd-lora-") as tmp:
        for i, (variant, spec, targets, r, alpha, extra) in enumerate([
                ("gqa", "4,8,q_proj+v_proj+down_proj", ["q_proj", "v_proj", "down_proj"], 4, 8, []),
                ("qwen2+tied", "2,5,all-linear", ["q_proj", "k_proj", "v_proj", "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"], 2, 5,
                 ["--micro", "2", "--recompute"]),
                ("gqa+bf16", "4,8,all-linear", ["q_proj", "k_proj", "v_proj", "o_proj",
                                               "gate_proj", "up_proj", "down_proj"], 4, 8,
                 ["--micro", "2", "--recompute"]),
                ("qwen2+tied+f16", "2,4,q_proj+o_proj", ["q_proj", "o_proj"], 2, 4, [])]):
            print(f"{variant} lora {spec}:")
            d = os.path.join(tmp, variant)
            batch = d + ".batch"
            run([PY, os.path.join(HERE, "make_tiny_llama.py"), d, "--variant", variant,
                 "--seed", str(i + 3), "--batch", batch, "4", "16"])
            grads_case(hf_dump, tmp, d, batch, variant, spec, targets, r, alpha, extra)
    if failures:
        print(f"lora_check: {len(failures)} FAILED: {', '.join(failures)}")
        sys.exit(1)
    print("lora_check: all passed")


if __name__ == "__main__":
    main()

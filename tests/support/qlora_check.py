#!/usr/bin/python3
"""accumd's QLoRA (LoRA on a 4-bit NF4 base) against the PyTorch reference
on the dequantized weights (issue 21).

Usage: qlora_check.py HF_DUMP   (the tests/support/hf_dump binary)
Exit 77 (skip) when this Python has no torch.

A tiny LLaMA is quantized HERE (nf4_check.py's reference, written from
the format's description) and saved as transformers saves a 4-bit model:
config.json's quantization_config, each linear weight of the blocks as
U8 packed codes [(n+1)/2, 1] with .absmax, .quant_map, .nested_absmax,
.nested_quant_map and .quant_state.bitsandbytes__nf4 (JSON bytes); the
embeddings, norms and head as they were. Then:
  - accumd loads it and holds exactly the script's dequantized weights;
  - after 5 AdamW steps the adapter gradients are within 1e-4 and the loss
    within 1e-5 of autograd's (float64) on the dequantized weights, also
    in micro batches with recompute; the 4-bit bytes are unchanged;
  - the merged model equals dequantized base + adapter within 1e-5;
  - model.quantize at load (hf_dump --quantize) on the fp32 directory
    gives the same dequantized weights as the script's quantization.
"""
import json
import os
import sys
import tempfile

try:
    import torch
    import numpy as np
except ImportError:
    print("qlora_check: no torch / numpy in this Python: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
import lora_check  # noqa: E402
import nf4_check  # noqa: E402
from lora_check import check, failures, rel, run, PY, dump, ref_grads, ref_logits, peft_names  # noqa: E402

llama_ref.DTYPES["U8"] = (torch.uint8, 1)
llama_ref.TORCH_NAMES[torch.uint8] = "U8"
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_linear(name):
    return name.startswith("model.layers.") and name.endswith(".weight") and \
        name.split(".")[-2] in LINEAR


def quantize_dir(src, qdir, ddir):
    """src (fp32) -> the 4-bit directory qdir and its dequantized twin ddir."""
    cfg, P = llama_ref.load_dir(src)
    dmap = nf4_check.dynamic_map()
    Q, D = {}, {}
    for n, t in P.items():
        if not is_linear(n):
            Q[n] = D[n] = t
            continue
        x = t.float().numpy().reshape(-1).astype(np.float32)
        packed, absmax = nf4_check.quantize(x)
        qabs, nested, off = nf4_check.double_quant(absmax, dmap)
        nb = len(absmax)
        am2 = ((dmap[qabs] * nested[np.arange(nb) // 256]).astype(np.float32) + off).astype(np.float32)
        codes = np.zeros(2 * len(packed), dtype=np.uint8)
        codes[0::2], codes[1::2] = packed >> 4, packed & 15
        deq = (nf4_check.NF4[codes[:len(x)]] * am2[np.arange(len(x)) // 64]).astype(np.float32)
        D[n] = torch.from_numpy(deq.reshape(t.shape).copy())
        Q[n] = torch.from_numpy(packed.reshape(-1, 1).copy())
        Q[n + ".absmax"] = torch.from_numpy(qabs.copy())
        Q[n + ".quant_map"] = torch.from_numpy(nf4_check.NF4.copy())
        Q[n + ".nested_absmax"] = torch.from_numpy(nested.copy())
        Q[n + ".nested_quant_map"] = torch.from_numpy(dmap.copy())
        state = {"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": list(t.shape),
                 "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": float(off)}
        Q[n + ".quant_state.bitsandbytes__nf4"] = torch.tensor(list(json.dumps(state).encode()),
                                                               dtype=torch.uint8)
    for d, tensors, quant in ((qdir, Q, True), (ddir, D, False)):
        os.makedirs(d, exist_ok=True)
        c = dict(cfg)
        if quant:
            c["quantization_config"] = {
                "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                "bnb_4bit_compute_dtype": "float32", "bnb_4bit_quant_storage": "uint8",
                "llm_int8_threshold": 6.0, "llm_int8_skip_modules": None}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
        llama_ref.st_write(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})
    return D


def base_equal(tag, out, D):
    bad = [n for n, t in D.items() if "base." + n in out and
           out["base." + n].numpy().tobytes() != t.float().numpy().tobytes()]
    seen = sum(1 for n in D if "base." + n in out)
    check(f"{tag}: accumd's dequantized weights = the script's, bit for bit",
          not bad and seen == len(D), f"{seen} tensors, differing: {bad[:3]}")


def qlora_case(hf_dump, qdir, ddir, batch, tag, spec, targets, r, alpha, D, extra=(), quantize=False):
    src = qdir
    qa = ["--quantize"] if quantize else []
    moved = dump(hf_dump, src, batch, f"{qdir}.{tag}.moved",
                 ["--lora", spec, "--steps", "5", "--adapter", f"{qdir}.{tag}.ad"] + qa)
    base_equal(tag, moved, D)
    ad = llama_ref.st_read(os.path.join(f"{qdir}.{tag}.ad", "adapter_model.safetensors"))
    cfg, loss, g = ref_grads(ddir, batch, ad, alpha / r)
    fin = moved["final_loss"].item()
    check(f"{tag}: loss after 5 steps = reference with the saved adapter",
          abs(fin - loss) <= 1e-5 * abs(loss), f"{fin:.7f} vs {loss:.7f}")
    check(f"{tag}: training moved the loss", fin < moved["losses"][0].item(),
          f"{moved['losses'][0].item():.5f} -> {fin:.5f}")
    check(f"{tag}: 4-bit bytes unchanged by training", moved["store_changed"].item() == 0,
          f"{int(moved['store_changed'].item())} bytes changed")
    check(f"{tag}: frozen weights unchanged", moved["frozen_changed"].item() == 0,
          f"{int(moved['frozen_changed'].item())} floats changed")
    got = {n: list(t.shape) for n, t in ad.items()}
    check(f"{tag}: adapter tensors (PEFT's names)", got == peft_names(cfg, targets, r), f"{len(got)}")
    cur = dump(hf_dump, src, batch, f"{qdir}.{tag}.g",
               ["--lora", spec, "--steps", "0", "--set-adapter", f"{qdir}.{tag}.ad"] + qa + list(extra))
    worst, wname = 0.0, ""
    for n, ref in g.items():
        r_ = rel(cur["grad." + n], ref)
        if r_ > worst:
            worst, wname = r_, n
    check(f"{tag}: adapter gradients within 1e-4 of autograd {' '.join(extra)}",
          worst <= 1e-4 and len(g) == len([n for n in cur if n.startswith("grad.")]),
          f"worst {worst:.2e} ({wname}), {len(g)} tensors")
    check(f"{tag}: loss within 1e-5 {' '.join(extra)}",
          abs(cur["loss"].item() - loss) <= 1e-5 * abs(loss), f"{cur['loss'].item():.7f} vs {loss:.7f}")
    merged = os.path.join(f"{qdir}.{tag}.ad", "merged")
    with open(os.path.join(merged, "config.json")) as f:
        check(f"{tag}: the merged model's config.json is not 4-bit",
              "quantization_config" not in json.load(f), merged)
    lm, _ = ref_logits(merged, batch)
    la, _ = ref_logits(ddir, batch, ad, alpha / r)
    check(f"{tag}: merged = dequantized base + adapter within 1e-5", rel(lm, la) <= 1e-5,
          f"{rel(lm, la):.2e}")


def refused(hf_dump, d, batch, tag, words):
    """hf_dump on a damaged copy fails, naming what is wrong."""
    import subprocess
    r = subprocess.run([hf_dump, d, batch, d + ".out", "--lora", "2,4,q_proj"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ok = r.returncode != 0 and all(w in r.stderr for w in words) and "model.from" in r.stderr
    check(f"refused: {tag}", ok, r.stderr.strip()[:200])


def damaged(hf_dump, qdir, batch, tmp):
    import shutil
    w = "model.layers.1.mlp.down_proj.weight"

    def variant(name, edit_tensors=None, edit_config=None):
        d = os.path.join(tmp, "bad-" + name)
        shutil.copytree(qdir, d)
        if edit_tensors:
            T = llama_ref.st_read(os.path.join(d, "model.safetensors"))
            edit_tensors(T)
            llama_ref.st_write(os.path.join(d, "model.safetensors"), T, {"format": "pt"})
        if edit_config:
            with open(os.path.join(d, "config.json")) as f:
                c = json.load(f)
            edit_config(c["quantization_config"])
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(c, f)
        return d

    def state(edit):
        def f(T):
            st = json.loads(bytes(T[w + ".quant_state.bitsandbytes__nf4"].tolist()).decode())
            text = edit(st)
            T[w + ".quant_state.bitsandbytes__nf4"] = torch.tensor(list(text.encode()), dtype=torch.uint8)
        return f
    refused(hf_dump, variant("blocksize", state(lambda st: json.dumps(dict(st, blocksize=128)))),
            batch, "quant state block size 128", [w + ".quant_state", "blocksize"])
    refused(hf_dump, variant("json", state(lambda st: "{not json")), batch, "quant state not JSON",
            [w + ".quant_state", "JSON"])
    refused(hf_dump, variant("shape", state(lambda st: json.dumps(dict(st, shape=[1, 2])))), batch,
            "quant state of another shape", [w + ".quant_state", "shape"])
    refused(hf_dump, variant("absmax", lambda T: T.__setitem__(w + ".absmax", T[w + ".absmax"][:-1])),
            batch, "absmax of the wrong shape", [w + ".absmax"])
    refused(hf_dump, variant("fp4", edit_config=lambda q: q.__setitem__("bnb_4bit_quant_type", "fp4")),
            batch, "fp4", ["bnb_4bit_quant_type fp4", "not supported yet"])
    refused(hf_dump, variant("8bit", edit_config=lambda q: q.update(load_in_8bit=True, load_in_4bit=False)),
            batch, "8-bit", ["load_in_8bit", "not supported yet"])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    hf_dump = sys.argv[1]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="accumd-qlora-") as tmp:
        src = os.path.join(tmp, "gqa")
        batch = src + ".batch"
        run([PY, os.path.join(HERE, "make_tiny_llama.py"), src, "--variant", "gqa", "--seed", "5",
             "--batch", batch, "4", "16"])
        qdir, ddir = os.path.join(tmp, "gqa-4bit"), os.path.join(tmp, "gqa-dequant")
        D = quantize_dir(src, qdir, ddir)
        print("4-bit directory, lora all-linear:")
        qlora_case(hf_dump, qdir, ddir, batch, "4bit", "4,8,all-linear", list(LINEAR), 4, 8, D)
        print("4-bit directory, q_proj+v_proj, micro batches with recompute:")
        qlora_case(hf_dump, qdir, ddir, batch, "4bit+micro", "2,4,q_proj+v_proj",
                   ["q_proj", "v_proj"], 2, 4, D, ["--micro", "2", "--recompute"])
        print("damaged 4-bit directories:")
        damaged(hf_dump, qdir, batch, tmp)
        print("model.quantize nf4 at load from the fp32 directory:")
        # the moved run reads src; the 4-bit bytes are the script's quantization of it
        qlora_case(hf_dump, src, ddir, batch, "quantize", "4,8,all-linear", list(LINEAR), 4, 8, D,
                   quantize=True)
    if failures:
        print(f"qlora_check: {len(failures)} FAILED: {', '.join(failures)}")
        sys.exit(1)
    print("qlora_check: all passed")


if __name__ == "__main__":
    main()

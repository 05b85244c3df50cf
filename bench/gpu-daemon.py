#!/usr/bin/env python3
"""The daemon on a GPU, end to end, for bench/gpu-check.sh.

Starts ACCUMD with devices = auto (the default: the GPUs only if they pass
the daemon's self-test against the CPU) on a private state directory, submits a
GPT-2 (byte vocabulary) job over HTTP in fp32 and in bf16, waits for each to
finish, and prints `RESULT key value` lines: the final state and loss, the
median tokens/s of the steps after the first few, the device's peak memory,
and /v1/devices' view of the GPU. The training text is the repository's own
sources and docs (the GPU machine has no /usr/share/common-licenses).
Only the Python standard library: that machine has no curl to rely on.

usage: gpu-daemon.py ACCUMD REPO_ROOT STATE_DIR
Without GPU_DAEMON_DEVICES, devices = auto must have taken the GPUs.
(GPU_DAEMON_DEVICES=cpu GPU_DAEMON_STEPS=2 try it on a machine without a GPU;
GPU_DAEMON_DEADLINE: seconds each job may take, default 150; GPU_DAEMON_LIBS:
a library path for accumd only)
Exit status: 0 when both jobs succeeded, 1 otherwise.
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request


# no proxy from the environment may capture 127.0.0.1
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with OPENER.open(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def write_corpus(repo, path):
    parts = []
    for pat in ("**/*.md", "**/*.c", "**/*.h", "**/*.cu"):
        for f in sorted(glob.glob(os.path.join(repo, pat), recursive=True)):
            if "/build/" in f or "/.deps/" in f:
                continue
            with open(f, errors="replace") as fh:
                parts.append(fh.read())
    text = "\n".join(parts)
    with open(path, "w") as fh:
        fh.write(text)
    return len(text)


def start_daemon(accumd, state):
    addr = os.path.join(state, "accumd.addr")
    if os.path.exists(addr):
        os.unlink(addr)
    log = open(os.path.join(state, "daemon.log"), "a")
    env = dict(os.environ)
    if os.environ.get("GPU_DAEMON_LIBS"):  # the carried libraries, for accumd only
        env["LD_LIBRARY_PATH"] = os.environ["GPU_DAEMON_LIBS"] + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    p = subprocess.Popen([accumd, "--set", "listen=127.0.0.1:0", "--set", "state_dir=" + state,
                          "--set", "devices=" + os.environ.get("GPU_DAEMON_DEVICES", "auto")],
                         stdout=log, stderr=log, env=env)
    for _ in range(300):
        if p.poll() is not None:
            tail = open(os.path.join(state, "daemon.log")).read().splitlines()[-5:]
            raise SystemExit("accumd exited during start:\n  " + "\n  ".join(tail))
        if os.path.exists(addr) and os.path.getsize(addr) > 0:
            base = "http://" + open(addr).read().strip()
            try:
                if http(base, "GET", "/healthz")[0] == 200:
                    return p, base
            except OSError:
                pass
        time.sleep(0.1)
    p.kill()
    raise SystemExit("accumd did not become ready")


def job_spec(name, precision):
    return {
        "name": name,
        "model": {"arch": "gpt2", "n_layer": 6, "n_head": 6, "n_embd": 384, "seq_len": 256,
                  "vocab_size": 256},
        "data": {"train": "corpus.txt", "format": "text"},
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": "auto", "devices": 1, "precision": precision,
        "optimizer": {"type": "adamw", "lr": 1e-3, "weight_decay": 0.1, "grad_clip": 1.0},
        "lr_schedule": {"type": "cosine", "warmup_steps": 10, "min_lr": 1e-4},
        "max_steps": int(os.environ.get("GPU_DAEMON_STEPS", "60")), "seed": 1337,
    }


def num(x, fmt):
    """A figure, or "null" where the daemon reported none (a diverged loss)."""
    return fmt % x if isinstance(x, (int, float)) else "null"


def run_job(base, precision, deadline_s=int(os.environ.get("GPU_DAEMON_DEADLINE", "150"))):
    code, j = http(base, "POST", "/v1/jobs", job_spec("gpu-check-" + precision, precision))
    if code != 201:
        print("RESULT daemon_%s_submit FAIL %s %s" % (precision, code, j))
        return False
    jid = j["id"]
    t0 = time.time()
    while time.time() - t0 < deadline_s:
        code, j = http(base, "GET", "/v1/jobs/" + jid)
        if j.get("state") in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.5)
    state = j.get("state")
    err = (j.get("error") or {}).get("message", "") if isinstance(j.get("error"), dict) else j.get("error")
    print("RESULT daemon_%s_state %s%s" % (precision, state, " (%s)" % err if err else ""))
    _, m = http(base, "GET", "/v1/jobs/%s/metrics" % jid)
    steps = m.get("steps", []) if isinstance(m, dict) else []
    if steps:
        tps = [s.get("tokens_per_s") for s in steps[5:]] or [s.get("tokens_per_s") for s in steps]
        tps = [t for t in tps if isinstance(t, (int, float))]
        peaks = [s.get("mem_peak_bytes") or 0 for s in steps]
        print("RESULT daemon_%s_loss %s -> %s (%d steps)" % (
            precision, num(steps[0].get("loss"), "%.4f"), num(steps[-1].get("loss"), "%.4f"),
            len(steps)))
        print("RESULT daemon_%s_tokens_per_s %s" % (
            precision, num(statistics.median(tps), "%.0f") if tps else "null"))
        print("RESULT daemon_%s_peak_bytes %d" % (precision, max(peaks)))
    return state == "succeeded"


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    accumd, repo, state = sys.argv[1:]
    os.makedirs(os.path.join(state, "data"), exist_ok=True)
    n = write_corpus(repo, os.path.join(state, "data", "corpus.txt"))
    print("corpus: %d bytes" % n)
    p, base = start_daemon(accumd, state)
    ok = True
    try:
        for line in open(os.path.join(state, "daemon.log")):
            if "self-test" in line:
                print("RESULT daemon_selftest %s" % line.strip()[:200])
        _, d = http(base, "GET", "/v1/devices")
        st = d.get("gpu_selftest") if isinstance(d, dict) else None
        if st:
            print("RESULT daemon_gpu_selftest %s %s" % ("passed" if st.get("passed") else "FAILED",
                                                       st.get("message", "")[:160]))
        kinds = set()
        for dev in d.get("devices", []):
            kinds.add(dev.get("kind"))
            print("RESULT daemon_device %s %s %s GiB" % (dev.get("kind"), dev.get("name"),
                                                        round(dev.get("memory_total_bytes", 0) / 2**30, 1)))
        if "GPU_DAEMON_DEVICES" not in os.environ and kinds != {"cuda"}:
            # no point training the GPU-sized jobs on CPU devices: say so and stop
            print("RESULT daemon_devices FAIL devices = auto did not take the GPUs (see the self-test)")
            ok = False
        else:
            for precision in ("fp32", "bf16"):
                ok = run_job(base, precision) and ok
    finally:
        p.terminate()
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "killed"
        print("RESULT daemon_exit %s" % rc)
        ok = ok and rc == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

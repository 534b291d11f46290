"""The sizer against every GPU run recorded under docs/benchmarks/raw: for each model, layer
count, micro-batch x sequence and attention a DeepSpeed run recorded `savedActivationBytes` of
(what autograd kept for backward on the GPU, counted by hack/gpu/hf_step.py), the sizer's
`savedBytes` for the same shape on this CPU, side by side.

Usage: python3 hack/sizer/recorded.py [--python PYTHON] [--jobs N] [--traces DIR] > table.md
PYTHON must have torch and transformers (the test command's sizer environment does). With
--traces, each trace is also written to DIR/NAME-MICROxSEQ.json, what `offload-bench memory
--traces DIR` reads to put the traced estimate beside each recorded run.
"""
import argparse
import collections
import concurrent.futures
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def recorded():
    combos = collections.defaultdict(set)
    for f in sorted(glob.glob(os.path.join(ROOT, "docs/benchmarks/raw/**/*.json*"), recursive=True)):
        try:
            lines = open(f).read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if not isinstance(r, dict) or not r.get("model") or "phases" not in r:
                continue
            if "ckpt" in (r.get("options") or []):
                continue
            for p in r["phases"]:
                if p.get("savedActivationBytes"):
                    key = (r["model"], r.get("layers"), p["micro"], p["seq"], r.get("attn") or "sdpa")
                    combos[key].add(p["savedActivationBytes"])
    return combos


def size(python, key):
    model, layers, micro, seq, attn = key
    cfg = json.load(open(os.path.join(ROOT, "hack/gpu/models", model)))
    if layers:
        cfg["num_hidden_layers"] = layers
        cfg.pop("layer_types", None)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    try:
        out = subprocess.run([python, os.path.join(ROOT, "sizer/offload_sizer.py"), "--config", f.name,
                              "--micro-batch", str(micro), "--sequence", str(seq), "--attention", attn],
                             capture_output=True, text=True, timeout=600)
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        os.unlink(f.name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--traces", help="also write each trace to DIR/NAME-MICROxSEQ.json")
    a = ap.parse_args()
    combos = recorded()
    keys = sorted(combos, key=str)
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        traces = list(pool.map(lambda k: size(a.python, k), keys))
    print("| model | layers | micro × seq | attention | GPU saved (GiB) | sizer saved (GiB) | sizer − GPU | kernels |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for key, t in zip(keys, traces):
        gpu = max(combos[key])
        model, layers, micro, seq, attn = key
        if a.traces and t.get("kind") == "ModelTrace":
            os.makedirs(a.traces, exist_ok=True)
            with open(os.path.join(a.traces, f"{model[:-5]}-{micro}x{seq}.json"), "w") as f:
                json.dump(t, f)
        if t.get("kind") != "ModelTrace":
            print(f"| {model[:-5]} | {layers or 'all'} | {micro} × {seq} | {attn} | {gpu / 2**30:.2f} | error: {t['error']['code']} | | |")
            continue
        d = (t["savedBytes"] - gpu) / gpu
        worst = max(worst, abs(d))
        print(f"| {model[:-5]} | {t['layers']} | {micro} × {seq} | {attn} | {gpu / 2**30:.3f} | {t['savedBytes'] / 2**30:.3f} | {100 * d:+.3f} % | {t['kernels']} |")
    print(f"\nlargest difference: {100 * worst:.3f} % over {len(keys)} shapes")


if __name__ == "__main__":
    main()

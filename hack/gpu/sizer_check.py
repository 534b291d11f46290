"""The sizer (sizer/offload_sizer.py, fake tensors on the CPU) against the same step on this
GPU: one process per model builds it on CUDA from its config.json (random weights, bf16, the
attention the library resolves), runs one forward and backward at the shape, and records what
the sizer traces, as PyTorch's CUDA allocator counts it:

  savedBytes   allocated beyond the parameters when backward starts (the loss computed, the
               model's outputs dropped);
  peakBytes    the most allocated beyond the parameters during forward and backward;
  gradients    the bytes alive beyond the parameters as each gradient arrives, that gradient
               left out (each is dropped on arrival, as ZeRO moves it out).

It also lists the attention backward nodes autograd recorded (which fused kernel ran) and runs
the sizer on this host with this host's torch and transformers.

Usage: python3 sizer_check.py --out DIR MODEL.json:MICROxSEQ ...
Writes DIR/sizer-check.jsonl and prints one line per model.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def on_gpu(path, micro, seq):
    import torch
    import transformers

    fields = json.load(open(path))
    model_type = fields.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = None
        for auto in ("AutoModelForCausalLM", "AutoModelForImageTextToText"):
            try:
                model = getattr(transformers, auto).from_config(cfg, dtype=torch.bfloat16)
                break
            except ValueError:
                continue
    model.train()
    model.config.use_cache = False
    params = list(model.parameters())
    torch.cuda.synchronize()
    vocab = getattr(model.config, "vocab_size", None) or model.config.get_text_config().vocab_size
    tokens = torch.randint(0, vocab, (micro, seq), device="cuda")
    base = torch.cuda.memory_allocated()
    gradients = []

    def arrived(p):
        g = p.grad
        gb = g.untyped_storage().nbytes() if g is not None else 0
        gradients.append([p.numel(), torch.cuda.memory_allocated() - base - gb])
        p.grad = None

    hooks = [p.register_post_accumulate_grad_hook(arrived) for p in params]
    torch.cuda.reset_peak_memory_stats()
    out = model(input_ids=tokens, labels=tokens)
    loss = out.loss
    del out
    torch.cuda.synchronize()
    saved = torch.cuda.memory_allocated() - base
    forward_peak = torch.cuda.max_memory_allocated() - base
    nodes = {}
    seen = set()
    stack = [loss.grad_fn]
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        name = n.name()
        if "ttention" in name or "Softmax" in name:
            nodes[name] = nodes.get(name, 0) + 1
        stack.extend(f for f, _ in n.next_functions)
    t0 = time.perf_counter()
    loss.backward()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) * 1e3
    for h in hooks:
        h.remove()
    return {
        "attention": getattr(model.config, "_attn_implementation", None),
        "parameters": sum(p.numel() for p in params),
        "savedBytes": saved,
        "forwardPeakBytes": forward_peak,
        "peakBytes": torch.cuda.max_memory_allocated() - base,
        "gradients": gradients,
        "attentionNodes": nodes,
        "backwardMs": round(step_ms, 1),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gpu": torch.cuda.get_device_name(0)},
    }


def expand(runs):
    out = []
    for items, n in runs:
        out.extend(items * n)
    return out


def alive(trace):
    """The sizer's alive bytes at each gradient, from its delta encoding."""
    res, cur = [], None
    for i, (numel, d) in enumerate(expand(trace["gradients"])):
        cur = d if i == 0 else cur - d
        res.append([numel, cur])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("runs", nargs="*")
    a = ap.parse_args()
    if a.one:
        path, shape = a.one.rsplit(":", 1)
        micro, seq = (int(x) for x in shape.split("x"))
        print(json.dumps(on_gpu(path, micro, seq)))
        return
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "sizer-check.jsonl"), "a")
    for run in a.runs:
        path, shape = run.rsplit(":", 1)
        micro, seq = (int(x) for x in shape.split("x"))
        t0 = time.monotonic()
        sz = subprocess.run([sys.executable, os.path.join(ROOT, "sizer/offload_sizer.py"), "--config", path,
                             "--micro-batch", str(micro), "--sequence", str(seq)], capture_output=True, text=True)
        sizer_wall = time.monotonic() - t0
        trace = json.loads(sz.stdout.strip().splitlines()[-1]) if sz.stdout.strip() else {"error": sz.stderr[-500:]}
        g = subprocess.run([sys.executable, __file__, "--out", a.out, "--one", run], capture_output=True, text=True)
        lines = [x for x in g.stdout.splitlines() if x.startswith("{")]
        gpu = json.loads(lines[-1]) if lines else {"error": g.stderr[-1500:]}
        rec = {"run": run, "model": os.path.basename(path), "micro": micro, "seq": seq, "sizerWallS": round(sizer_wall, 1),
               "trace": trace, "gpu": gpu}
        if trace.get("kind") == "ModelTrace" and "savedBytes" in gpu:
            ta, ga = alive(trace), gpu["gradients"]
            worst = max((abs(t[1] - q[1]) for t, q in zip(ta, ga)), default=0)
            rec["compare"] = {
                "parameters": trace["parameters"] - gpu["parameters"],
                "saved": (trace["savedBytes"] - gpu["savedBytes"]) / gpu["savedBytes"],
                "peak": (trace["peakBytes"] - gpu["peakBytes"]) / gpu["peakBytes"],
                "gradientOrderSame": [t[0] for t in ta] == [q[0] for q in ga],
                "aliveWorstBytes": worst,
            }
        print(json.dumps(rec), file=log, flush=True)
        c = rec.get("compare")
        gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
        if c:
            print(f"{run:<50} params {trace['parameters'] / 1e9:.3f}B (Δ {c['parameters']}) saved {gib(trace['savedBytes'])}/{gib(gpu['savedBytes'])} "
                  f"({100 * c['saved']:+.3f} %) peak {gib(trace['peakBytes'])}/{gib(gpu['peakBytes'])} ({100 * c['peak']:+.3f} %) "
                  f"order {c['gradientOrderSame']} alive±{c['aliveWorstBytes'] / 2**20:.1f}MiB kernels {trace['kernels']} gpu {gpu['attentionNodes']} sizer {sizer_wall:.0f}s",
                  flush=True)
        else:
            print(f"{run:<50} ERROR trace {str(trace.get('error'))[:300]} gpu {str(gpu.get('error'))[-600:]}", flush=True)


if __name__ == "__main__":
    main()

"""One DeepSpeed configuration, one model size, one process: the step time the configuration
gives on this node. `hack/gpu/decision-bench.sh` runs it once per candidate that
`offload-operator explain --candidates` rendered (SuperOffload leaves CPU workers behind, so
never two engines in one process).

The model is a decoder-only transformer of plain Linear layers (so ZeRO-3's parameter hooks see
every weight), vocabulary 32000: small = hidden 1024, 20 layers (about 0.29B parameters); large =
hidden 2048, 40 layers (about 2.1B); 1b, 4b, 9b and 13b (hidden 2048/3072/4096/5120, 20/32/44/40
layers: 1.1B, 3.8B, 9.1B, 12.9B) and 6b (hidden 4096, 32 layers: 6.7B) for the memory model. bf16, random tokens, a fixed batch.
Under ZeRO-3 the model is built inside `deepspeed.zero.Init` (as Hugging Face's Trainer does
with a ZeRO-3 config), so no rank ever holds the whole model.

With --observe AGENT, after the timed steps it keeps training for --observe-seconds while
`AGENT observe` samples NVML, and records the truth beside it: the union of every kernel's
interval (torch.profiler, CUPTI) over the wall-clock time of that window.

Usage: python3 ds_step.py --config ds.json --size small|large [--steps 8] [--label NAME]
                          [--observe AGENT --observe-seconds S]
Prints one JSON object: every step's wall time, the median of steps 3-7, the forward+backward
GPU time of those steps (CUDA events), the peak GPU memory (allocated and reserved), the peak
host RSS of the process, DeepSpeed's own estimate of the model states for the configuration, and
the observation. For the memory model it also records, stage by stage, where the GPU memory
goes: what `deepspeed.initialize` left allocated, and for the first two steps the allocation at
each boundary and the peak inside forward, backward and the optimizer step (the peak counter is
reset at each boundary; the run's peaks are the largest of all), with the bytes autograd saved
for backward on the first step (`hf_step.SavedBytes`: unique storages, parameters left out).
A run that fails (CUDA out of memory) says so; one the host's OOM killer ends prints nothing,
which the caller records.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_step import SavedBytes, deepspeed_layout  # noqa: E402 - beside this file

SIZES = {
    "small": (1024, 20, 16),
    "large": (2048, 40, 16),
    "1b": (2048, 20, 16),
    "4b": (3072, 32, 24),
    "6b": (4096, 32, 32),
    "9b": (4096, 44, 32),
    "13b": (5120, 40, 40),
}
VOCAB = 32000
SEQ = 512


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.up = nn.Linear(h, 4 * h)
        self.down = nn.Linear(4 * h, h)

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, h))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, h, layers, heads):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, h)
        self.blocks = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(h)
        self.head = nn.Linear(h, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.float().view(-1, VOCAB), tokens.view(-1))


def union_us(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def observe(agent, seconds, step):
    """Trains while the agent samples NVML; the truth is the kernels' busy time (CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    proc = subprocess.Popen(
        [agent, "observe", "--seconds", str(seconds), "--interval-ms", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    n = 0
    # CPU activity too: without it the kernels are not correlated and go missing.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        while proc.poll() is None:
            step()
            n += 1
        wall_us = (time.perf_counter() - t0) * 1e6
    kernels, copies = [], []
    for ev in prof.events():
        # Device-side events: the kernels each CPU op launched.
        for k in list(getattr(ev, "kernels", [])) + ([ev] if ev.device_type == torch.autograd.DeviceType.CUDA else []):
            name = getattr(k, "name", "")
            tr = getattr(k, "time_range", None) or getattr(k, "interval", None)
            if tr is None or tr.end <= tr.start:
                continue
            if name.startswith(("Memcpy", "Memset")):
                copies.append((tr.start, tr.end))
            else:
                kernels.append((tr.start, tr.end))
    obs = json.loads(proc.stdout.read() or b"[]")
    cuda = torch.autograd.DeviceType.CUDA
    kernel_us = sum(
        getattr(k, "device_time_total", 0) or getattr(k, "cuda_time_total", 0)
        for k in prof.key_averages()
        if getattr(k, "device_type", None) == cuda and not k.key.startswith(("Memcpy", "Memset"))
    )
    return {
        "steps": n,
        "wallS": round(wall_us / 1e6, 2),
        "kernels": len(kernels),
        "trueBusyFraction": round(union_us(kernels) / wall_us, 4) if wall_us else None,
        # The same with the copies (DMA) counted as busy too: what NVML would show if its
        # utilization counted the copy engines.
        "copies": len(copies),
        "busyWithCopiesFraction": round(union_us(kernels + copies) / wall_us, 4) if wall_us else None,
        "kernelTimeFraction": round(kernel_us / wall_us, 4) if wall_us else None,
        "observed": obs,
    }


def host_peak_bytes():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def deepspeed_estimate(config, total, largest, gpus=1):
    """DeepSpeed's own estimator for this configuration (per GPU, per node), bytes."""
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", 0)
    opt = (zero.get("offload_optimizer") or {}).get("device", "none") == "cpu"
    par = (zero.get("offload_param") or {}).get("device", "none") == "cpu"
    try:
        if stage == 3:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
            cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
                total, largest, num_gpus_per_node=gpus, num_nodes=1,
                cpu_offload=opt, cpu_offload_params=par, zero_init=True)
        elif stage in (1, 2):
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
            cpu, gpu = estimate_zero2_model_states_mem_needs(
                total, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=opt)
        else:
            return None
        return {"gpuBytes": int(gpu), "cpuBytes": int(cpu)}
    except Exception as e:  # noqa: BLE001 - reported
        return {"error": str(e)[:200]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--size", choices=sorted(SIZES), required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--label", default="")
    ap.add_argument("--observe", default="")
    ap.add_argument("--observe-seconds", type=float, default=6.0)
    ap.add_argument("--trace-peak", action="store_true",
                    help="record the allocator's history over the second step (peak_trace.py)")
    a = ap.parse_args()
    out = {"label": a.label, "size": a.size}
    peaks = {"allocated": 0, "reserved": 0}
    try:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        import deepspeed

        with open(a.config) as f:
            config = json.load(f)
        out["zero"] = config.get("zero_optimization")
        deepspeed.init_distributed(dist_backend="nccl", verbose=False)
        torch.cuda.set_device(0)
        h, layers, heads = SIZES[a.size]
        torch.manual_seed(0)
        stage = (config.get("zero_optimization") or {}).get("stage", 0)
        if stage == 3:
            with deepspeed.zero.Init(config_dict_or_path=config):
                model = Model(h, layers, heads)
            out["params"] = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        else:
            model = Model(h, layers, heads)
            out["params"] = sum(p.numel() for p in model.parameters())
        out["hidden"], out["layers"], out["vocab"], out["seq"] = h, layers, VOCAB, SEQ
        largest = max(VOCAB * h, 4 * h * h + 4 * h)
        out["deepspeedEstimate"] = deepspeed_estimate(config, out["params"], largest)
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config
        )
        torch.cuda.synchronize()
        out["afterInitGpuBytes"] = torch.cuda.memory_allocated()
        out["layout"] = deepspeed_layout(engine)
        micro = config.get("train_micro_batch_size_per_gpu", 4)
        tokens = torch.randint(0, VOCAB, (micro, SEQ), device="cuda")
        out["tokens"] = micro * SEQ
        steps, fwd_bwd, stages = [], [], []
        params = list(model.parameters())

        def boundary(name, watched):
            """At a stage's end: the allocation now and the stage's own peak, then a fresh
            peak counter for the next stage (the run's peaks are kept across resets)."""
            if not watched:
                return
            torch.cuda.synchronize()
            peak, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
            peaks["allocated"] = max(peaks["allocated"], peak)
            peaks["reserved"] = max(peaks["reserved"], reserved)
            if name:
                stages.append({"stage": name, "now": torch.cuda.memory_allocated(), "peak": peak})
            torch.cuda.reset_peak_memory_stats()

        def step(i=None):
            watched = i is not None and i < 2
            torch.cuda.synchronize()
            boundary(None, watched)
            t0 = time.perf_counter()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            if i == 0:
                counter = SavedBytes(params)
                with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                    loss = engine(tokens)
                out["savedActivationBytes"] = counter.total()
                del counter
            else:
                loss = engine(tokens)
            boundary(f"step{i}-forward", watched)
            engine.backward(loss)
            e.record()
            boundary(f"step{i}-backward", watched)
            engine.step()
            torch.cuda.synchronize()
            boundary(f"step{i}-optimizer", watched)
            return loss, (time.perf_counter() - t0) * 1e3, s.elapsed_time(e)

        for i in range(a.steps):
            if a.trace_peak and i == 1:
                import peak_trace
                base = peak_trace.start()
            loss, ms, gpu = step(i)
            if a.trace_peak and i == 1:
                out["peakTrace"] = peak_trace.stop(base)
            steps.append(ms)
            fwd_bwd.append(gpu)
        out["gpuStages"] = stages
        window = steps[2:7] if len(steps) >= 7 else steps
        out.update({
            "ok": True,
            "stepsMs": [round(x, 1) for x in steps],
            "medianMs": round(statistics.median(window), 1),
            "fwdBwdGpuMs": round(statistics.median(fwd_bwd[2:7] or fwd_bwd), 1),
            "loss": float(loss.detach().float().item()),
            "peakGpuMiB": max(peaks["allocated"], torch.cuda.max_memory_allocated()) >> 20,
            "peakGpuBytes": max(peaks["allocated"], torch.cuda.max_memory_allocated()),
            "peakGpuReservedBytes": max(peaks["reserved"], torch.cuda.max_memory_reserved()),
            "peakHostRssBytes": host_peak_bytes(),
        })
        if a.observe:
            out["observation"] = observe(a.observe, a.observe_seconds, step)
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        out.update({"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]})
        if torch.cuda.is_available():
            out["peakGpuBytes"] = max(peaks["allocated"], torch.cuda.max_memory_allocated())
            out["peakGpuReservedBytes"] = max(peaks["reserved"], torch.cuda.max_memory_reserved())
        out["peakHostRssBytes"] = host_peak_bytes()
        traceback.print_exc(file=sys.stderr)
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    # SuperOffload's and ZenFlow's workers may keep the interpreter alive.
    os._exit(0 if out.get("ok") else 1)


if __name__ == "__main__":
    main()

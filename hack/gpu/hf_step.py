"""One DeepSpeed configuration, one Hugging Face model shape, one process: what the
configuration costs in GPU memory, host memory and step time on this node.

The model is built by `transformers` from a `config.json` (the file a model card ships, the one
`spec.model.configMapRef` names), with random weights, inside `deepspeed.zero.Init` for ZeRO-3
(as Hugging Face's Trainer does: `HfDeepSpeedConfig` alive while the model is built), SDPA
attention, bf16, random tokens. Shapes live in `hack/gpu/models/*.json`.

A run may have several phases (`--phases 2x1024,2x2048`: micro-batch x sequence length); the
peak GPU memory is reset between them, so one process gives the activations' slope per token
beside the fixed part. The proof runs (one configuration, one shape) use one phase.

Besides the peaks (`torch.cuda.max_memory_allocated` / `max_memory_reserved`, the allocator's
retries, which are DeepSpeed's "cache flushes", and the process's peak RSS), it records the
memory after `deepspeed.initialize` (model states as DeepSpeed placed them) and, on the first
step of each phase, the bytes of the tensors autograd saved for backward (unique storages,
parameters left out), measured with `torch.autograd.graph.saved_tensors_hooks`.

Usage: python3 hf_step.py --config ds.json --model models/NAME.json [--phases MxS,...]
                          [--steps 6] [--label NAME]
Prints one JSON object. A run that fails (CUDA out of memory) says so with its peaks; one the
host's OOM killer ends prints nothing, which the caller records.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time
import traceback

import torch


def rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def status_bytes():
    """The kernel's breakdown of this process's memory (/proc/self/status, in bytes): resident
    anonymous, file and shared pages, and the locked and pinned ones (page-locked buffers)."""
    keys = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmLck", "VmPin")
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in keys:
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


class HostTimeline:
    """Samples the resident set every 20 ms and keeps, per stage of the run, its largest value:
    which step of the run the host peak belongs to."""

    def __init__(self):
        import threading

        self.stage = "start"
        self.peaks = {}
        self.stages = []
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            r = rss_bytes() or 0
            if r > self.peaks.get(self.stage, 0):
                self.peaks[self.stage] = r
            time.sleep(0.02)

    def mark(self, stage):
        gpu = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            gpu = {"now": torch.cuda.memory_allocated(), "maxSoFar": torch.cuda.max_memory_allocated()}
        self.stages.append({"stage": self.stage, "status": status_bytes(), "pinned": pinned_stats(), "gpu": gpu})
        self.stage = stage

    def report(self):
        return {"peaks": self.peaks, "ends": self.stages}


def pinned_stats():
    """PyTorch's caching host (pinned) allocator: bytes in use and reserved, where it says."""
    try:
        st = torch.cuda.host_memory_stats()
    except Exception:  # noqa: BLE001 - an older torch has no such call
        return None
    return {k: v for k, v in st.items() if "bytes" in k and ("current" in k or "peak" in k)}


def deepspeed_layout(engine):
    """Where DeepSpeed put the fp32 master weights, their gradients and the flat gradient
    buffer: numel per device, and whether pinned."""
    opt = getattr(engine, "optimizer", None)
    out = {}
    try:
        groups = getattr(opt, "fp32_partitioned_groups_flat", []) or []
        per = {}
        sizes = []
        for t in groups:
            dev = t.device.type
            per.setdefault(dev, 0)
            per[dev] += t.numel()
            g = t.grad
            sizes.append([t.numel(), dev, bool(t.is_pinned()) if dev == "cpu" else False,
                          g.device.type if g is not None else None,
                          bool(g.is_pinned()) if g is not None and g.device.type == "cpu" else False])
        out["fp32NumelByDevice"] = per
        out["subGroups"] = sizes
        flat = getattr(opt, "grad_partitions_flat_buffer", None)
        if flat is not None:
            out["gradFlat"] = [flat.numel(), flat.device.type, bool(flat.is_pinned()) if flat.device.type == "cpu" else False, flat.element_size()]
    except Exception as e:  # noqa: BLE001 - reported
        out["error"] = str(e)[:300]
    return out


class SavedBytes:
    """Counts the bytes autograd keeps for backward: each storage once, parameters left out."""

    def __init__(self, params):
        self.params = params
        self.seen = {}

    def pack(self, t):
        if isinstance(t, torch.nn.Parameter) or hasattr(t, "ds_id"):
            return t
        try:
            st = t.untyped_storage()
            key = (st.data_ptr(), t.device.type)
            # A weight's view (`weight.t()`) shares the parameter's storage: not an activation.
            weights = {p.data.untyped_storage().data_ptr() for p in self.params}
            if key[0] and key not in self.seen and key[0] not in weights:
                self.seen[key] = st.nbytes()
        except Exception:  # noqa: BLE001 - sparse or meta tensors are not counted
            pass
        return t

    @staticmethod
    def unpack(t):
        return t

    def total(self):
        return sum(v for (p, dev), v in self.seen.items() if dev == "cuda")


def deepspeed_estimate(config, total, largest):
    zero = config.get("zero_optimization", {})
    if zero.get("stage", 0) != 3:
        return None
    opt = (zero.get("offload_optimizer") or {}).get("device", "none") == "cpu"
    par = (zero.get("offload_param") or {}).get("device", "none") == "cpu"
    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            total, largest, num_gpus_per_node=1, num_nodes=1,
            cpu_offload=opt, cpu_offload_params=par, zero_init=True)
        return {"gpuBytes": int(gpu), "cpuBytes": int(cpu)}
    except Exception as e:  # noqa: BLE001 - reported
        return {"error": str(e)[:200]}


def build(model_cfg, ds_config, checkpointing, attn="sdpa", layers=None):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    cfg_dict = dict(model_cfg)
    model_type = cfg_dict.pop("model_type")
    if layers:
        # The same blocks, fewer of them: what one block keeps for backward, measured quickly.
        cfg_dict["num_hidden_layers"] = layers
    cfg = AutoConfig.for_model(model_type, **cfg_dict)
    stage = (ds_config.get("zero_optimization") or {}).get("stage", 0)
    keep = HfDeepSpeedConfig(ds_config) if stage == 3 else None  # noqa: F841 - kept alive
    torch.manual_seed(0)
    # "default" leaves the choice to the model's own class (Gemma-2's is eager attention).
    kwargs = {} if attn == "default" else {"attn_implementation": attn}
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, **kwargs)
    if stage == 3 and not any(hasattr(p, "ds_id") for p in model.parameters()):
        raise RuntimeError("the model was not built inside deepspeed.zero.Init")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model, cfg, keep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--phases", default="")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--label", default="")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--attn", default="sdpa",
                    help="attention implementation: sdpa (default), eager, or default (the model's)")
    ap.add_argument("--layers", type=int, default=None,
                    help="build the model with this many layers instead of its config's")
    ap.add_argument("--trace-peak", action="store_true",
                    help="record the allocator's history over the second step (peak_trace.py)")
    a = ap.parse_args()
    out = {"label": a.label, "model": os.path.basename(a.model)}
    try:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(k, v)
        import deepspeed

        with open(a.config) as f:
            ds_config = json.load(f)
        with open(a.model) as f:
            model_cfg = json.load(f)
        out["zero"] = ds_config.get("zero_optimization")
        out["allocConf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        deepspeed.init_distributed(dist_backend="nccl", verbose=False)
        torch.cuda.set_device(0)
        timeline = HostTimeline()
        out["hostTimeline"] = timeline.peaks
        t0 = time.perf_counter()
        timeline.mark("build")
        model, cfg, keep = build(model_cfg, ds_config, a.checkpointing, a.attn, a.layers)
        out["attn"] = getattr(model.config, "_attn_implementation", a.attn)
        out["layers"] = cfg.num_hidden_layers
        params = list(model.parameters())
        out["params"] = sum(getattr(p, "ds_numel", p.numel()) for p in params)
        largest = max(getattr(p, "ds_numel", p.numel()) for p in params)
        out["largestParam"] = largest
        out["deepspeedEstimate"] = deepspeed_estimate(ds_config, out["params"], largest)
        timeline.mark("initialize")
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
        torch.cuda.synchronize()
        timeline.mark("after-init")
        out["layout"] = deepspeed_layout(engine)
        out["initS"] = round(time.perf_counter() - t0, 1)
        out["afterInitGpuBytes"] = torch.cuda.memory_allocated()
        out["afterInitHostRssBytes"] = rss_bytes()
        out["afterInitHostPeakBytes"] = peak_rss_bytes()
        vocab = cfg.vocab_size
        micro = ds_config.get("train_micro_batch_size_per_gpu", 1)
        phases = [tuple(int(x) for x in p.split("x")) for p in a.phases.split(",") if p] or [(micro, 2048)]
        out["phases"] = []
        for mb, seq in phases:
            tokens = torch.randint(0, vocab, (mb, seq), device="cuda")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            retries0 = torch.cuda.memory_stats().get("num_alloc_retries", 0)
            steps, saved = [], None
            for i in range(a.steps):
                torch.cuda.synchronize()
                tracing = a.trace_peak and i == 1 and not out.get("peakTrace")
                if tracing:
                    import peak_trace
                    base = peak_trace.start()
                if i < 2:
                    timeline.mark(f"step{i}-forward-backward")
                s0 = time.perf_counter()
                if i == 0:
                    counter = SavedBytes(params)
                    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                        loss = engine(input_ids=tokens, labels=tokens).loss
                    saved = counter.total()
                    del counter
                else:
                    loss = engine(input_ids=tokens, labels=tokens).loss
                engine.backward(loss)
                if i < 2:
                    timeline.mark(f"step{i}-optimizer")
                engine.step()
                if i < 2:
                    timeline.mark(f"step{i}-after")
                torch.cuda.synchronize()
                if tracing:
                    out["peakTrace"] = peak_trace.stop(base)
                steps.append((time.perf_counter() - s0) * 1e3)
            window = steps[2:] if len(steps) > 3 else steps
            out["phases"].append({
                "micro": mb, "seq": seq, "tokens": mb * seq,
                "stepsMs": [round(x, 1) for x in steps],
                "medianMs": round(statistics.median(window), 1),
                "savedActivationBytes": saved,
                "peakGpuBytes": torch.cuda.max_memory_allocated(),
                "peakGpuReservedBytes": torch.cuda.max_memory_reserved(),
                "allocRetries": torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries0,
                "hostPeakBytes": peak_rss_bytes(),
                "loss": float(loss.detach().float().item()),
            })
        timeline.mark("end")
        out["hostStages"] = timeline.report()
        last = out["phases"][-1]
        out.update({
            "ok": True,
            "medianMs": last["medianMs"],
            "peakGpuBytes": max(p["peakGpuBytes"] for p in out["phases"]),
            "peakGpuReservedBytes": max(p["peakGpuReservedBytes"] for p in out["phases"]),
            "peakHostRssBytes": peak_rss_bytes(),
        })
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        out.update({"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]})
        if torch.cuda.is_available():
            out["peakGpuBytes"] = torch.cuda.max_memory_allocated()
            out["peakGpuReservedBytes"] = torch.cuda.max_memory_reserved()
        out["peakHostRssBytes"] = peak_rss_bytes()
        traceback.print_exc(file=sys.stderr)
    print(json.dumps(out), flush=True)
    # SuperOffload's and ZenFlow's workers may keep the interpreter alive.
    os._exit(0 if out.get("ok") else 1)


if __name__ == "__main__":
    main()

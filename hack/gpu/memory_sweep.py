"""Measures what each offload placement costs in GPU memory, host memory and step time, one
DeepSpeed engine per process (hack/gpu/ds_step.py), for the operator's memory model
(docs/benchmarks/memory-h200.md).

Each run is `SIZE:PLACEMENT`, PLACEMENT one of
  none            ZeRO-3, nothing offloaded
  ratio=R[/G]     ZeRO-3, offload_optimizer on the CPU with ratio R (sub_group_size G, if given)
  opt             ZeRO-3, offload_optimizer on the CPU (all of it)
  optpar          ZeRO-3, offload_optimizer and offload_param on the CPU
  z2none, z2opt   ZeRO-2 without / with offload_optimizer
or `SIZE:@FILE[#LABEL]` for a configuration rendered elsewhere (the operator's, by
`hack/gpu/memory-bench.sh render`). bf16, AdamW, micro-batch 4 x 512 tokens, pinned host memory.

Usage: python3 memory_sweep.py --out DIR [--deadline-s S] [--steps N] [--trace-peak] RUN...
Writes DIR/memory.jsonl (one object per run, ds_step.py's plus the exit status; a run the host's
OOM killer ends is recorded as such) and prints one line per run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def config_for(placement):
    zero = {"stage": 3}
    if placement.startswith("@"):
        with open(placement[1:].split("#", 1)[0]) as f:
            return json.load(f)
    if placement == "none":
        pass
    elif placement.startswith("ratio="):
        spec = placement.split("=", 1)[1]
        ratio, _, group = spec.partition("/")
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True, "ratio": float(ratio)}
        if group:
            zero["sub_group_size"] = int(float(group))
    elif placement == "opt":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    elif placement == "optpar":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    elif placement == "z2none":
        zero = {"stage": 2}
    elif placement == "z2opt":
        zero = {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    else:
        raise SystemExit(f"unknown placement {placement!r}")
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.0001, "weight_decay": 0.0}},
        "steps_per_print": 1000000,
        "zero_optimization": zero,
    }


def host_facts():
    facts = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    facts["memTotalBytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                facts["cgroupLimit"] = f.read().strip()
            break
        except OSError:
            continue
    return facts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline-s", type=float, default=540)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--trace-peak", action="store_true",
                    help="have ds_step.py record what is alive at the second step's GPU peak")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    start = time.monotonic()
    log = open(os.path.join(a.out, "memory.jsonl"), "a")
    print(json.dumps({"host": host_facts()}), file=log, flush=True)
    for run in a.runs:
        left = a.deadline_s - (time.monotonic() - start)
        if left < 30:
            print(f"{run}: skipped, {left:.0f} s left before the deadline", flush=True)
            continue
        size, _, placement = run.partition(":")
        label = run.rsplit("#", 1)[1] if "#" in run else run
        config = config_for(placement)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(config, f)
            path = f.name
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, os.path.join(HERE, "ds_step.py"), "--config", path,
                 "--size", size, "--steps", str(a.steps), "--label", f"{size} {label}"]
                + (["--trace-peak"] if a.trace_peak else []),
                capture_output=True, text=True, timeout=max(10, left - 5),
            )
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = "timeout", e.stdout or "", e.stderr or ""
            if isinstance(stdout, bytes):
                stdout = stdout.decode(errors="replace")
            if isinstance(stderr, bytes):
                stderr = stderr.decode(errors="replace")
        wall = time.monotonic() - t0
        lines = [l for l in (stdout or "").splitlines() if l.startswith("{")]
        rec = json.loads(lines[-1]) if lines else {"label": run, "ok": False}
        rec.update({"run": f"{size} {label}", "rc": rc, "wallS": round(wall, 1), "config": config["zero_optimization"]})
        if not lines:
            rec["error"] = ("killed by signal %d (the host's OOM killer, if 9)" % -rc
                            if isinstance(rc, int) and rc < 0 else f"no result (exit {rc})")
            rec["stderrTail"] = (stderr or "")[-1500:]
        print(json.dumps(rec), file=log, flush=True)
        gib = lambda b: f"{b / 2**30:.1f}" if isinstance(b, (int, float)) else "-"
        print(
            f"{size + ' ' + label:<28} {'ok ' if rec.get('ok') else 'ERR'} median {rec.get('medianMs')} ms "
            f"gpu {gib(rec.get('peakGpuBytes'))} GiB (reserved {gib(rec.get('peakGpuReservedBytes'))}) "
            f"host {gib(rec.get('peakHostRssBytes'))} GiB params {rec.get('params')} wall {wall:.0f} s"
            + ("" if rec.get("ok") else f" | {str(rec.get('error'))[:300]}"),
            flush=True,
        )
        os.unlink(path)


if __name__ == "__main__":
    main()

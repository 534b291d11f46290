"""Trains each (model shape, offload placement) in its own process (hack/gpu/hf_step.py) and
records what it cost: the GPU and host peaks, the allocator's retries, the step time
(docs/benchmarks/memory-h200.md).

Each run is `MODEL:PLACEMENT[:PHASES][:OPTIONS]`:
  MODEL      a file of hack/gpu/models without `.json` (a Hugging Face config.json)
  PLACEMENT  none | ratio=R[/G] | opt | optpar (as memory_sweep.py), or @FILE[#LABEL] for a
             configuration rendered elsewhere (the operator's)
  PHASES     micro-batch x sequence, comma-separated (default 1x2048)
  OPTIONS    `+` separated: `exp` runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
             `ckpt` with activation checkpointing, `steps=N`, `trace` records what is alive
             at the second step's GPU peak (peak_trace.py), `attn=IMPL` (sdpa, eager, or
             default: the model class's own), `layers=N` (the same blocks, N of them)
bf16, AdamW, ZeRO-3 built inside deepspeed.zero.Init, pinned host memory.

Usage: python3 hf_sweep.py --out DIR [--deadline-s S] RUN...
Writes DIR/memory.jsonl (one object per run; a run the host's OOM killer ends is recorded as
such) and prints one line per run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from memory_sweep import config_for, host_facts  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline-s", type=float, default=540)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    start = time.monotonic()
    log = open(os.path.join(a.out, "memory.jsonl"), "a")
    print(json.dumps({"host": host_facts()}), file=log, flush=True)
    for run in a.runs:
        left = a.deadline_s - (time.monotonic() - start)
        if left < 25:
            print(f"{run}: skipped, {left:.0f} s left before the deadline", flush=True)
            print(json.dumps({"run": run, "skipped": True}), file=log, flush=True)
            continue
        parts = run.split(":")
        model, placement = parts[0], parts[1]
        phases = parts[2] if len(parts) > 2 and parts[2] else "1x2048"
        options = parts[3].split("+") if len(parts) > 3 and parts[3] else []
        label = placement.rsplit("#", 1)[1] if "#" in placement else placement
        config = config_for(placement)
        micro = int(phases.split(",")[0].split("x")[0])
        config["train_micro_batch_size_per_gpu"] = micro
        env = dict(os.environ)
        steps = a.steps
        for o in options:
            if o == "exp":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            elif o.startswith("steps="):
                steps = int(o.split("=", 1)[1])
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(config, f)
            path = f.name
        cmd = [sys.executable, os.path.join(HERE, "hf_step.py"), "--config", path,
               "--model", os.path.join(HERE, "models", model + ".json"), "--phases", phases,
               "--steps", str(steps), "--label", f"{model} {label}"]
        if "ckpt" in options:
            cmd.append("--checkpointing")
        for o in options:
            if o.startswith("attn="):
                cmd += ["--attn", o.split("=", 1)[1]]
            elif o.startswith("layers="):
                cmd += ["--layers", o.split("=", 1)[1]]
        if "trace" in options:
            cmd.append("--trace-peak")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=max(10, left - 5))
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = "timeout", e.stdout or "", e.stderr or ""
            stdout = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
            stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        wall = time.monotonic() - t0
        lines = [line for line in (stdout or "").splitlines() if line.startswith("{")]
        rec = json.loads(lines[-1]) if lines else {"ok": False}
        rec.update({"run": run, "rc": rc, "wallS": round(wall, 1), "config": config["zero_optimization"],
                    "options": options})
        if not lines:
            rec["error"] = ("killed by signal %d (the host's OOM killer, if 9)" % -rc
                            if isinstance(rc, int) and rc < 0 else f"no result (exit {rc})")
        if not rec.get("ok"):
            rec["stderrTail"] = (stderr or "")[-1500:]
        print(json.dumps(rec), file=log, flush=True)
        gib = lambda b: f"{b / 2**30:.1f}" if isinstance(b, (int, float)) else "-"  # noqa: E731
        ph = " ".join(
            f"[{p['tokens']}t {p['medianMs']}ms {gib(p['peakGpuBytes'])}/{gib(p['peakGpuReservedBytes'])} "
            f"saved {gib(p['savedActivationBytes'])} retries {p['allocRetries']}]"
            for p in rec.get("phases", []))
        print(f"{run:<40} {'ok ' if rec.get('ok') else 'ERR'} init {gib(rec.get('afterInitGpuBytes'))} "
              f"host {gib(rec.get('peakHostRssBytes'))} {ph} wall {wall:.0f}s"
              + ("" if rec.get("ok") else f" | {str(rec.get('error'))[:240]}"), flush=True)
        os.unlink(path)


if __name__ == "__main__":
    main()

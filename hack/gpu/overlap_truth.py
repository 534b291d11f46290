"""A synthetic offload step that times itself: the ground truth for the agent's observed GPU-busy
fraction (`offload-agent observe`).

Each step has K chunks; per chunk, GPU work of --gpu-ms (a spin kernel, calibrated with CUDA
events) and CPU work of --cpu-ms (a spin on the host, like an optimizer update of one layer).
`serial`: every kernel, synchronise, then every CPU update (a framework that claims overlap and
serialises). `pipelined`: every kernel queued at once, the host updating chunk i as soon as
kernel i has finished, while the GPU runs the later ones. The next step starts when the CPU
part ends (its kernels need the updated parameters).

Truth: the sum of the kernels' own times (CUDA events around each) over the wall-clock time of
the steps, measured over the window after a warm-up.

Usage: python3 overlap_truth.py --schedule serial|pipelined --gpu-ms G --cpu-ms C
                                [--chunks K] [--seconds S] [--warmup S] [--device I]
Prints one JSON object when the window ends.
"""
import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", choices=["serial", "pipelined"], required=True)
    ap.add_argument("--gpu-ms", type=float, required=True)
    ap.add_argument("--cpu-ms", type=float, required=True)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    stream = torch.cuda.Stream(dev)

    # Calibrate the spin kernel: cycles per millisecond.
    probe = 10_000_000
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(probe)  # warm
        s.record()
        torch.cuda._sleep(probe)
        e.record()
    e.synchronize()
    cycles = max(1, int(probe * a.gpu_ms / s.elapsed_time(e)))

    def cpu_work(ms):
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            pass

    K = a.chunks
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(K)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(K)]

    def step():
        with torch.cuda.stream(stream):
            for i in range(K):
                starts[i].record()
                torch.cuda._sleep(cycles)
                ends[i].record()
        if a.schedule == "serial":
            stream.synchronize()
            for _ in range(K):
                cpu_work(a.cpu_ms)
        else:
            for i in range(K):
                ends[i].synchronize()
                cpu_work(a.cpu_ms)
        stream.synchronize()
        return sum(starts[i].elapsed_time(ends[i]) for i in range(K))

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < a.warmup:
        step()
    busy_ms = 0.0
    steps = 0
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < a.seconds:
        busy_ms += step()
        steps += 1
    wall_ms = (time.perf_counter() - t1) * 1e3
    print(json.dumps({
        "schedule": a.schedule,
        "gpuMsPerChunk": a.gpu_ms,
        "cpuMsPerChunk": a.cpu_ms,
        "chunks": K,
        "steps": steps,
        "stepMs": wall_ms / max(steps, 1),
        "trueBusyFraction": busy_ms / wall_ms,
    }), flush=True)


if __name__ == "__main__":
    main()

"""PyTorch peer of the agent's overlap self-test: exactly its shape and schedule, so the two
efficiencies can be compared side by side.

Shape: K chunks of E fp32 elements; per chunk, GPU work of about the CPU update's time (a spin
kernel, like the agent's compute-bound one, calibrated here) and a CPU Adam update of the chunk.
Schedule, as the agent's `pipelined`: every chunk's kernel on the compute stream, its gradient
copied to pinned host memory on a D2H stream as soon as the kernel ends (event), the host
updating chunk i as soon as its copy lands while the GPU works on later chunks, the parameters
copied back on an H2D stream; one synchronise at the end. `serial` computes everything, then
copies everything out, updates, copies back.

Usage: python3 peer_selftest.py --chunks K --elems E [--repeats N] [--runs R] [--device I]
                                 [--gpus G]
Prints one JSON object per run (R runs of N repetitions, like R runs of the agent): t_gpu,
t_cpu, t_serial, t_pipelined (medians, ms), efficiency (the agent's formula) per repetition
and median. With --gpus G, G processes run at once, one per GPU, each on the CPU share the
agent gives that GPU (its NUMA node's CPUs split between the GPUs of that node, else an even
split), starting each run together; every line then names its GPU.
"""
import argparse
import json
import os
import statistics
import time

import torch


def efficiency(t_gpu, t_cpu, t_copy, t_serial, t_pipe):
    """The agent's formula: the share of what a pipeline can hide that it hid."""
    longest = max(t_gpu, t_cpu, t_copy)
    if longest <= 0 or t_pipe <= 0 or t_serial <= longest:
        return None
    return max(0.0, min(1.0, (t_serial - t_pipe) / (t_serial - longest)))


def parse_cpulist(text):
    cpus = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def split(cpus, n):
    """The agent's even split: contiguous shares, the larger first."""
    base, extra = divmod(len(cpus), n)
    out, at = [], 0
    for i in range(n):
        take = max(1, base + (1 if i < extra else 0))
        out.append(cpus[at:at + take] or cpus[-1:])
        at += take
    return out


def shares(gpus):
    """The agent's split by locality (agent/src/selftest/mod.rs, split_by_locality)."""
    allowed = sorted(os.sched_getaffinity(0))
    local = []
    for i in range(gpus):
        try:
            bus = torch.cuda.get_device_properties(i).pci_bus_id
            domain = getattr(torch.cuda.get_device_properties(i), "pci_domain_id", 0)
            slot = torch.cuda.get_device_properties(i).pci_device_id
            path = f"/sys/bus/pci/devices/{domain:04x}:{bus:02x}:{slot:02x}.0/local_cpulist"
            with open(path) as f:
                mine = [c for c in parse_cpulist(f.read()) if c in allowed]
        except (OSError, ValueError, AttributeError):
            mine = []
        local.append(mine)
    out = [None] * gpus
    groups = {}
    for i, mine in enumerate(local):
        if mine:
            groups.setdefault(tuple(mine), []).append(i)
    claimed = set()
    for cpus, members in groups.items():
        free = [c for c in cpus if c not in claimed] or list(cpus)
        for i, share in zip(members, split(free, len(members))):
            out[i] = share
        claimed.update(free)
    unplaced = [i for i in range(gpus) if out[i] is None]
    if unplaced:
        rest = [c for c in allowed if c not in claimed] or allowed
        for i, share in zip(unplaced, split(rest, len(unplaced))):
            out[i] = share
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, required=True)
    ap.add_argument("--elems", type=int, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--gpus", type=int, default=1)
    a = ap.parse_args()
    if a.gpus <= 1:
        worker(a, a.device, None, None)
        return
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(a.gpus)
    procs = [ctx.Process(target=worker, args=(a, i, cpus, barrier))
             for i, cpus in enumerate(shares(a.gpus))]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


def worker(a, device, cpus, barrier):
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    K, E = a.chunks, a.elems
    d_grads = torch.zeros(K * E, device=dev)
    d_params = torch.zeros(K * E, device=dev)
    h_grads = torch.zeros(K * E, pin_memory=True)
    h_params = torch.zeros(K * E, pin_memory=True)
    m = torch.zeros(K * E)
    v = torch.zeros(K * E)
    compute, d2h, h2d = (torch.cuda.Stream(dev) for _ in range(3))
    b1, b2, lr, eps = 0.9, 0.999, 1e-4, 1e-8

    def chunk(t, i):
        return t[i * E:(i + 1) * E]

    step_t = torch.tensor(1.0)

    def ops_update(i):
        g, p, mi, vi = chunk(h_grads, i), chunk(h_params, i), chunk(m, i), chunk(v, i)
        mi.mul_(b1).add_(g, alpha=1 - b1)
        vi.mul_(b2).addcmul_(g, g, value=1 - b2)
        p.addcdiv_(mi, vi.sqrt().add_(eps), value=-lr / (1 - b1))

    def fused_update(i):
        # PyTorch's fused CPU Adam (one vectorised, multithreaded pass, like the agent's).
        torch._fused_adam_(
            [chunk(h_params, i)], [chunk(h_grads, i)], [chunk(m, i)], [chunk(v, i)], [],
            [step_t], lr=lr, beta1=b1, beta2=b2, weight_decay=0.0, eps=eps,
            amsgrad=False, maximize=False,
        )

    try:
        fused_update(0)
        cpu_update, adam_kind = fused_update, "torch._fused_adam_"
    except Exception:  # noqa: BLE001 - an older build: the plain ops
        cpu_update, adam_kind = ops_update, "torch ops"

    def cpu_only():
        t = time.perf_counter()
        for i in range(K):
            cpu_update(i)
        return (time.perf_counter() - t) * 1e3

    # Calibrate the spin kernel so one chunk of GPU work takes what one chunk of CPU work does.
    cpu_only()
    per_chunk_ms = cpu_only() / K
    probe = 1_000_000
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(compute):
        torch.cuda._sleep(probe)  # the first launch pays for loading the kernel
        s.record()
        torch.cuda._sleep(probe)
        e.record()
    e.synchronize()
    cycles = int(probe * per_chunk_ms / s.elapsed_time(e))

    def gpu_only():
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(compute):
            s.record()
            for _ in range(K):
                torch.cuda._sleep(cycles)
            e.record()
        e.synchronize()
        return s.elapsed_time(e)

    def serial():
        t = time.perf_counter()
        with torch.cuda.stream(compute):
            for _ in range(K):
                torch.cuda._sleep(cycles)
        compute.synchronize()
        with torch.cuda.stream(d2h):
            for i in range(K):
                chunk(h_grads, i).copy_(chunk(d_grads, i), non_blocking=True)
        d2h.synchronize()
        for i in range(K):
            cpu_update(i)
        with torch.cuda.stream(h2d):
            for i in range(K):
                chunk(d_params, i).copy_(chunk(h_params, i), non_blocking=True)
        h2d.synchronize()
        return (time.perf_counter() - t) * 1e3

    def pipelined():
        done = [torch.cuda.Event() for _ in range(K)]
        copied = [torch.cuda.Event() for _ in range(K)]
        t = time.perf_counter()
        for i in range(K):
            with torch.cuda.stream(compute):
                torch.cuda._sleep(cycles)
                done[i].record()
            d2h.wait_event(done[i])
            with torch.cuda.stream(d2h):
                chunk(h_grads, i).copy_(chunk(d_grads, i), non_blocking=True)
                copied[i].record()
        for i in range(K):
            copied[i].synchronize()
            cpu_update(i)
            with torch.cuda.stream(h2d):
                chunk(d_params, i).copy_(chunk(h_params, i), non_blocking=True)
        h2d.synchronize()
        compute.synchronize()
        return (time.perf_counter() - t) * 1e3

    # The step's copies in the slower direction, timed on their own (the agent derives the same
    # figure from its measured bandwidth).
    def copy_ms(to_device):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            if to_device:
                d_params.copy_(h_params, non_blocking=True)
            else:
                h_grads.copy_(d_grads, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t) * 1e3)
        return best

    t_copy = max(copy_ms(True), copy_ms(False))
    serial()
    for run in range(a.runs):
        if barrier is not None:
            barrier.wait()
        runs = []
        for _ in range(a.repeats):
            runs.append((gpu_only(), cpu_only(), serial(), pipelined()))
        effs = [efficiency(g, c, t_copy, s_, p) for g, c, s_, p in runs]
        med = lambda k: statistics.median(r[k] for r in runs)
        out = {
            "run": run + 1,
            "gpu": device,
            "cpus": len(os.sched_getaffinity(0)),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(dev),
            "threads": torch.get_num_threads(),
            "cpuAdam": adam_kind,
            "chunks": K,
            "elems": E,
            "tGpuMs": med(0),
            "tCpuMs": med(1),
            "tSerialMs": med(2),
            "tPipelinedMs": med(3),
            "tCopyMs": t_copy,
            "efficiencies": effs,
            "efficiency": statistics.median([x for x in effs if x is not None]),
        }
        out["pipelinedOverMax"] = out["tPipelinedMs"] / max(out["tGpuMs"], out["tCpuMs"], t_copy)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

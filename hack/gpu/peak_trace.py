"""What is alive at a step's GPU peak, and who allocated it: PyTorch's allocator history
(`torch.cuda.memory._record_memory_history`, Python frames) replayed from the allocation at the
start of the recording; the allocations alive at the largest total are grouped by where they
were made. `hack/gpu/ds_step.py --trace-peak` records its second step this way.
"""
import torch


def start():
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=500000, stacks="python")
    return torch.cuda.memory_allocated()


def where(frames, depth=4):
    """The innermost `depth` frames outside the autograd/dispatch plumbing, as file:line."""
    keep = []
    for f in frames or []:
        name = f.get("filename", "")
        if "/torch/utils/" in name or "/torch/_ops" in name or name.startswith("<"):
            continue
        short = "/".join(name.split("/")[-2:])
        keep.append(f"{short}:{f.get('line')} {f.get('name')}")
        if len(keep) == depth:
            break
    return " < ".join(keep) or "?"


def _delta(ev, sizes):
    """How an event moves the allocated total (`sizes`: the live allocations' sizes by address)."""
    action, addr, size = ev.get("action"), ev.get("addr"), ev.get("size", 0)
    if action == "alloc":
        sizes[addr] = size
        return size
    if action == "free_completed":
        return -sizes.pop(addr, size)
    return 0


def stop(base, top=14):
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = (snap.get("device_traces") or [[]])[0]
    # First pass: where the running total is largest; second: what is alive there.
    total, best, best_at = base, base, -1
    sizes = {}
    for i, ev in enumerate(events):
        total += _delta(ev, sizes)
        if total > best:
            best, best_at = total, i
    alive = {}
    for ev in events[: best_at + 1]:
        if ev.get("action") == "alloc":
            alive[ev.get("addr")] = (ev.get("size", 0), ev.get("frames"))
        elif ev.get("action") == "free_completed":
            alive.pop(ev.get("addr"), None)
    groups = {}
    for size, frames in alive.values():
        key = where(frames)
        n, b = groups.get(key, (0, 0))
        groups[key] = (n + 1, b + size)
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])
    return {
        "baseBytes": base,
        "peakBytes": best,
        "events": len(events),
        "aliveAtPeakFromStep": sum(s for s, _ in alive.values()),
        "groups": [{"where": k, "count": n, "bytes": b} for k, (n, b) in ranked[:top]],
    }

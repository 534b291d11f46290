#!/usr/bin/env python3
"""NVML's two views of how busy GPU 0 is, sampled side by side over a window: the device
utilization the agent reads (`nvmlDeviceGetUtilizationRates`: share of each sample period in
which any kernel ran) and the per-process SM utilization (`nvmlDeviceGetProcessUtilization`:
the driver's own samples, per process). Called like `offload-agent observe` so hack/gpu/ds_step.py
can run it in the agent's place:

    nvml_sampler.py observe --seconds S --interval-ms MS [--samples]

Prints one JSON list of one object (the agent's shape, plus the per-process fields; with
--samples, the device samples themselves, the GPU's UUID and, for --pid P, that process's CPU
time over the window in cores). ctypes only: nothing to install on the GPU machine.
"""
import ctypes
import json
import sys
import time


class ProcUtil(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def main():
    args = sys.argv[1:]
    seconds = float(args[args.index("--seconds") + 1]) if "--seconds" in args else 8.0
    interval = float(args[args.index("--interval-ms") + 1]) / 1000 if "--interval-ms" in args else 0.1
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0
    dev = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
    # Process samples newer than this (microseconds, the driver's clock): start from now.
    last = ctypes.c_ulonglong(int(time.time() * 1e6))
    pid = int(args[args.index("--pid") + 1]) if "--pid" in args else None
    cpu0 = cpu_seconds(pid)
    device, per_pid, seen = [], {}, set()
    t0 = time.time()
    while True:
        u = Util()
        if nvml.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(u)) == 0:
            device.append(u.gpu)
        count = ctypes.c_uint(0)
        # First call sizes the buffer.
        nvml.nvmlDeviceGetProcessUtilization(dev, None, ctypes.byref(count), last)
        if count.value:
            buf = (ProcUtil * count.value)()
            if nvml.nvmlDeviceGetProcessUtilization(dev, buf, ctypes.byref(count), last) == 0:
                for s in buf[: count.value]:
                    key = (s.pid, s.timeStamp)
                    if key in seen:
                        continue
                    seen.add(key)
                    per_pid.setdefault(s.pid, []).append(min(s.smUtil, 100))
                    last = ctypes.c_ulonglong(max(last.value, s.timeStamp))
        if time.time() - t0 >= seconds:
            break
        time.sleep(interval)
    busiest = max(per_pid.items(), key=lambda kv: sum(kv[1]), default=(None, []))
    out = {
        "index": 0,
        "busyFraction": round(sum(device) / (100 * len(device)), 4) if device else None,
        "samples": len(device),
        "processSmUtil": round(sum(busiest[1]) / (100 * len(busiest[1])), 4) if busiest[1] else None,
        "processSamples": len(busiest[1]),
        "processes": len(per_pid),
    }
    if "--samples" in args:
        uuid = ctypes.create_string_buffer(96)
        nvml.nvmlDeviceGetUUID(dev, uuid, 96)
        out["uuid"] = uuid.value.decode()
        out["deviceSamples"] = device
        out["intervalMs"] = round(interval * 1000)
    if pid is not None:
        cpu1 = cpu_seconds(pid)
        out["processCpuCores"] = round((cpu1 - cpu0) / (time.time() - t0), 3)
    print(json.dumps([out]))


def cpu_seconds(pid):
    """User + system CPU time of a process and its threads, seconds (0 without a pid)."""
    if pid is None:
        return 0.0
    import os
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()

"""Peer for the agent's bandwidth figures: a plain pinned (and pageable) host<->device copy of
the same size through PyTorch, best of three, host-timed around a synchronised copy like the
agent's measurement."""
import json
import time

import torch

N = 8 * 8 * (1 << 20)  # the agent's default: 8 chunks x 8 Mi fp32 = 256 MiB
dev = torch.empty(N, dtype=torch.float32, device="cuda")
out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "bytes": N * 4}
for pinned in (True, False):
    host = torch.empty(N, dtype=torch.float32, pin_memory=pinned)
    for name, fn in (("h2d", lambda: dev.copy_(host, non_blocking=pinned)),
                     ("d2h", lambda: host.copy_(dev, non_blocking=pinned))):
        fn(); torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter(); fn(); torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        out[f"{name}_{'pinned' if pinned else 'pageable'}_gbps"] = N * 4 / best / 1e9
print(json.dumps(out, indent=2))

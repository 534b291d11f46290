# Written by offload-operator as sitecustomize.py beside the rendered framework config, where the
# profile asks for the allocator's figures (spec.reportAllocatorPeaks): Python imports it at the
# start of every process of the training container (PYTHONPATH names this directory).
#
# At exit, a process that used CUDA through PyTorch appends one line to the report file
# ($OFFLOAD_MEMORY_REPORT, else the container's termination log):
#     offload.dev/allocator rank=R allocated=BYTES reserved=BYTES [step_ms=MS steps=N]
# torch.cuda.max_memory_allocated() and max_memory_reserved() of its device: what the job
# needed, which NVML's device figure (with the allocator's cache and the CUDA context) is not.
# step_ms: the median time of its training iterations but the first (warm-up), N of them, where
# it ran at least two more: an iteration starts at the first module forward after an optimizer
# step (PyTorch's global hooks, registered once torch has been imported; any optimizer built on
# torch.optim.Optimizer, so DeepSpeed's and Megatron-core's too), so gradient accumulation,
# recomputation and an optimizer stepped in several parts count one iteration each.
# A process that ends on an exception appends the exception's last lines first: the report file
# is the termination log, so the kubelet no longer falls back to the log's last lines, and the
# operator reads the error that ended the process from here instead. Nothing here raises.
import atexit
import os
import sys
import time

_MARK = "offload.dev/allocator"
_failure = []
_reported = []
# When each iteration started (perf_counter), the first _MAX_ITERATIONS of them.
_starts = []
_MAX_ITERATIONS = 100000
_stepped = [True]


def _on_step(*_args):
    _stepped[0] = True


def _on_forward(*_args):
    if _stepped[0]:
        _stepped[0] = False
        if len(_starts) < _MAX_ITERATIONS:
            _starts.append(time.perf_counter())


def _watch(torch):
    try:
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(_on_step)
        register_module_forward_pre_hook(_on_forward)
    except Exception:
        pass


class _WhenTorchLoads:
    # A meta-path finder that only wraps torch's loader, so the hooks go in once torch has
    # been imported whole; it finds nothing itself and leaves after the first look.
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        try:
            import importlib.util

            spec = importlib.util.find_spec("torch")
            loader = spec.loader if spec is not None else None
            real = getattr(loader, "exec_module", None)
            if real is None:
                return spec

            def exec_module(module, _real=real):
                _real(module)
                _watch(module)

            loader.exec_module = exec_module
            return spec
        except Exception:
            return None


def _step_figures():
    # The median iteration but the first, and how many it is taken over.
    times = sorted(b - a for a, b in zip(_starts[1:], _starts[2:]))
    if not times:
        return ""
    mid = len(times) // 2
    median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    return " step_ms=%.1f steps=%d" % (median * 1000.0, len(times))


def _target():
    path = os.environ.get("OFFLOAD_MEMORY_REPORT")
    if path:
        return path
    if os.access("/dev/termination-log", os.W_OK):
        return "/dev/termination-log"
    return None


def _hook(kind, value, tb, _previous=sys.excepthook):
    try:
        import traceback

        lines = traceback.format_exception(kind, value, tb)
        _failure.append("".join(lines)[-1500:])
    except Exception:
        pass
    _previous(kind, value, tb)


def _report():
    if _reported:
        return
    _reported.append(True)
    try:
        path = _target()
        torch = sys.modules.get("torch")
        out = []
        if _failure:
            out.append(_failure[-1].rstrip("\n"))
        if path and torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            out.append(
                "%s rank=%s allocated=%d reserved=%d%s"
                % (
                    _MARK,
                    os.environ.get("RANK", "0"),
                    torch.cuda.max_memory_allocated(),
                    torch.cuda.max_memory_reserved(),
                    _step_figures(),
                )
            )
        if path and out:
            with open(path, "a") as f:
                f.write("\n".join(out) + "\n")
    except Exception:
        pass


def _exit(code, _real=os._exit):
    # os._exit skips atexit (launchers and scripts use it to leave worker threads behind):
    # report first.
    _report()
    _real(code)


sys.excepthook = _hook
atexit.register(_report)
os._exit = _exit
if "torch" in sys.modules:
    _watch(sys.modules["torch"])
else:
    sys.meta_path.insert(0, _WhenTorchLoads())

# A sitecustomize of the image's own still runs: ours steps aside and imports the next one.
_self = sys.modules.get("sitecustomize")
try:
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.modules.pop("sitecustomize", None)
    import sitecustomize  # noqa: F401
except Exception:
    pass
finally:
    if "sitecustomize" not in sys.modules and _self is not None:
        sys.modules["sitecustomize"] = _self

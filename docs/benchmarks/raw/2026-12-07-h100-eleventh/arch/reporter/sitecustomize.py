# Written by offload-operator as sitecustomize.py beside the rendered framework config, where the
# profile asks for the allocator's figures (spec.reportAllocatorPeaks): Python imports it at the
# start of every process of the training container (PYTHONPATH names this directory).
#
# At exit, a process that used CUDA through PyTorch appends one line to the report file
# ($OFFLOAD_MEMORY_REPORT, else the container's termination log):
#     offload.dev/allocator rank=R allocated=BYTES reserved=BYTES
# torch.cuda.max_memory_allocated() and max_memory_reserved() of its device: what the job
# needed, which NVML's device figure (with the allocator's cache and the CUDA context) is not.
# A process that ends on an exception appends the exception's last lines first: the report file
# is the termination log, so the kubelet no longer falls back to the log's last lines, and the
# operator reads the error that ended the process from here instead. Nothing here raises.
import atexit
import os
import sys

_MARK = "offload.dev/allocator"
_failure = []
_reported = []


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
                "%s rank=%s allocated=%d reserved=%d"
                % (
                    _MARK,
                    os.environ.get("RANK", "0"),
                    torch.cuda.max_memory_allocated(),
                    torch.cuda.max_memory_reserved(),
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

#!/usr/bin/env python3
"""offload-sizer: what one training step of a Hugging Face model needs on a GPU, from the
model's own code.

Builds the model from its `config.json` with the `transformers` and `torch` installed here (the
job's own image, or the sizer image), on fake tensors: no weights, no GPU, a few seconds. It
counts the parameters exactly (tied ones once, every expert) and traces one forward and backward
at the job's micro-batch x sequence, with the attention kernel a CUDA GPU runs for it, recording:

  - the bytes alive beyond the parameters at the start of backward (what is kept for it, the
    loss's log-softmax included) and at the step's peak;
  - the order in which the backward completes the parameters' gradients, with the activation
    bytes still alive as each arrives (what a ZeRO gradient flush sits on top of);
  - the parameter tensors in registration order (what DeepSpeed's sub-groups are built from),
    the largest tensor, the largest layer, the largest single activation.

Bytes are counted as PyTorch's CUDA caching allocator counts `memory_allocated`: each storage
rounded up to 512 bytes, views not counted twice. Parameter gradients are dropped as they
complete, as ZeRO and FSDP move them out.

Fused attention: on fake (or meta) tensors `scaled_dot_product_attention` takes its math path and
keeps the sequence² attention weights, which CUDA's fused kernels do not. The trace therefore
calls the kernel a Hopper GPU's dispatcher picks (flash where there is no mask, else memory-
efficient, else math) through its own operator, whose saved tensors are the kernel's.

Usage:
  offload_sizer.py --config config.json --micro-batch 1 --sequence 4096
                   [--attention sdpa|eager|flash_attention_2|...] [--checkpointing]
                   [--dtype bfloat16] [--output trace.json] [--termination-log PATH]
Prints one JSON object (kind ModelTrace, or an error with a code) and exits 0 on a trace, 2 on an
error the input caused, 3 when the model could not be built or traced here.
"""

import argparse
import base64
import gzip
import json
import os
import platform
import resource
import sys
import time
import traceback
import weakref

SCHEMA = "offload.dev/v1alpha1"
VERSION = 1
# The kubelet keeps at most 4096 bytes of a termination message.
TERMINATION_LIMIT = 4096
# What PyTorch's CUDA caching allocator rounds each allocation up to.
ALLOCATION_UNIT = 512
# Bounds of what a sizer accepts: larger than any model trained on one node today.
MAX_TOKENS = 1 << 22
MAX_MICRO_BATCH = 1 << 12
MAX_CONFIG_BYTES = 1 << 20


class SizerError(Exception):
    """An error with a code a runbook can name and one sentence a person can act on."""

    def __init__(self, code, message, exit_code=2):
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code


def rounded(nbytes):
    return -(-nbytes // ALLOCATION_UNIT) * ALLOCATION_UNIT


class LiveBytes:
    """A dispatch mode that counts the bytes of every storage an operation creates while it is
    alive: the CUDA allocator's `memory_allocated`, on fake tensors."""

    def __init__(self, torch, excluded):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_map_only

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tree_map_only(torch.Tensor, tracker.track, out)
                return out

        self.mode = Mode()
        self.excluded = excluded
        self.seen = {}
        self.live = 0
        self.peak = 0
        self.peak_at = "forward"
        self.phase = "forward"
        self.largest = 0

    def track(self, t):
        try:
            st = t.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return
        key = st._cdata
        if key in self.seen or key in self.excluded:
            return
        size = rounded(st.nbytes())
        self.seen[key] = size
        self.live += size
        self.largest = max(self.largest, size)
        if self.live > self.peak:
            self.peak = self.live
            self.peak_at = self.phase
        weakref.finalize(st, self.free, key)

    def free(self, key):
        self.live -= self.seen.pop(key, 0)


def load_config(path, transformers):
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise SizerError("ConfigUnreadable", f"cannot read {path}: {e.strerror}") from e
    if len(raw) > MAX_CONFIG_BYTES:
        raise SizerError("ConfigTooLarge", f"{path} is over {MAX_CONFIG_BYTES} bytes: give the model's config.json")
    try:
        fields = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise SizerError("ConfigNotJson", f"{path} is not JSON ({e}): give the model's config.json") from e
    if not isinstance(fields, dict):
        raise SizerError("ConfigNotJson", f"{path} holds a JSON {type(fields).__name__}, not an object: give the model's config.json")
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str) or not model_type:
        raise SizerError("NoModelType", "the config.json has no model_type: give the file a model card ships")
    if fields.get("auto_map"):
        raise SizerError(
            "CustomCode",
            f"model_type {model_type} is built by the model's own code (auto_map), which the sizer does not run",
            exit_code=3,
        )
    fields.pop("transformers_version", None)
    try:
        config = transformers.AutoConfig.for_model(model_type, **fields)
    except ValueError as e:
        raise SizerError(
            "UnknownModelType",
            f"transformers {transformers.__version__} does not know model_type {model_type}: use an image whose transformers builds it",
            exit_code=3,
        ) from e
    except (TypeError, KeyError, AttributeError) as e:
        raise SizerError("ConfigRejected", f"transformers rejected the config.json: {e}") from e
    return model_type, config


def build(transformers, torch, config, dtype, attention):
    """The model as the job's code builds it, on fake tensors, and the attention it resolved."""
    kwargs = {"dtype": dtype}
    if attention and attention not in ("sdpa-auto", "auto"):
        # FlashAttention packages keep what SDPA's flash kernel keeps; they need a GPU to load.
        kwargs["attn_implementation"] = "sdpa" if attention.startswith("flash_attention") else attention
    errors = []
    for auto in ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModel"):
        cls = getattr(transformers, auto, None)
        if cls is None:
            continue
        try:
            return cls.from_config(config, **kwargs), auto
        except ValueError as e:
            # Not this auto class's type, or an attention implementation the type refuses.
            errors.append(f"{auto}: {e}")
            if "attention" in str(e).lower() and "attn_implementation" in kwargs:
                raise SizerError("AttentionRefused", f"{str(e).splitlines()[0][:300]}", exit_code=2) from e
    raise SizerError("NotBuildable", "no auto class of transformers builds this config: " + "; ".join(errors)[:400], exit_code=3)


def hopper_attention(torch):
    """`scaled_dot_product_attention` as a Hopper GPU runs it: the kernel its dispatcher picks,
    called through that kernel's own operator so that autograd keeps what the kernel keeps.
    Returns the replacement and the counts of each kernel used."""
    original = torch.nn.functional.scaled_dot_product_attention
    used = {"flash": 0, "efficient": 0, "math": 0}
    low = (torch.float16, torch.bfloat16)

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        heads, kv_heads = query.shape[-3], key.shape[-3]
        head_dim = query.shape[-1]
        # Flash needs one head width for all three; the memory-efficient kernel takes values of
        # another (latent attention's).
        same = key.shape[-1] == head_dim and value.shape[-1] == head_dim
        gqa = heads != kv_heads
        four_d = query.dim() == 4
        if os.environ.get("SIZER_DEBUG"):
            print("sdpa", tuple(query.shape), tuple(key.shape), query.dtype, attn_mask is None and "nomask" or tuple(attn_mask.shape), is_causal, enable_gqa, file=sys.stderr)
        if four_d and attn_mask is None and query.dtype in low and same and head_dim <= 256 and (not gqa or enable_gqa):
            used["flash"] += 1
            # Causal with fewer queries than keys is not what training runs; flash takes it as is.
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )[0]
            return out
        if four_d and not gqa and key.shape[-1] == head_dim:
            used["efficient"] += 1
            bias = attn_mask
            if bias is not None and bias.dtype == torch.bool:
                # SDPA turns a boolean mask into an additive one of the query's dtype.
                bias = torch.zeros_like(bias, dtype=query.dtype).masked_fill_(bias.logical_not(), float("-inf"))
            if bias is not None:
                bias = bias.expand(query.shape[0], heads, query.shape[-2], key.shape[-2])
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, True, dropout_p, is_causal, scale=scale
            )[0]
            # The CUDA kernel lays its output out as the query is laid out; the meta kernel always
            # by sequence. A query contiguous by head (a rotary that concatenates) then makes the
            # model copy the output for its projection, as on the GPU.
            if query.is_contiguous() and not out.is_contiguous():
                out = out.contiguous()
            return out
        used["math"] += 1
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)

    return original, sdpa, used


def repeats(items, max_period=64):
    """`items` as runs: `[[item...], n]` where the items repeat n times in a row, so a model's
    identical layers are written once."""
    out = []
    i, n = 0, len(items)
    while i < n:
        best = (1, 1)
        for p in range(1, min(max_period, (n - i) // 2) + 1):
            k = 1
            while i + (k + 1) * p <= n and items[i + k * p:i + (k + 1) * p] == items[i:i + p]:
                k += 1
            if k > 1 and p * k > best[0] * best[1]:
                best = (p, k)
        p, k = best
        if out and k == 1 and out[-1][1] == 1:
            out[-1][0].append(items[i])
        else:
            out.append([list(items[i:i + p]), k])
        i += p * k
    return out


def as_the_job_runs(transformers):
    """Makes the library take the paths a training process takes: `transformers` treats fake
    tensors as a graph being traced (`is_tracing`) and then builds the causal mask that lets no
    fused kernel run. Returns what puts it back."""
    from transformers.utils import import_utils

    original = import_utils.is_tracing

    def is_tracing(tensor=None):
        return original(None)

    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers") and vars(module).get("is_tracing") is original:
            module.is_tracing = is_tracing
            patched.append(module)

    def restore():
        for module in patched:
            module.is_tracing = original

    return restore


def as_the_job_runs(transformers):
    """Answers the library's data-dependent questions as a training step of unpadded, unpacked
    sequences does. `transformers` cannot read a fake tensor's values, so it takes the position
    ids as possibly packed sequences and builds a causal mask, which keeps the fused kernels from
    running. Returns what puts it back."""
    from transformers import masking_utils

    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original is None:
        return lambda: None
    masking_utils.find_packed_sequence_indices = lambda position_ids: None

    def restore():
        masking_utils.find_packed_sequence_indices = original

    return restore


def layer_list(torch, model):
    """The longest ModuleList of the model: its transformer layers."""
    best = None
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and (best is None or len(m) > len(best)):
            best = m
    return best


def trace(args):
    t0 = time.monotonic()
    try:
        import torch
        import transformers
    except ImportError as e:
        raise SizerError("NoFramework", f"this image has no {e.name}: run the sizer from an image with torch and transformers", exit_code=3) from e
    from torch._subclasses.fake_tensor import FakeTensorMode

    transformers.logging.set_verbosity_error()
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    model_type, config = load_config(args.config, transformers)
    torch.manual_seed(0)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model, auto = build(transformers, torch, config, dtype, args.attention)
    model.train()
    if getattr(model.config, "use_cache", None) is not None:
        model.config.use_cache = False
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = list(model.parameters())
    if not params:
        raise SizerError("NoParameters", "the model built from this config has no parameters", exit_code=3)
    tensors = [p.numel() for p in params]
    layers = layer_list(torch, model)
    largest_layer = max((sum(p.numel() for p in m.parameters()) for m in layers), default=0) if layers else 0
    excluded = {p.untyped_storage()._cdata for p in params}
    excluded |= {b.untyped_storage()._cdata for b in model.buffers()}
    vocab = getattr(model.config, "vocab_size", None) or getattr(model.config.get_text_config(), "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise SizerError("NoVocabulary", "the config gives no vocab_size to draw tokens from", exit_code=2)
    attention = getattr(model.config, "_attn_implementation", None) or "default"

    untraced = as_the_job_runs(transformers)
    tracker = LiveBytes(torch, excluded)
    gradients = []
    index = {id(p): i for i, p in enumerate(params)}
    grad_order = []

    def arrived(p):
        # The gradient that arrived is DeepSpeed's to move: alive now, gone once it has.
        g = p.grad
        grad_bytes = rounded(g.untyped_storage().nbytes()) if g is not None else 0
        gradients.append([p.numel(), max(0, tracker.live - grad_bytes)])
        grad_order.append(index[id(p)])
        p.grad = None

    hooks = [p.register_post_accumulate_grad_hook(arrived) for p in params if p.requires_grad]
    original, replacement, kernels = hopper_attention(torch)
    torch.nn.functional.scaled_dot_product_attention = replacement
    try:
        with fake:
            tokens = torch.randint(0, vocab, (args.micro_batch, args.sequence))
            with tracker.mode:
                out = model(input_ids=tokens, labels=tokens)
                loss = out.loss if hasattr(out, "loss") else None
                if loss is None:
                    raise SizerError("NoLoss", f"{type(model).__name__} gives no loss from labels: the sizer traces causal language models", exit_code=3)
                del out
                tracker.phase = "backward"
                saved = tracker.live
                peak_forward = tracker.peak
                loss.backward()
                del loss
    except SizerError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the model's own code is reported
        traceback.print_exc(file=sys.stderr)
        raise SizerError("TraceFailed", f"tracing {type(model).__name__} failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", exit_code=3) from e
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
        untraced()
        for h in hooks:
            h.remove()
    if not gradients:
        raise SizerError("NoGradients", "the traced step completed no gradient", exit_code=3)

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "apiVersion": SCHEMA,
        "kind": "ModelTrace",
        "version": VERSION,
        **({"key": args.key} if args.key else {}),
        "modelType": model_type,
        "modelClass": type(model).__name__,
        "attention": attention if attention != "sdpa" else "sdpa",
        "kernels": {k: v for k, v in kernels.items() if v},
        "microBatch": args.micro_batch,
        "sequence": args.sequence,
        "checkpointing": bool(args.checkpointing),
        "dtype": args.dtype,
        "parameters": sum(tensors),
        "tensors": repeats(tensors),
        "largestTensor": max(tensors),
        "layers": len(layers) if layers else 0,
        "largestLayer": largest_layer,
        "savedBytes": saved,
        "forwardPeakBytes": peak_forward,
        "peakBytes": tracker.peak,
        "peakAt": tracker.peak_at,
        "largestActivationBytes": tracker.largest,
        "gradients": repeats(delta_encoded(gradients)),
        "versions": {
            "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "wallSeconds": round(time.monotonic() - t0, 2),
        "maxRssBytes": usage.ru_maxrss * 1024,
    }


def delta_encoded(gradients):
    """Each gradient as [numel, bytes freed since the previous one]: identical layers then give
    identical entries (the alive bytes are the saved bytes less the running sum)."""
    out = []
    prev = None
    for numel, alive in gradients:
        out.append([numel, 0 if prev is None else prev - alive])
        prev = alive
    if out:
        # The first entry carries the alive bytes themselves.
        out[0][1] = gradients[0][1]
    return out


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def termination_text(obj):
    """The result as the kubelet keeps it: compact JSON, or gzip + base64 behind `gz:` where the
    JSON is longer than a termination message holds."""
    text = compact(obj)
    if len(text) <= TERMINATION_LIMIT:
        return text
    packed = "gz:" + base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()
    if len(packed) <= TERMINATION_LIMIT:
        return packed
    return compact({"apiVersion": SCHEMA, "kind": "ModelTraceError", "version": VERSION,
                    "error": {"code": "TraceTooLarge",
                              "message": f"the trace is {len(packed)} bytes packed, more than a termination message holds"}})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the model's config.json")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--sequence", type=int, required=True, help="tokens per sequence")
    ap.add_argument("--attention", default="auto",
                    help="attention implementation (auto: the config's, else the library's default for the type)")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--key", help="the operator's key of the step, written into the trace")
    ap.add_argument("--output", help="also write the JSON here")
    ap.add_argument("--termination-log", help="write the compact result here (a pod's termination message)")
    args = ap.parse_args(argv)
    try:
        if not 1 <= args.micro_batch <= MAX_MICRO_BATCH:
            raise SizerError("BadShape", f"--micro-batch {args.micro_batch} is out of range: use 1 to {MAX_MICRO_BATCH}")
        if not 1 <= args.sequence or args.micro_batch * args.sequence > MAX_TOKENS:
            raise SizerError("BadShape", f"{args.micro_batch} x {args.sequence} tokens is out of range: use 1 to {MAX_TOKENS} tokens a micro-batch")
        result = trace(args)
        code = 0
    except SizerError as e:
        result = {"apiVersion": SCHEMA, "kind": "ModelTraceError", "version": VERSION,
                  "error": {"code": e.code, "message": e.message}}
        code = e.exit_code
    except Exception as e:  # noqa: BLE001 - reported with a code, never a bare traceback
        traceback.print_exc(file=sys.stderr)
        result = {"apiVersion": SCHEMA, "kind": "ModelTraceError", "version": VERSION,
                  "error": {"code": "SizerFailed", "message": f"{type(e).__name__}: {str(e)[:300]}"}}
        code = 3
    text = json.dumps(result)
    print(text, flush=True)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    if args.termination_log:
        try:
            with open(args.termination_log, "w") as f:
                f.write(termination_text(result))
        except OSError as e:
            print(f"cannot write {args.termination_log}: {e.strerror}", file=sys.stderr)
    sys.stdout.flush()
    # A model's worker threads must not keep the pod alive.
    os._exit(code)


if __name__ == "__main__":
    main()

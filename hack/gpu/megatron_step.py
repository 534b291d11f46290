"""One Megatron-core configuration, one GPT shape: what it costs in GPU memory, host memory and
step time on this node (docs/benchmarks/megatron-h200.md).

The model is Megatron-core's own GPTModel (the local layer spec: Megatron-core modules only, no
Transformer Engine), bf16 parameters (Megatron-LM's `Float16Module`), fp32 gradient reduction (Megatron-LM's
setting for bf16), wrapped in Megatron-core's DistributedDataParallel and trained by the optimizer
`get_megatron_optimizer` builds — the distributed optimizer, and the hybrid device optimizer
where the flags ask for it. Attention is recomputed in backward (`--recompute-granularity
selective`, Megatron-LM's advice; without it the local spec keeps the sequence² scores that a
fused attention never stores). Random tokens.

The offload settings come as the operator renders them: the text of OFFLOAD_MEGATRON_ARGS
(`--args`), parsed here with exactly the flags Megatron-LM's argument parser has for them; a
flag the operator renders that is not among them fails the run.

Run under torchrun, one process per GPU:
  torchrun --nproc-per-node N megatron_step.py --layers L --hidden H --heads A --vocab V
      --seq S [--micro M] [--ffn F] [--tp T] [--sequence-parallel] [--dropout P]
      [--steps 6] [--args "$OFFLOAD_MEGATRON_ARGS"] [--label NAME]
Rank 0 prints one JSON object: the peaks (`torch.cuda.max_memory_allocated` /
`max_memory_reserved` of rank 0, the largest over ranks beside it), the host peak (peak RSS and
the pinned bytes), the step times. A run that fails (CUDA out of memory) says so with its peaks.
"""
import argparse
import gc
import json
import os
import resource
import shlex
import statistics
import sys
import time
import traceback

import torch


def offload_flags(text):
    """The operator's rendered flags, as Megatron-LM's arguments.py defines them."""
    p = argparse.ArgumentParser(prog="OFFLOAD_MEGATRON_ARGS", add_help=False, exit_on_error=False)
    p.add_argument("--use-distributed-optimizer", action="store_true")
    p.add_argument("--optimizer-cpu-offload", action="store_true")
    p.add_argument("--use-precision-aware-optimizer", action="store_true")
    p.add_argument("--optimizer-offload-fraction", type=float, default=1.0)
    p.add_argument("--overlap-cpu-optimizer-d2h-h2d", action="store_true")
    p.add_argument("--no-pin-cpu-grads", dest="pin_cpu_grads", action="store_false")
    p.add_argument("--no-pin-cpu-params", dest="pin_cpu_params", action="store_false")
    # Not an offload flag: Megatron-LM's training loop runs `gc.disable(); gc.collect()` before
    # its first step under it, which frees what the first hybrid optimizer left (the bench does
    # the same where the flag is given: the operator renders it with the offload flags, and
    # MANUAL_GC=1 of megatron-bench.sh adds it to runs without offload), and then one every
    # --manual-gc-interval steps (0: none).
    p.add_argument("--manual-gc", action="store_true")
    p.add_argument("--manual-gc-interval", type=int, default=0)
    return p.parse_args(shlex.split(text or ""))


def host_figures():
    out = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "VmLck", "VmPin"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def gather_max(value):
    t = torch.tensor([float(value)], device="cuda")
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())


def without_transformer_engine():
    """Megatron-core 0.14 asks Transformer Engine's version in `OptimizerConfig` whenever
    `--use-precision-aware-optimizer` is set (`is_te_min_version("2.1.0")`, which compares None
    where TE is absent and raises TypeError), though the hybrid device optimizer it builds for
    `--optimizer-cpu-offload` uses no TE code. Where TE is not installed (this bench's local
    layer spec needs none), the version check answers "older than asked" instead: the only
    setting it decides here is `store_param_remainders`, which the hybrid optimizer ignores.
    Returns whether the check was replaced (recorded in the run's JSON)."""
    try:
        import transformer_engine  # noqa: F401

        return False
    except ImportError:
        pass
    import megatron.core.optimizer as opt
    import megatron.core.optimizer.optimizer_config as cfg

    def older(_version, check_equality=True):
        return False

    cfg.is_te_min_version = older
    opt.is_te_min_version = older
    return True


def build(a, flags):
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
    )
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=1
    )
    model_parallel_cuda_manual_seed(1234)
    cfg = TransformerConfig(
        num_layers=a.layers,
        hidden_size=a.hidden,
        num_attention_heads=a.heads,
        ffn_hidden_size=a.ffn or 4 * a.hidden,
        tensor_model_parallel_size=a.tp,
        sequence_parallel=a.sequence_parallel and a.tp > 1,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        hidden_dropout=a.dropout,
        attention_dropout=a.dropout,
        recompute_granularity="selective",
    )
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=a.vocab,
        max_sequence_length=a.seq,
    ).cuda(torch.cuda.current_device())
    # Megatron-LM's `get_model` for bf16: every parameter in bf16 (the local spec's torch norms
    # are created in fp32 otherwise), inputs cast in, the loss cast out.
    model = Float16Module(cfg, model)
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=flags.use_distributed_optimizer,
    )
    model = DistributedDataParallel(config=cfg, ddp_config=ddp, module=model)
    opt = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=1e-5,
            weight_decay=0.01,
            bf16=True,
            params_dtype=torch.bfloat16,
            clip_grad=1.0,
            use_distributed_optimizer=flags.use_distributed_optimizer,
            optimizer_cpu_offload=flags.optimizer_cpu_offload,
            optimizer_offload_fraction=flags.optimizer_offload_fraction
            if flags.optimizer_cpu_offload
            else 0.0,
            overlap_cpu_optimizer_d2h_h2d=flags.overlap_cpu_optimizer_d2h_h2d,
            use_precision_aware_optimizer=flags.use_precision_aware_optimizer,
            pin_cpu_grads=flags.pin_cpu_grads,
            pin_cpu_params=flags.pin_cpu_params,
        ),
        [model],
    )
    return model, opt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--ffn", type=int, default=None)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--micro", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--sequence-parallel", action="store_true")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--args", default=os.environ.get("OFFLOAD_MEGATRON_ARGS", ""))
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    flags = offload_flags(a.args)

    torch.distributed.init_process_group(backend="nccl")
    rank = torch.distributed.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    out = {
        "label": a.label,
        "shape": {k: getattr(a, k) for k in ("layers", "hidden", "heads", "ffn", "vocab",
                                             "seq", "micro", "tp", "sequence_parallel",
                                             "dropout")},
        "world": torch.distributed.get_world_size(),
        "args": a.args,
        "flags": vars(flags),
        "torch": torch.__version__,
    }
    try:
        import megatron.core

        out["megatron_core"] = megatron.core.__version__
    except Exception:  # noqa: BLE001
        pass
    times = []
    try:
        from megatron.core.distributed import finalize_model_grads

        out["te_version_check_replaced"] = without_transformer_engine()
        model, opt = build(a, flags)
        if flags.manual_gc:
            # As Megatron-LM's `train()` does under --manual-gc, before the first step.
            gc.disable()
            gc.collect()
        torch.cuda.synchronize()
        out["after_init_allocated_bytes"] = torch.cuda.memory_allocated()
        out["parameters_on_rank"] = sum(p.numel() for p in model.parameters())
        tokens = torch.randint(0, a.vocab, (a.micro, a.seq), device="cuda")
        labels = torch.roll(tokens, -1, 1)
        positions = torch.arange(a.seq, device="cuda").unsqueeze(0).expand_as(tokens)
        for step in range(a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.zero_grad_buffer()
            opt.zero_grad()
            loss = model(tokens, positions, None, labels=labels).float().mean()
            loss.backward()
            finalize_model_grads([model])
            if step == 0:
                # Where the peak falls: forward and backward before the optimizer's first step
                # (its state is made lazily there), then the step.
                out["first_backward_allocated_peak_bytes"] = torch.cuda.max_memory_allocated()
                out["first_backward_allocated_bytes"] = torch.cuda.memory_allocated()
            ok, grad_norm, _ = opt.step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000.0)
            if step == 0:
                out["first_step_allocated_peak_bytes"] = torch.cuda.max_memory_allocated()
                out["after_first_step_allocated_bytes"] = torch.cuda.memory_allocated()
            every = flags.manual_gc_interval
            if flags.manual_gc and every > 0 and (step + 1) % every == 0:
                gc.collect()
        out["ended"] = "trained"
        out["loss"] = float(loss.item())
    except torch.OutOfMemoryError as e:
        out["ended"] = "cuda-oom"
        out["error"] = str(e).splitlines()[0][:400]
    except Exception as e:  # noqa: BLE001
        out["ended"] = "error"
        out["error"] = "".join(traceback.format_exception_only(type(e), e))[-800:]
        traceback.print_exc(file=sys.stderr)
    allocated = torch.cuda.max_memory_allocated()
    reserved = torch.cuda.max_memory_reserved()
    out["gpu_allocated_peak_bytes"] = allocated
    out["gpu_reserved_peak_bytes"] = reserved
    out["host"] = host_figures()
    try:
        out["gpu_allocated_peak_max_over_ranks"] = gather_max(allocated)
        out["host_peak_max_over_ranks"] = gather_max(out["host"]["peak_rss_bytes"])
    except Exception:  # noqa: BLE001 — a rank that died leaves the others without a peer
        pass
    out["step_ms"] = [round(t, 1) for t in times]
    if len(times) > 2:
        out["step_ms_median"] = round(statistics.median(times[2:]), 1)
    if rank == 0:
        print(json.dumps(out), flush=True)
    try:
        torch.distributed.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


if __name__ == "__main__":
    main()

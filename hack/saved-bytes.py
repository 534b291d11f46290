"""What a Hugging Face model's blocks keep for backward, counted on the CPU.

Builds the model from a `config.json` (random weights, bf16, SDPA attention, as
hack/gpu/hf_step.py does on the GPU), runs one forward with labels under
`torch.autograd.graph.saved_tensors_hooks` and counts the bytes of the tensors autograd saved:
each storage once, parameters left out — the same count as hf_step.py's
`savedActivationBytes`. With transformers 5.17 and torch 2.11 the CPU's count of Phi-3-mini,
Gemma-2-2B, OLMo-2-7B and StarCoder2-7B, extrapolated from one, two and three layers to the
whole model, gave each H100 run's figure within 0.01 % (docs/benchmarks/memory-h200.md): the
tensors attention and the blocks keep are chosen by the model's Python code and by SDPA's
dispatch, the same on both. It is a stand-in for a GPU for what is kept, not for the peak
(the allocator, DeepSpeed's buffers and the backward's transients are not here).

Usage (a virtual environment with torch and transformers, any CPU, a few GiB of memory):
    python3 hack/saved-bytes.py CONFIG.json LAYERS SEQUENCE [--verbose]
prints one JSON object: the layers and sequence run, the bytes saved and the bytes per token;
`--verbose` adds each saved storage (bytes, shape, dtype, the op that made it). Run it at two
layer counts: the difference is one layer's bytes, the rest is what the model keeps outside
its layers (the embedding's output, the final norm, the loss).
"""
import argparse
import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("layers", type=int)
    ap.add_argument("sequence", type=int)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    fields = json.load(open(a.config))
    model_type = fields.pop("model_type")
    fields["num_hidden_layers"] = a.layers
    # A listed layer pattern is for the whole model: the config recomputes it for fewer layers.
    fields.pop("layer_types", None)
    cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    model.config.use_cache = False
    weights = {p.data.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        if isinstance(t, torch.nn.Parameter):
            return t
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key and key not in seen and key not in weights:
            seen[key] = {
                "bytes": storage.nbytes(),
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "op": t.grad_fn.name() if t.grad_fn is not None else None,
            }
        return t

    tokens = torch.randint(0, cfg.vocab_size, (1, a.sequence))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=tokens, labels=tokens)
    total = sum(s["bytes"] for s in seen.values())
    out = {"config": a.config, "layers": a.layers, "sequence": a.sequence,
           "savedBytes": total, "perToken": total / a.sequence}
    if a.verbose:
        out["storages"] = list(seen.values())
    print(json.dumps(out))


if __name__ == "__main__":
    main()

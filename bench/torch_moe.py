#!/usr/bin/env python3
"""torch_moe.py — PyTorch eager on the shapes of `hyperpar bench moe`: one sparse MoE layer, timed in the same run.

    python3 bench/torch_moe.py --family F --hidden H --experts E --top-k K --intermediate I [--shared sI]
                               [--groups G --topk-group TG] --tokens T --threads N --reps R --dtype f32|bf16|autocast

The layer is transformers' own sparse block for the family (Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock,
Qwen2MoeSparseMoeBlock, DeepseekV3MoE, GptOssMLP: a loop over the hit experts, the eager code a transformers user
runs) built from a config with the preset's dimensions, or, without transformers, bench/torch_model.py's
plain-torch MoE (the same loop) for the softmax-routed families. Weights are random (normal, std 1/sqrt(fan-in)),
so the router routes as hyperpar's real router does on random weights, not as the balanced benchmark router. x is
[1, T, H] normal. --dtype bf16: the block in bfloat16 (PyTorch's bf16 model); autocast: f32 weights, the forward
under torch.autocast('cpu', bfloat16). Under torch.no_grad(), one warm-up, then R timed; prints one JSON object:
the median seconds with the least and the greatest (min_s, max_s), tokens/s (T over the median), the model, torch's
version and threads; or {"error": "..."}.

`hyperpar bench moe` carries this file and bench/torch_model.py inside its binary (CMake embeds them) and runs
them as bench_torch.c says; run by hand it imports torch_model.py from its own folder.
"""
import argparse
import contextlib
import json
import os
import sys
import time

# family -> (transformers model_type, module, class of the sparse block)
BLOCKS = {
    "qwen3_moe": ("qwen3_moe", "modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock"),
    "qwen2_moe": ("qwen2_moe", "modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock"),
    "mixtral": ("mixtral", "modeling_mixtral", "MixtralSparseMoeBlock"),
    "deepseek_v3": ("deepseek_v3", "modeling_deepseek_v3", "DeepseekV3MoE"),
    "gpt_oss": ("gpt_oss", "modeling_gpt_oss", "GptOssMLP"),
}


def config_of(a):
    """The config keys each family's block reads, with the preset's dimensions."""
    return {"hidden_size": a.hidden, "num_experts": a.experts, "num_local_experts": a.experts,
            "n_routed_experts": a.experts, "num_experts_per_tok": a.top_k, "moe_intermediate_size": a.intermediate,
            "intermediate_size": a.intermediate, "shared_expert_intermediate_size": a.shared,
            "n_shared_experts": 1 if a.shared else 0, "n_group": a.groups, "topk_group": a.topk_group,
            "norm_topk_prob": True, "hidden_act": "silu"}


def transformers_block(a):
    try:
        import importlib
        from transformers import AutoConfig
        model_type, module, cls = BLOCKS[a.family]
        mod = importlib.import_module("transformers.models.%s.%s" % (model_type, module))
        cfg = AutoConfig.for_model(model_type, **config_of(a))
        cfg._experts_implementation = "eager"  # transformers' loop over the hit experts (its default)
        return getattr(mod, cls)(cfg), "transformers %s" % cls
    except Exception:
        return None, None


def plain_block(a):
    import torch_model
    if a.family not in ("qwen3_moe", "qwen2_moe", "mixtral"):
        raise RuntimeError("no PyTorch model of family %s without transformers" % a.family)
    cfg = dict(config_of(a), model_type=a.family)
    if a.family != "qwen2_moe":
        cfg["shared_expert_intermediate_size"] = 0
    return torch_model.MoE(cfg), "plain-torch MoE (bench/torch_model.py)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", required=True)
    for k in ("hidden", "experts", "top-k", "intermediate", "tokens", "threads"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--shared", type=int, default=0)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--topk-group", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", choices=["f32", "bf16", "autocast"], default="f32")
    a = ap.parse_args()
    try:
        import torch
        if "torch_model" not in sys.modules:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import torch_model
        torch.set_num_threads(a.threads)
        torch.manual_seed(0)
        block, kind = transformers_block(a)
        if block is None:
            block, kind = plain_block(a)
        with torch.no_grad():
            for p in block.parameters():
                p.normal_(0.0, p.shape[-1] ** -0.5 if p.dim() > 1 else 0.1)
        x = torch.randn(1, a.tokens, a.hidden)
        if a.dtype == "bf16":
            block, x = block.to(torch.bfloat16), x.to(torch.bfloat16)
        ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.dtype == "autocast" else contextlib.nullcontext
        block.eval()

        def step():
            with torch.no_grad(), ctx():
                block(x)

        step()
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        lo, med, hi = torch_model.spread(times)
        print(json.dumps({"median_s": med, "min_s": lo, "max_s": hi, "tokens_per_s": a.tokens / med,
                          "model": "%s, %s" % (kind, a.dtype),
                          "torch": torch.__version__, "threads": torch.get_num_threads()}))
    except Exception as e:  # the bench reports it as a note
        print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))


if __name__ == "__main__":
    main()

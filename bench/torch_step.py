#!/usr/bin/env python3
"""torch_step.py — PyTorch eager on the shapes of `hyperpar bench train` / `bench run`, timed in the same run.

    python3 bench/torch_step.py MODEL --mode train|forward|decode --batch B --tokens T --threads N --reps R
                                [--dtype f32|bf16|autocast] [--new-tokens N]

MODEL is the bench's own random checkpoint folder, so the model has the preset's shapes (and the same weights,
widened to float32, or bf16 with --dtype bf16 in forward mode): transformers' AutoModelForCausalLM with eager
attention when transformers builds the family, otherwise bench/torch_model.py's plain-torch model. The batch is
the bench's: ids[i] = (i * 2654435761 + 1) mod V over [B, T]. train: one step is zero_grad, the forward, the mean
next-token cross-entropy over B*(T-1) positions, backward and torch.optim.AdamW.step() at its defaults; forward:
the forward and the loss under torch.no_grad(). --dtype autocast (train, hyperpar's --compute bf16): the same
step with the forward under torch.autocast('cpu', torch.bfloat16), f32 weights and optimizer. One warm-up, then R timed; prints one JSON object: the median
seconds with the least and the greatest (min_s, max_s), tokens/s (B*T over the median), the model, torch's version and
threads; or {"error": "..."}.

`hyperpar bench` carries this file and bench/torch_model.py inside its binary (CMake embeds them) and runs them
with `$HP_BENCH_PYTHON` (default python3) as `python3 -B -c BOOT MODEL_SRC STEP_SRC args...`, so no file is
written; run by hand it imports torch_model.py from its own folder.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--mode", choices=["train", "forward", "decode"], default="train")
    ap.add_argument("--new-tokens", type=int, default=0,
                    help="decode: transformers' generate of this many greedy tokens after the batch (KV cache)")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", choices=["f32", "bf16", "autocast"], default="f32",
                    help="autocast (train): f32 weights and AdamW, the forward under torch.autocast('cpu', bfloat16)")
    a = ap.parse_args()
    try:
        import torch
        if "torch_model" not in sys.modules:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import torch_model
        torch.set_num_threads(a.threads)
        torch.manual_seed(0)
        model, kind = torch_model.load(a.model)
        if a.dtype == "bf16":
            model = model.to(torch.bfloat16)
            kind = kind.replace("float32", "bf16")
        V = model.config.vocab_size if hasattr(model, "config") else model.cfg["vocab_size"]
        n = a.batch * a.tokens
        ids = ((torch.arange(n, dtype=torch.int64) * 2654435761 + 1) % V).view(a.batch, a.tokens)
        opt = torch.optim.AdamW(model.parameters()) if a.mode == "train" else None

        import contextlib
        fwd_ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.dtype == "autocast" \
            else contextlib.nullcontext
        if a.dtype == "autocast":
            kind = kind.replace("float32", "float32, autocast bf16")

        def step():
            if opt is not None:
                opt.zero_grad(set_to_none=False)
                with fwd_ctx():
                    lg = torch_model.logits(model, ids)
                loss = torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]).float(),
                                                         ids[:, 1:].reshape(-1))
                loss.backward()
                opt.step()
            else:
                with torch.no_grad():
                    lg = torch_model.logits(model, ids)
                    loss = torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]).float(),
                                                             ids[:, 1:].reshape(-1))
            return float(loss)

        model.train(a.mode == "train")
        if a.mode == "decode":
            decode(model, ids, a, kind)
            return
        first = step()
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            last = step()
            times.append(time.perf_counter() - t0)
        lo, med, hi = torch_model.spread(times)
        print(json.dumps({"median_s": med, "min_s": lo, "max_s": hi, "tokens_per_s": n / med, "reps": a.reps,
                          "mode": a.mode, "dtype": a.dtype,
                          "model": kind, "torch": torch.__version__, "threads": torch.get_num_threads(),
                          "loss_first": first, "loss_last": last}))
    except Exception as e:  # the bench prints why, and goes on without the comparison
        msg = (type(e).__name__ + ": " + str(e)).replace("\n", " ")[:300]
        print(json.dumps({"error": msg}))


def decode(model, ids, a, kind):
    """transformers' generate, greedy, exactly N new tokens (no eos stop), its KV cache: one decode step's time
    is (t(N) - t(1)) / (N - 1), t(k) the median of generate with k new tokens (the prefill and first token in
    both); min_s and max_s put the least and the greatest t(N) in place of its median."""
    import torch
    import torch_model
    if not hasattr(model, "generate"):
        raise RuntimeError("decode needs a transformers model (this family runs on the plain-torch fallback)")
    N = max(a.new_tokens, 2)

    def gen(k):
        with torch.no_grad():
            model.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False,
                           attention_mask=torch.ones_like(ids), pad_token_id=0)

    def timed(k):
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            gen(k)
            ts.append(time.perf_counter() - t0)
        return torch_model.spread(ts)

    gen(2)  # warm-up
    lo, med, hi = timed(N)
    one = timed(1)[1]
    step = (med - one) / (N - 1)
    print(json.dumps({"median_s": step, "min_s": (lo - one) / (N - 1), "max_s": (hi - one) / (N - 1),
                      "tokens_per_s": a.batch / step, "reps": a.reps, "mode": "decode",
                      "dtype": a.dtype, "model": kind, "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()

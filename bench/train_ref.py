#!/usr/bin/env python3
"""train_ref.py — the PyTorch reference of `hyperpar train --data` (docs/train.md, "The PyTorch reference").

    python3 bench/train_ref.py MODEL --data FILE --seq S --global-batch GB [--micro-batch MB]
        [--data-dtype uint16|uint32] [--shuffle seeded|none] [--seed N] [--steps N] [--lr X] [--warmup W]
        [--schedule cosine|linear|constant] [--min-lr X] [--clip NORM] [--beta1 X] [--beta2 X] [--eps X]
        [--weight-decay X] [--threads N] [--log-json FILE] [--compute exact|bf16|autocast] [--grad-stats F]

Trains MODEL (a checkpoint folder) in float32 on the batches `hyperpar train` reads, with the same flags and
defaults, and prints one JSON object per step (`step`, `loss`, `grad_norm` before clipping, `lr`), as
`hyperpar train --log-json` writes them; --log-json FILE writes them to FILE instead.

What it reproduces, each rule as docs/train.md states it:
  - windows of a uint16/uint32 stream (S + 1 ids, consecutive windows sharing one token) or the rows of a
    safetensors input_ids [N, S]; the order: epoch e of `--shuffle seeded` is the Fisher-Yates shuffle driven
    by splitmix64 from seed XOR e; global batch k = positions [k*GB, (k+1)*GB) of the endless order;
  - the loss: the mean next-token cross-entropy over every scored position of the global batch, each
    micro-batch's backward taking its share (sum over its positions / the batch's scored positions);
  - the schedule (hp_lr_at, in double), torch.nn.utils.clip_grad_norm_, torch.optim.AdamW on every parameter
    (each gets a gradient, zeros where the batch did not reach it, as hyperpar steps every slice).

The model: transformers' AutoModelForCausalLM (float32, attn_implementation "eager") when transformers can
build the family; otherwise a plain-torch model for the dense llama, mistral, qwen2 and qwen3 families
(bench/torch_model.py). A bf16 checkpoint is widened to float32 on load; hyperpar trains it on f32 masters but
runs its forward on their bf16 rounding, so compare an f32 copy of it (bench/train_compare.sh makes one).
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model  # noqa: E402

M64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def permutation(seed, epoch, n):
    state = (seed ^ epoch) & M64
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class Data:
    """The windows of a token file, as src/data/data.c cuts them."""

    def __init__(self, path, dtype, seq):
        self.seq = seq
        if path.endswith(".safetensors"):
            t = torch_model.read_safetensors(path, ["input_ids"])["input_ids"].to(torch.int64)
            if t.dim() != 2 or t.shape[1] != seq:
                sys.exit(f"{path}: input_ids is {list(t.shape)}; its rows must be --seq {seq} ids long")
            self.rows = t
            self.windows = t.shape[0]
        else:
            es = 2 if dtype == "uint16" else 4
            raw = open(path, "rb").read()
            if len(raw) % es:
                sys.exit(f"{path}: {len(raw)} bytes is not a whole number of {dtype} tokens")
            n = len(raw) // es
            toks = struct.unpack("<%d%s" % (n, "H" if es == 2 else "I"), raw)
            self.tokens = torch.tensor(toks, dtype=torch.int64)
            self.rows = None
            self.windows = (n - 1) // seq
            if self.windows < 1:
                sys.exit(f"{path} holds {n} tokens, fewer than one window of --seq {seq}")
        self._perm_epoch = None

    def window(self, w):
        if self.rows is not None:
            return self.rows[w]
        return self.tokens[w * self.seq: w * self.seq + self.seq + 1]

    def at(self, q, shuffle, seed):
        e, i = divmod(q, self.windows)
        if shuffle == "none":
            return i
        if self._perm_epoch != (seed, e):
            self._perm = permutation(seed, e, self.windows)
            self._perm_epoch = (seed, e)
        return self._perm[i]

    def batch(self, k, gb, shuffle, seed):
        """Global batch k (step k + 1): [GB, row] int64."""
        return torch.stack([self.window(self.at(k * gb + r, shuffle, seed)) for r in range(gb)])


# ---- --compute bf16: hyperpar's BF16 mode (docs/train.md, "Mixed precision") ----
# Every matrix product (F.linear, torch.matmul, @) multiplies its two operands rounded to bf16 (to nearest even)
# with f32 sums and an f32 result, in the forward and in the backward (dX = R(dY)·R(W), dW = R(dY)ᵀ·R(X)); the
# gradient of the rounding itself is the identity. Routers (modules whose class name holds "Router") multiply in
# f32, as hyperpar's routers do (f64 there).
_orig_linear, _orig_matmul, _orig_tmatmul = torch.nn.functional.linear, torch.matmul, torch.Tensor.__matmul__
_round_on = [True]


def _r(x):
    return x.to(torch.bfloat16).to(torch.float32) if x.dtype == torch.float32 else x


def _to_shape(g, shape):
    """g summed over the broadcast dims so that it has shape."""
    while g.dim() > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdim=True)
    return g


class _BLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_b = b is not None
        y = _orig_linear(_r(x), _r(w))
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gr = _r(g)
        gx = _orig_matmul(gr, _r(w))
        gw = _orig_matmul(gr.reshape(-1, gr.shape[-1]).t(), _r(x).reshape(-1, x.shape[-1]))
        gb = g.reshape(-1, g.shape[-1]).sum(0) if ctx.has_b else None
        return gx, gw, gb


class _BMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _orig_matmul(_r(a), _r(b))

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        gr = _r(g)
        ga = _orig_matmul(gr, _r(b).transpose(-1, -2))
        gb = _orig_matmul(_r(a).transpose(-1, -2), gr)
        return _to_shape(ga, a.shape), _to_shape(gb, b.shape)


def _linear(x, w, b=None):
    return _BLinear.apply(x, w, b) if _round_on[0] else _orig_linear(x, w, b)


def _matmul(a, b, **kw):
    return _BMatmul.apply(a, b) if _round_on[0] and not kw and a.dim() >= 2 and b.dim() >= 2 \
        else _orig_matmul(a, b, **kw)


def bf16_products(model):
    """Routes the model's products through the rounding above, routers excepted."""
    torch.nn.functional.linear = _linear
    torch.matmul = _matmul
    torch.Tensor.__matmul__ = lambda a, b: _matmul(a, b)
    for m in model.modules():
        if hasattr(getattr(m, "config", None), "_experts_implementation"):
            m.config._experts_implementation = "eager"  # the loop over experts through F.linear / @, not grouped_mm
        if "router" in type(m).__name__.lower():
            m.register_forward_pre_hook(lambda *_: _round_on.__setitem__(0, False))
            m.register_forward_hook(lambda *_: _round_on.__setitem__(0, True))


def signs(n):
    """u_i = +1 or -1 by the top bit of i * 2654435761 mod 2^32: the probe of grad_stats (tests/cli/grad_stats.py)."""
    i = torch.arange(n, dtype=torch.int64)
    return torch.where(((i * 2654435761) % (1 << 32)) >> 31 == 1, 1.0, -1.0).to(torch.float64)


def grad_stats(model):
    """{name: [‖g‖, Σ g_i·u_i]} of every parameter's gradient (in f64), the checkpoint's names."""
    out = {}
    for n, p in model.named_parameters():
        g = p.grad.detach().reshape(-1).to(torch.float64)
        out[n] = [float(g.norm()), float((g * signs(g.numel())).sum())]
    return out


def lr_at(a, t):
    """hp_lr_at (src/data/schedule.c), in double."""
    if a.warmup > 0 and t <= a.warmup:
        return a.lr * t / a.warmup
    if a.schedule == "constant" or a.steps <= a.warmup:
        return a.lr
    u = (t - a.warmup) / (a.steps - a.warmup)
    if a.schedule == "linear":
        return a.lr - (a.lr - a.min_lr) * u
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1.0 + math.cos(math.pi * u))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--data", required=True)
    ap.add_argument("--data-dtype", default="uint16", choices=["uint16", "uint32"])
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, default=0)
    ap.add_argument("--shuffle", default="seeded", choices=["seeded", "none"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1)
    # torch.optim.AdamW's defaults, which hyperpar train takes too (hp_train_opts_default)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=1e-2)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--schedule", default="cosine", choices=["cosine", "linear", "constant"])
    ap.add_argument("--min-lr", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--log-json", default=None)
    ap.add_argument("--plain", action="store_true", help="use the plain-torch model even if transformers works")
    ap.add_argument("--grad-stats", default=None,
                    help="write step 1's loss and every parameter's [norm, signed sum] (grad_stats) to this JSON")
    ap.add_argument("--compute", default="exact", choices=["exact", "bf16", "autocast"],
                    help="exact: float32; bf16: hyperpar's --compute bf16 (every product's operands rounded to "
                         "bf16); autocast: the forward under torch.autocast('cpu', torch.bfloat16)")
    a = ap.parse_args()
    mb = a.micro_batch or a.global_batch
    if a.global_batch % mb:
        sys.exit(f"--micro-batch {mb} does not divide --global-batch {a.global_batch}")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    model, kind = torch_model.load(a.model, plain=a.plain)
    model.train()
    if a.compute == "bf16":
        bf16_products(model)
    import contextlib
    fwd_ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.compute == "autocast" \
        else contextlib.nullcontext
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=a.weight_decay)
    data = Data(a.data, a.data_dtype, a.seq)
    out = open(a.log_json, "w") if a.log_json else sys.stdout
    print(f"train_ref: {a.model}: {kind}, {sum(p.numel() for p in params)} parameters, {data.windows} windows",
          file=sys.stderr)
    for t in range(1, a.steps + 1):
        ids = data.batch(t - 1, a.global_batch, a.shuffle, a.seed)
        n_scored = ids.shape[0] * (ids.shape[1] - 1)
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for j in range(0, a.global_batch, mb):
            x = ids[j:j + mb]
            with fwd_ctx():
                logits = torch_model.logits(model, x)
            s = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                  x[:, 1:].reshape(-1), reduction="sum")
            (s / n_scored).backward()
            loss_sum += s.item()
        for p in params:  # a parameter the batch did not reach (an expert no token chose) still steps
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if a.grad_stats and t == 1:
            json.dump({"loss": loss_sum / n_scored, "compute": a.compute, "grads": grad_stats(model)},
                      open(a.grad_stats, "w"), indent=1)
        if a.clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, a.clip))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))
        lr = lr_at(a, t)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        print(json.dumps({"step": t, "loss": loss_sum / n_scored, "grad_norm": norm, "lr": lr}), file=out, flush=True)
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()

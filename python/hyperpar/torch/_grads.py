"""Gradients after backward: in their parameter's layout, and averaged over the mesh's dp dim.

One hook per trainable parameter (Tensor.register_hook: it runs once per backward on the gradient about to be
accumulated into .grad, so gradient accumulation over micro-batches stays exact):

1. tp layout. DTensor gives a replicated parameter that saw other rows on each rank (a norm's weight under
   sequence parallelism) a Partial gradient, and the vocab-parallel embedding a Replicate one; left so, torch sums a
   Partial gradient again in every optimizer op that reads it (AdamW: 3 all-reduces per such parameter). The hook
   redistributes the gradient to the parameter's own placements: Partial -> Replicate is one all-reduce, done once in
   backward (what hyperpar's own training does: "every parameter's gradient summed over the ranks that saw other
   rows of it"); Replicate -> Shard a local slice.
2. dp. Each dp replica runs the whole (tp-sharded) model on its own rows; the hook sums the gradient over the dp
   group and divides by the dp size, so every replica holds the gradient of the mean of the replicas' losses: with
   each replica's loss a mean over the same number of positions, that is the gradient of the whole batch's mean
   loss. A DTensor gradient is averaged on its local tensor (the dp replicas of one tp rank hold the same slice).
   One all-reduce per parameter and backward, no bucketing: exact and simple, not fast.
"""
import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.distributed.tensor import DTensor


def _fix(param, group, size, grad):
    if isinstance(grad, DTensor) and isinstance(param, DTensor) and tuple(grad.placements) != tuple(param.placements):
        grad = grad.redistribute(param.device_mesh, param.placements)
    if group is None:
        return grad
    if isinstance(grad, DTensor):
        local = grad.to_local().clone()
        dist.all_reduce(local, group=group)
        local.div_(size)
        return DTensor.from_local(local, grad.device_mesh, grad.placements, run_check=False,
                                  shape=grad.shape, stride=grad.stride())
    out = grad.clone()
    dist.all_reduce(out, group=group)
    return out.div_(size)


def add_grad_hooks(model, dp_group=None, dp=1, skip=()):
    """Registers the hook on every trainable parameter (a tied parameter once; those whose id is in `skip` are
    left to add_expert_grad_hooks): gradients in the parameter's tp layout, and averaged over dp_group when given.
    Returns the hook handles."""
    handles = []
    seen = set(skip)
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if not isinstance(p, DTensor) and dp_group is None:
            continue
        handles.append(p.register_hook(lambda g, _p=p: _fix(_p, dp_group, dp, g)))
    return handles


# ---- expert-parallel blocks (hyperpar.torch.ep) ----------------------------------------------------------------

def _block_fix(group_rows, group_batch, batch, grad):
    """A replicated tensor of an expert-parallel block (router, shared gate; a plain tensor computed on the
    block's local rows): summed over the ranks that split the rows (tp under sequence parallelism), then averaged
    over the batch split (dp, or dp x ep on the explicit ep axis)."""
    if group_rows is None and group_batch is None:
        return grad
    out = grad.clone()
    if group_rows is not None:
        dist.all_reduce(out, group=group_rows)
    if group_batch is not None:
        dist.all_reduce(out, group=group_batch)
        out.div_(batch)
    return out


class _ExpertGrads:
    """The expert slices' gradients averaged over the ranks holding the same experts (ExpertParallelInfo
    .grad_group; ep.py has already scaled them in the backward), once per backward, at its end, every parameter in
    the same order on every rank (whatever order each rank's routing made the gradients ready in): a hook takes
    each backward's contribution (leaving zeros to be accumulated) and a callback queued on the autograd engine
    adds the averages."""

    def __init__(self, params):
        self.params = params  # [(param, group, size)] in model order
        self.pending = {}
        self.queued = False

    def hook(self, p):
        def h(g):
            self.pending[id(p)] = g
            if not self.queued:
                self.queued = True
                Variable._execution_engine.queue_callback(self.finish)
            return torch.zeros_like(g)
        return h

    def finish(self):
        self.queued = False
        pending, self.pending = self.pending, {}
        for p, group, n in self.params:
            g = pending.get(id(p))
            g = torch.zeros_like(p) if g is None else g.clone()
            dist.all_reduce(g, group=group)
            g.div_(n)
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)


def add_expert_grad_hooks(model, blocks, batch_group, batch):
    """The gradient rules of the expert-parallel blocks, blocks = [(module path, the process group of the ranks
    that split its rows, or None)]: expert slices (p._hp_ep) averaged over their grad_group; every other plain
    tensor of a block (replicated) through _block_fix. Returns (hook handles, ids of the parameters handled
    here)."""
    handles, ids, experts = [], set(), []
    rows_of = {r + ".": g for r, g in blocks}
    for name, p in model.named_parameters():
        prefix = next((r for r in rows_of if name.startswith(r)), None)
        if prefix is None or id(p) in ids:
            continue
        rows_group = rows_of[prefix]
        info = getattr(p, "_hp_ep", None)
        if info is not None:
            ids.add(id(p))
            if p.requires_grad and info.grad_group is not None:
                experts.append((p, info.grad_group, len(info.grad_ranks)))
            continue
        if isinstance(p, DTensor):
            continue  # a shared expert's tp-sharded Linears: the dense rule
        ids.add(id(p))
        if p.requires_grad:
            handles.append(p.register_hook(lambda g, _r=rows_group: _block_fix(_r, batch_group, batch, g)))
    if experts:
        eg = _ExpertGrads(experts)
        for p, _, _ in experts:
            handles.append(p.register_hook(eg.hook(p)))
    return handles, ids

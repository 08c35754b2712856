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
import torch.distributed as dist
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


def add_grad_hooks(model, dp_group=None, dp=1):
    """Registers the hook on every trainable parameter (a tied parameter once): gradients in the parameter's tp
    layout, and averaged over dp_group when given. Returns the hook handles."""
    handles = []
    seen = set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if not isinstance(p, DTensor) and dp_group is None:
            continue
        handles.append(p.register_hook(lambda g, _p=p: _fix(_p, dp_group, dp, g)))
    return handles

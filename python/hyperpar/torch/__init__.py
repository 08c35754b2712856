"""hyperpar.torch: a hyperpar plan applied to a transformers model under torch.distributed (DTensor).

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    import hyperpar, hyperpar.torch

    dist.init_process_group("gloo")                                   # or nccl; torchrun sets the rest
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    plan = hyperpar.plan(model, mesh=mesh)                             # or Plan.from_json(`hyperpar plan ...`)
    hyperpar.torch.parallelize(model, mesh, plan)                      # in place; returns model
    logits = model(input_ids_of_this_dp_rank).logits                   # whole logits (or a DTensor, loss-parallel)

What it does, per boundary of the plan (docs/python.md, "hyperpar.torch"): parameters become DTensors on the tp
sub-mesh as the plan places them (S(0) on a Linear weight: colwise; S(1): rowwise; R: replicated; an embedding's
S(0): vocab-parallel); each boundary's inputs go from in_src to in_dst and its output from out_src to out_dst
(all-gather, all-reduce, reduce-scatter or a local slice); deferred biases are added after the exit reduction; the
tp-local head counts (tp_local_attrs) are set where the module keeps them; the residual stream between boundaries
is a DTensor in the plan's layout (sequence-sharded with sequence parallelism). dp: gradients averaged over the dp
dim, and every gradient in its parameter's layout after backward (_grads.py); each dp rank feeds its own rows.
MoE models run with expert parallelism (a plan with ep_mode tp-extend-ep or ep-axis): each moe_mlp block goes to
ep.apply_expert_parallel (its experts cut to the rank's and fed over all-to-all), takes its input as the rank's
local rows and gives its output back in the plan's layout; its nested shared expert is tp-sharded on those rows,
its router stays replicated; expert slices are averaged over the ranks holding them, the routers' gradients summed
over the rows' split and averaged over the batch split (dp, or dp x ep on the explicit ep axis, where each rank
feeds its own rows). docs/python.md, "MoE: expert parallelism".
Context parallelism is refused, and so is anything torch cannot express, before the model is changed.
"""
from .._native import Error
from . import _compile

__all__ = ["parallelize", "plan_styles", "loss_parallel", "param_groups", "Error"]


def param_groups(model, **options):
    """The model's trainable parameters as optimizer parameter groups, the DTensors apart from the plain tensors:
    [{"params": [DTensor parameters], **options}, {"params": [plain parameters], **options}] (an empty group left
    out). After parallelize with expert parallelism and tp > 1 a model holds both (its expert slices and the MoE
    blocks' routers stay plain tensors), and torch's foreach and fused optimizer kernels (the default on CUDA)
    refuse a list that mixes them; they run per group:

        torch.optim.AdamW(hyperpar.torch.param_groups(model), lr=1e-4)
    """
    from torch.distributed.tensor import DTensor
    dt, plain, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (dt if isinstance(p, DTensor) else plain).append(p)
    return [dict(options, params=g) for g in (dt, plain) if g]


def loss_parallel():
    """torch.distributed.tensor.parallel.loss_parallel: the context to compute cross-entropy on vocab-sharded
    logits (a plan with loss_parallel) and to run its backward in."""
    from torch.distributed.tensor.parallel import loss_parallel as lp
    return lp()


def _plan_for(model, device_mesh, plan, options):
    if plan is not None:
        if options:
            raise TypeError("hyperpar.torch.parallelize: plan options (%s) are for deriving a plan; this call was "
                            "given a plan" % ", ".join(sorted(options)))
        if isinstance(plan, (str, bytes)):
            from .. import Plan
            return Plan.from_json(plan.decode() if isinstance(plan, bytes) else plan)
        if isinstance(plan, dict):
            from .. import Plan
            return Plan.from_json(plan)
        return plan
    from .. import plan as derive
    names = tuple(getattr(device_mesh, "mesh_dim_names", None) or ())
    if "ep" in names and "ep_axis" not in options:
        options = dict(options, ep_axis=True)  # a device mesh with an ep dim: the explicit ep axis
    return derive(model, mesh=device_mesh, **options)


def plan_styles(plan, device_mesh, model=None):
    """{module FQN: ParallelStyle} of the plan, for torch.distributed.tensor.parallel.parallelize_module(model,
    tp_mesh, styles) with tp_mesh = device_mesh["tp"] (the mesh itself when it is 1-D). They are the styles
    parallelize applies, in plan order (keep it: a tied head is an entry on the root module "" that must follow the
    embedding's). With `model` the plan is checked against it first, as parallelize does; without, the styles come
    from the plan alone and each checks its module when applied. Not in the styles: the tp-local attributes
    (tp_local_attrs), dp gradient averaging and expert parallelism, which parallelize adds; a plan with
    expert-parallel blocks is refused here. An empty dict when the mesh has no tp."""
    plan = _plan_for(model, device_mesh, plan, {})
    prog = _compile.compile(model, plan, device_mesh)
    if prog.ep:
        raise Error("hyperpar.torch: boundary '%s': expert-parallel blocks are applied by hyperpar.torch.parallelize "
                    "(ep.apply_expert_parallel), not by a ParallelStyle" % prog.ep[0]["fqn"])
    return dict(prog.styles) if prog.tp_mesh is not None else {}


def parallelize(model, device_mesh, plan=None, *, src_data_rank=0, **plan_options):
    """Applies a hyperpar plan to `model` (a transformers causal LM) under torch.distributed, in place, and returns it.

    device_mesh: a DeviceMesh whose dim names are the plan's mesh axes (dp, tp, ep for the explicit ep axis; a plan
    dim of size 1 may be left out), the same sizes in the same order. plan: a hyperpar.Plan (or its JSON text or
    dict); None derives one with hyperpar.plan(model, mesh=device_mesh, **plan_options) (ep=2,
    sequence_parallel=False, loss_parallel=True, ...; a mesh with an ep dim adds ep_axis=True).
    src_data_rank: as torch's parallelize_module: 0 scatters tp rank 0's weights (default), None keeps each rank's own
    (every rank must then hold the same weights).

    Everything is checked before anything changes: a plan torch cannot express (an unknown placement or boundary
    type, a placement with no torch style, a parameter the model does not have or that no boundary declares, a mesh
    that is not the plan's, cp > 1) raises hyperpar.Error naming the boundary and leaves the model as it was.

    After it: call the model as before, each dp rank with its own rows (the tp ranks of one dp rank with the same
    rows). Without loss-parallel the logits come back whole (a plain tensor); with it they are a DTensor sharded on
    the vocabulary: compute the loss and run its backward inside hyperpar.torch.loss_parallel():

        with hyperpar.torch.loss_parallel():
            logits = model(ids).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
            loss.backward()

    Parameters are DTensors afterwards (p.full_tensor() gathers one); torch.optim.AdamW steps them as they are.
    With expert parallelism and tp > 1 the expert slices and routers stay plain tensors: build a foreach or fused
    optimizer over param_groups(model).
    """
    plan = _plan_for(model, device_mesh, plan, plan_options)
    prog = _compile.compile(model, plan, device_mesh)
    infos = []
    if prog.ep:
        from .ep import apply_expert_parallel
        for i, b in enumerate(prog.ep):
            try:
                infos.append(apply_expert_parallel(model, b, plan, device_mesh))
            except NotImplementedError as e:
                if i == 0:
                    raise Error("hyperpar.torch: boundary '%s': expert parallelism is not implemented by "
                                "hyperpar.torch.ep here (%s); the model is unchanged" % (b["fqn"], e))
                raise Error("hyperpar.torch: boundary '%s': expert parallelism is not implemented by hyperpar.torch.ep "
                            "here (%s), after %d block(s) were already made expert-parallel: discard this model"
                            % (b["fqn"], e, i))
    if prog.tp_mesh is not None and prog.styles:
        from torch.distributed.tensor.parallel import parallelize_module
        for fqn, style in prog.styles:
            parallelize_module(model, prog.tp_mesh, {fqn: style} if fqn else style, src_data_rank=src_data_rank)
    for fqn, attr, _, local in prog.attrs:
        setattr(model.get_submodule(fqn), attr, local)
    from ._grads import add_expert_grad_hooks, add_grad_hooks
    data = getattr(plan, "data", plan)
    batch_group, batch = prog.dp_group, prog.dp
    if data.get("mesh", {}).get("ep_mode") == "ep-axis":
        # the explicit ep axis: outside the experts ep is data parallelism, the batch splits over dp x ep
        batch_group, batch = _axes_group(device_mesh, ("dp", "ep"))
    skip = set()
    blocks = []
    for info in infos:
        if getattr(info, "module_fqn", None) is None:
            continue  # a stand-in ep module (tests) that returns nothing
        rows = None
        if info.rows_split_over:  # the block's rows split over tp (sequence parallelism): partial gradients
            rows, _ = _axes_group(device_mesh, tuple(info.rows_split_over))
        blocks.append((info.module_fqn, rows))
    if blocks:
        _, skip = add_expert_grad_hooks(model, blocks, batch_group, batch)
    add_grad_hooks(model, batch_group, batch, skip)
    return model


_GROUPS = {}  # sorted ranks -> ProcessGroup, made once (every rank makes every group, in one order)


def _axes_group(device_mesh, axes):
    """(process group, size) of the ranks that differ only in the mesh dims `axes` (those of size 1 or absent
    left out) and hold this rank's other coordinates; (None, 1) when that is this rank alone. Collective the
    first time: every rank makes every such group, in the same order."""
    import torch.distributed as dist
    names = list(device_mesh.mesh_dim_names)
    present = [i for i, n in enumerate(names) if n in axes and device_mesh.size(i) > 1]
    if not present:
        return None, 1
    if len(present) == 1:
        return device_mesh.get_group(names[present[0]]), device_mesh.size(present[0])
    ranks = device_mesh.mesh
    rest = [i for i in range(ranks.ndim) if i not in present]
    k = 1
    for i in present:
        k *= device_mesh.size(i)
    rows = ranks.permute(rest + present).reshape(-1, k)
    me = dist.get_rank()
    mine = None
    for row in rows.tolist():
        key = tuple(sorted(row))
        if key not in _GROUPS:
            _GROUPS[key] = dist.new_group(list(key))
        if me in row:
            mine = _GROUPS[key], len(row)
    return mine

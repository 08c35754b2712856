"""Expert parallelism for a transformers MoE block, as a hyperpar plan lays it out (docs/python.md, "MoE: expert
parallelism").

    from hyperpar.torch.ep import check_expert_parallel, apply_expert_parallel
    check_expert_parallel(model, boundary, plan, device_mesh)   # raises hyperpar.Error, changes nothing
    apply_expert_parallel(model, boundary, plan, device_mesh)   # collective: every rank, same order

`boundary` is one `moe_mlp` boundary of the plan JSON (a dict). The block keeps its own router (gate/router, the
family's code, run on the rank's own rows); only its `experts` module changes: its batched expert tensors are cut
to the rank's experts (hyperpar's rule, `hp_ep_local_experts`: EP index i of P holds `[E*i/P, E*(i+1)/P)`), and
its forward becomes dispatch -> local experts -> combine over the rank's EP group with all-to-all (autograd
through both exchanges). The EP group is hyperpar's (`hp_mesh_ep_index`): under "tp-extend-ep" blocks of P
consecutive ranks of the plan mesh (dp, cp, tp order, tp fastest); under "ep-axis" the ranks that differ only in
the ep coordinate.
"""
import itertools

import torch
import torch.distributed as dist

from .._native import Error

__all__ = ["check_expert_parallel", "apply_expert_parallel", "ExpertParallelInfo"]

# transformers renames a checkpoint's MoE block (WeightRenaming(".block_sparse_moe.", ".mlp.")): a plan made from a
# Mixtral checkpoint names model.layers.N.block_sparse_moe, the live model model.layers.N.mlp.
_FQN_ALIASES = ((".block_sparse_moe", ".mlp"),)

_GROUPS = {}  # sorted rank tuple -> ProcessGroup (every rank creates every group, in the same order)


class ExpertParallelInfo:
    """What apply_expert_parallel did to one block; kept as `experts._hp_ep` and `block._hp_ep`.

    ep_mode, ep_size (P), ep_index (this rank's slot), n_experts (E, global), first_expert, n_local, group_ranks
    (torch ranks of the EP group, EP index order), grad_ranks (ranks holding the same experts) and grad_group (their
    process group, None for one rank): the expert gradients are averaged over it; grad_scale (applied to the expert
    gradients in the backward, see docs/python.md, "MoE: expert parallelism"), replica_ranks (ranks holding the same
    rows that the experts' rows are split over: tp without sequence parallelism; () otherwise), rows_split_over
    (mesh axes whose ranks route different rows of one data-parallel block: their replicated block parameters'
    gradients are partial sums over them), last_rows ((rows sent, rows received) by the last forward).
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.last_rows = (0, 0)
        self.group = None
        self.grad_group = None
        self.replica_group = None

    def __deepcopy__(self, memo):  # process groups are shared, never copied
        return self

    def __repr__(self):
        return ("ExpertParallelInfo(%s, %s, ep %d/%d, experts [%d, %d) of %d, group %s)"
                % (self.boundary, self.ep_mode, self.ep_index, self.ep_size, self.first_expert,
                   self.first_expert + self.n_local, self.n_experts, list(self.group_ranks)))


def _err(boundary_fqn, msg):
    return Error("hyperpar: expert parallelism of %s: %s" % (boundary_fqn or "<root>", msg))


def _find_module(model, fqn):
    cands = [fqn]
    for a, b in _FQN_ALIASES:
        if a in fqn:
            cands.append(fqn.replace(a, b))
    for c in cands:
        try:
            return c, model.get_submodule(c)
        except AttributeError:
            continue
    return None, None


def _placement_map(pm, what, fqn):
    if pm is None:
        return {}
    if not isinstance(pm, dict):
        raise _err(fqn, "%s: a placement map is an object {axis: placement}, got %r" % (what, pm))
    return pm


def _is_shard(p):
    return isinstance(p, str) and p.startswith("S(")


def _plan_data(plan):
    return plan.data if hasattr(plan, "data") else plan


def _mesh_layout(pdata, device_mesh, fqn):
    """[(name, size)] of the plan mesh and, for every plan coordinate tuple in row-major order (hyperpar's rank
    order), the torch global rank the device mesh puts there."""
    mesh = pdata.get("mesh") or {}
    dims = [(d["name"], int(d["size"])) for d in mesh.get("dims", [])]
    if not dims:
        raise _err(fqn, "the plan has no mesh dims")
    world = 1
    for _, s in dims:
        world *= s
    if device_mesh is None:
        raise _err(fqn, "a torch DeviceMesh with dim names is needed (got None)")
    names = tuple(device_mesh.mesh_dim_names or ())
    if not names:
        raise _err(fqn, "the device mesh has no dim names; build it with mesh_dim_names=(...) matching the plan "
                   "(%s)" % ", ".join("%s=%d" % d for d in dims))
    dm_sizes = dict(zip(names, device_mesh.mesh.shape))
    plan_sizes = dict(dims)
    for n, s in dims:
        if s > 1 and dm_sizes.get(n) != s:
            raise _err(fqn, "the plan's mesh axis %s=%d is not a dim of the device mesh of that size (device mesh: "
                       "%s)" % (n, s, ", ".join("%s=%d" % (k, v) for k, v in dm_sizes.items())))
    for n, s in dm_sizes.items():
        if s > 1 and plan_sizes.get(n) != s:
            raise _err(fqn, "the device mesh's dim %s=%d is not in the plan's mesh (%s)"
                       % (n, s, ", ".join("%s=%d" % d for d in dims)))
    if device_mesh.mesh.numel() != world:
        raise _err(fqn, "the device mesh has %d ranks, the plan's mesh %d" % (device_mesh.mesh.numel(), world))
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() != world:
        raise _err(fqn, "the plan's mesh has %d ranks, torch.distributed's world %d" % (world, dist.get_world_size()))
    pos = {n: i for i, (n, _) in enumerate(dims)}
    coords, ranks = [], []
    for c in itertools.product(*[range(s) for _, s in dims]):
        idx = tuple(c[pos[n]] if n in pos else 0 for n in names)
        coords.append(c)
        ranks.append(int(device_mesh.mesh[idx]))
    return dims, coords, ranks


def _resolve(model, boundary, plan, device_mesh):
    """Everything apply needs, computed without side effects; raises hyperpar.Error naming the boundary."""
    if not isinstance(boundary, dict):
        raise Error("hyperpar: expert parallelism: a boundary is the plan JSON's boundary object (a dict), got %s"
                    % type(boundary).__name__)
    fqn = boundary.get("fqn")
    if not isinstance(fqn, str):
        raise Error("hyperpar: expert parallelism: the boundary has no fqn")
    if boundary.get("type") != "moe_mlp":
        raise _err(fqn, "the boundary's type is %r; only moe_mlp blocks are expert-parallel" % boundary.get("type"))
    pdata = _plan_data(plan)
    mesh = pdata.get("mesh") or {}
    mode = mesh.get("ep_mode")
    if mode not in ("tp-extend-ep", "ep-axis"):
        raise _err(fqn, "the plan's ep_mode is %r: no expert parallelism to apply (tp-extend-ep or ep-axis)" % mode)
    P = int(mesh.get("ep") or 0)
    if P < 2:
        raise _err(fqn, "the plan's ep is %r; expert parallelism needs ep >= 2" % mesh.get("ep"))
    if mode == "tp-extend-ep" and int(boundary.get("ep_size") or 0) not in (0, P):
        raise _err(fqn, "the boundary's ep_size %r differs from the plan's ep %d" % (boundary.get("ep_size"), P))
    lcf = boundary.get("local_compute_fn")
    if isinstance(lcf, dict):
        if lcf.get("capacity_factor") is not None:
            raise _err(fqn, "its local_compute_fn sets capacity_factor %r: hyperpar.torch runs the family's own "
                       "router and experts, which drop no token; leave capacity_factor out"
                       % lcf.get("capacity_factor"))
        if lcf.get("fix_router"):
            raise _err(fqn, "its local_compute_fn sets fix_router (the balanced benchmark router): hyperpar.torch "
                       "runs the family's own router")
    if not (dist.is_available() and dist.is_initialized()):
        raise _err(fqn, "torch.distributed is not initialized")

    name, block = _find_module(model, fqn)
    if block is None:
        raise _err(fqn, "the model has no module %s" % fqn)
    experts = getattr(block, "experts", None)
    if experts is None or not isinstance(experts, torch.nn.Module):
        kids = ", ".join(n for n, _ in block.named_children()) or "none"
        raise _err(fqn, "the block (%s) has no experts module (children: %s); hyperpar knows transformers' MoE "
                   "blocks whose `experts` hold batched [E, ...] tensors" % (type(block).__name__, kids))
    if getattr(experts, "_hp_ep", None) is not None:
        raise _err(fqn, "expert parallelism was already applied to this block")
    if isinstance(experts, (torch.nn.ModuleList, torch.nn.ModuleDict)) or not any(
            True for _ in experts.parameters(recurse=False)):
        raise _err(fqn, "its experts (%s) are per-expert modules, not batched [E, ...] tensors; hyperpar applies "
                   "expert parallelism to transformers >= 5's batched experts only" % type(experts).__name__)
    if any(True for m in experts.children() if any(True for _ in m.parameters())):
        raise _err(fqn, "its experts module (%s) has submodules with parameters; hyperpar knows batched experts "
                   "holding their tensors directly" % type(experts).__name__)
    E = getattr(experts, "num_experts", None)
    if not isinstance(E, int) or E < 1:
        raise _err(fqn, "its experts module (%s) has no num_experts" % type(experts).__name__)
    router = None
    for rn in ("gate", "router"):
        r = getattr(block, rn, None)
        w = getattr(r, "weight", None) if r is not None else None
        if isinstance(w, torch.Tensor) and w.dim() == 2 and w.shape[0] == E:
            router = rn
            break
    if router is None:
        raise _err(fqn, "no router with a [%d, H] weight (gate or router) next to its experts; hyperpar knows "
                   "transformers' MoE blocks (block.gate / block.router, block.experts)" % E)
    eparams = dict(experts.named_parameters(recurse=False))
    for pn, p in eparams.items():
        if p.dim() < 1 or p.shape[0] != E:
            raise _err(fqn, "experts.%s has shape %s: not a batched tensor of its %d experts" % (pn, list(p.shape), E))
    if E % P:
        raise _err(fqn, "its %d experts do not split over ep=%d; choose an ep that divides %d" % (E, P, E))

    # The plan's declarations: every expert entry ep S(0) and not cut over tp; everything else replicated.
    params = boundary.get("params") or {}
    stacks = boundary.get("ep_stack") or {}
    seen_expert = False
    for rel, pm in params.items():
        pm = _placement_map(pm, "params[%s]" % rel, fqn)
        if rel.startswith("experts."):
            seen_expert = True
            short = rel[len("experts."):]
            if short not in eparams and rel not in stacks:
                raise _err(fqn, "the plan declares %s, which its experts module (%s) does not hold (it holds %s)"
                           % (rel, type(experts).__name__, ", ".join("experts." + n for n in eparams)))
            if rel in stacks and len(stacks[rel]) != E:
                raise _err(fqn, "the plan stacks %d experts for %s; the model has %d" % (len(stacks[rel]), rel, E))
            if pm.get("ep") != "S(0)":
                raise _err(fqn, "%s is %s on ep; expert parallelism splits the experts (ep S(0))"
                           % (rel, pm.get("ep", "R")))
            for ax in ("tp", "cp"):
                if pm.get(ax, "R") != "R":
                    raise _err(fqn, "%s is %s on %s: experts cut over %s (the explicit ep axis with %s > 1) are not "
                               "supported by hyperpar.torch yet" % (rel, pm[ax], ax, ax, ax))
        else:
            for ax, pl in pm.items():
                if pl != "R":
                    raise _err(fqn, "%s is %s on %s inside the expert-parallel block; hyperpar.torch keeps the "
                               "router and the block's other tensors replicated" % (rel, pl, ax))
    if not seen_expert:
        raise _err(fqn, "the boundary declares no expert tensors (experts.*)")

    # The rows the block sees: which axes split them (own rows) and which hold copies (tp without SP).
    ins = boundary.get("in_dst") or {}
    if len(ins) != 1:
        raise _err(fqn, "the boundary's in_dst has %d inputs; an MoE block takes one (x_BLD)" % len(ins))
    in_pm = _placement_map(next(iter(ins.values())), "in_dst", fqn)
    outs = boundary.get("out_src") or {}
    out_pm = _placement_map(next(iter(outs.values())), "out_src", fqn) if outs else in_pm
    dims, coords, ranks = _mesh_layout(pdata, device_mesh, fqn)
    sizes = dict(dims)
    rows_split, rows_copied = [], []
    for ax in ("cp", "tp"):
        if sizes.get(ax, 1) <= 1:
            continue
        pl = in_pm.get(ax, "R")
        if pl != out_pm.get(ax, "R"):
            raise _err(fqn, "its input is %s on %s and its output %s: hyperpar.torch runs the block on the layout "
                       "it receives (in_dst = out_src)" % (pl, ax, out_pm.get(ax, "R")))
        if pl == "R":
            rows_copied.append(ax)
        elif pl in ("S(0)", "S(1)"):
            rows_split.append(ax)
        else:
            raise _err(fqn, "its input is %s on %s; an MoE block takes rows replicated (R) or split over batch or "
                       "sequence (S(0), S(1))" % (pl, ax))

    me = dist.get_rank()
    if me not in ranks:
        raise _err(fqn, "rank %d is not in the device mesh" % me)
    names = [n for n, _ in dims]
    ep_ax = names.index("ep") if "ep" in names else -1
    if mode == "ep-axis":
        if ep_ax < 0 or sizes["ep"] != P:
            raise _err(fqn, "ep_mode ep-axis needs an ep axis of size %d in the plan's mesh" % P)

        def slot(k):  # (group key, EP index)
            c = coords[k]
            return c[:ep_ax] + c[ep_ax + 1:], c[ep_ax]
    else:
        if ep_ax >= 0:
            raise _err(fqn, "ep_mode tp-extend-ep with an ep axis in the plan's mesh")
        if len(ranks) % P:
            raise _err(fqn, "ep=%d does not divide the %d ranks of the mesh" % (P, len(ranks)))

        def slot(k):  # hp_mesh_ep_index: flat blocks of P consecutive ranks
            return k // P, k % P
    k_me = ranks.index(me)
    g_me, i_me = slot(k_me)
    group = [None] * P
    holders = []
    for k in range(len(ranks)):
        g, i = slot(k)
        if g == g_me:
            group[i] = ranks[k]
        if i == i_me:
            holders.append(ranks[k])
    # Ranks holding the same rows as this one (the copies' axes), ordered by their coordinates.
    rep = []
    if rows_copied:
        cax = [names.index(a) for a in rows_copied]
        for k in range(len(ranks)):
            if all(coords[k][j] == coords[k_me][j] for j in range(len(names)) if j not in cax):
                rep.append(ranks[k])
    D = sizes.get("dp", 1) * (P if mode == "ep-axis" else 1)  # hp_mesh_batch_split
    G = len(ranks) // P
    nl = E // P
    return ExpertParallelInfo(
        boundary=fqn, module_fqn=name, ep_mode=mode, ep_size=P, ep_index=i_me, n_experts=E,
        first_expert=i_me * nl, n_local=nl, group_ranks=tuple(group), grad_ranks=tuple(holders),
        grad_scale=float(G) / float(D), replica_ranks=tuple(rep) if len(rep) > 1 else (),
        replica_index=rep.index(me) if len(rep) > 1 else 0, rows_split_over=tuple(rows_split),
        router=router, expert_params=tuple(eparams))


def check_expert_parallel(model, boundary, plan, device_mesh):
    """Raises hyperpar.Error naming the boundary when apply_expert_parallel cannot express it; changes nothing
    (no process group is made, no tensor touched)."""
    _resolve(model, boundary, plan, device_mesh)


def _group(ranks):
    key = tuple(sorted(ranks))
    if len(key) < 2:
        return None
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(key))
    return _GROUPS[key]


# ---------------------------------------------------------------------------------------------------------------
# autograd-aware exchanges


class _AllToAll(torch.autograd.Function):
    """Rows to the group's ranks by split sizes; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        gi = g.new_empty((sum(ctx.send),) + tuple(g.shape[1:]))
        dist.all_to_all_single(gi, g.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.recv,
                               group=ctx.group)
        return gi, None, None, None


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by s."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s, None


def _bounds(T, n):
    return [(i * T // n, (i + 1) * T // n) for i in range(n)]


def _gather_rows(x, T, info):
    """All-gather of the replicas' row chunks (chunk i from replica i) into [T, ...]."""
    n = len(info.replica_ranks)
    b = _bounds(T, n)
    m = max(hi - lo for lo, hi in b)
    pad = x.new_zeros((m,) + tuple(x.shape[1:]))
    pad[: x.shape[0]] = x
    parts = [torch.empty_like(pad) for _ in range(n)]
    dist.all_gather(parts, pad.contiguous(), group=info.replica_group)
    order = sorted(info.replica_ranks)  # all_gather's order: group rank = rank order
    pieces = [parts[order.index(r)][: b[i][1] - b[i][0]] for i, r in enumerate(info.replica_ranks)]
    return torch.cat(pieces, 0)


class _SliceRows(torch.autograd.Function):
    """Replicated rows -> this replica's chunk; backward all-gathers the chunks' gradients (every replica gets the
    whole gradient, as the replicated input's is)."""

    @staticmethod
    def forward(ctx, x, info):
        ctx.info, ctx.T = info, x.shape[0]
        lo, hi = _bounds(x.shape[0], len(info.replica_ranks))[info.replica_index]
        return x[lo:hi].clone()

    @staticmethod
    def backward(ctx, g):
        return _gather_rows(g, ctx.T, ctx.info), None


class _GatherRows(torch.autograd.Function):
    """The replicas' chunks -> the whole rows on every replica; backward keeps this replica's chunk."""

    @staticmethod
    def forward(ctx, x, T, info):
        ctx.info, ctx.T = info, T
        return _gather_rows(x, T, info)

    @staticmethod
    def backward(ctx, g):
        lo, hi = _bounds(ctx.T, len(ctx.info.replica_ranks))[ctx.info.replica_index]
        return g[lo:hi].contiguous(), None, None


def _dispatch_combine(experts, info, x, idx, w):
    """out[t] = sum_k w[t,k] * expert_{idx[t,k]}(x[t]), the experts spread over the EP group."""
    T, K = idx.shape
    H = x.shape[-1]
    P, nl = info.ep_size, info.n_local
    dev = x.device
    if info._key.device != dev:
        info._key = info._key.to(dev)
    key = info._key
    flat = idx.reshape(-1).long()
    k = key[flat]  # group rank of the owner * nl + local expert
    order = torch.argsort(k, stable=True)
    send_rows = x.index_select(0, order // K)
    cnt = torch.bincount(k, minlength=P * nl)
    rcnt = torch.empty_like(cnt)
    dist.all_to_all_single(rcnt, cnt, group=info.group)
    send = cnt.view(P, nl).sum(1).tolist()
    rc = rcnt.view(P, nl)
    recv = rc.sum(1).tolist()
    rows = _AllToAll.apply(send_rows, send, recv, info.group)
    N = rows.shape[0]
    info.last_rows = (int(send_rows.shape[0]), N)  # (sent, received) by the last forward
    s = info.grad_scale
    if s != 1.0:  # the experts' gradients times s, the rows' unchanged (docs/python.md, "MoE: ...", "Gradients")
        rows = _ScaleGrad.apply(rows, 1.0 / s)
    if N:
        ids = torch.arange(nl, device=dev).repeat(P).repeat_interleave(rc.reshape(-1))
        ones = torch.ones((N, 1), dtype=w.dtype, device=dev)
        y = info._local_forward(experts, rows, ids.view(N, 1), ones)
    else:
        y = rows.new_zeros((0, H))
    if torch.is_grad_enabled() and (rows.requires_grad or any(p.requires_grad for p in experts.parameters(False))):
        # Keep both exchanges and every local expert tensor in the graph on every rank, whatever was routed here:
        # the backward's all-to-all is collective, and a gradient stays a tensor (zeros) rather than None.
        z = rows.sum() * 0
        for p in experts.parameters(recurse=False):
            if p.requires_grad:
                z = z + p.reshape(-1)[:1].sum() * 0
        y = y + z.to(y.dtype)
    if s != 1.0:
        y = _ScaleGrad.apply(y, s)
    back = _AllToAll.apply(y, recv, send, info.group)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=dev)
    slots = back.index_select(0, inv).view(T, K, -1)
    out = (slots * w.unsqueeze(-1)).sum(dim=1)
    return out.to(x.dtype)


def _ep_forward(self, hidden_states, top_k_index=None, top_k_weights=None, **kwargs):
    # gpt-oss names them router_indices / routing_weights
    if top_k_index is None:
        top_k_index = kwargs.pop("router_indices", None)
    if top_k_weights is None:
        top_k_weights = kwargs.pop("routing_weights", None)
    info = self._hp_ep
    if kwargs or top_k_index is None or top_k_weights is None:
        raise TypeError("hyperpar: the expert-parallel experts of %s take (hidden_states, top_k_index, "
                        "top_k_weights)" % info.boundary)
    x, idx, w = hidden_states, top_k_index, top_k_weights
    if info.replica_ranks:
        T = x.shape[0]
        lo, hi = _bounds(T, len(info.replica_ranks))[info.replica_index]
        x = _SliceRows.apply(x, info)
        w = _SliceRows.apply(w, info) if w.requires_grad else w[lo:hi]
        idx = idx[lo:hi]
        return _GatherRows.apply(_dispatch_combine(self, info, x, idx, w), T, info)
    return _dispatch_combine(self, info, x, idx, w)


_EP_CLASSES = {}


def _ep_class(cls):
    if cls not in _EP_CLASSES:
        _EP_CLASSES[cls] = type("ExpertParallel" + cls.__name__, (cls,), {
            "forward": _ep_forward, "__module__": __name__,
            "__doc__": "%s cut to this rank's experts; forward exchanges tokens over the EP group "
                       "(hyperpar.torch.ep)." % cls.__name__})
    return _EP_CLASSES[cls]


def apply_expert_parallel(model, boundary, plan, device_mesh):
    """Cuts the block's experts to this rank's and makes its experts' forward exchange tokens over the EP group.
    Collective (it makes process groups): every rank calls it for the same boundaries in the same order. Returns
    the ExpertParallelInfo (also `block.experts._hp_ep`)."""
    info = _resolve(model, boundary, plan, device_mesh)
    pdata = _plan_data(plan)
    dims, coords, ranks = _mesh_layout(pdata, device_mesh, info.boundary)
    # Every rank makes every group of the mesh in one order (new_group is collective).
    P = info.ep_size
    names = [n for n, _ in dims]
    if info.ep_mode == "ep-axis":
        ep_ax = names.index("ep")
        slot = lambda k: (coords[k][:ep_ax] + coords[k][ep_ax + 1:], coords[k][ep_ax])
    else:
        slot = lambda k: (k // P, k % P)
    groups, holders = {}, {}
    for k in range(len(ranks)):
        g, i = slot(k)
        groups.setdefault(g, []).append(ranks[k])
        holders.setdefault(i, []).append(ranks[k])
    reps = {}
    if info.replica_ranks:
        sizes = dict(dims)
        cax = [names.index(a) for a in ("cp", "tp") if sizes.get(a, 1) > 1 and a not in info.rows_split_over]
        for k in range(len(ranks)):
            reps.setdefault(tuple(c for j, c in enumerate(coords[k]) if j not in cax), []).append(ranks[k])
    for sets in (groups, holders, reps):
        for s in sets.values():
            _group(s)
    info.group = _group(info.group_ranks)
    info.grad_group = _group(info.grad_ranks)
    info.replica_group = _group(info.replica_ranks) if info.replica_ranks else None
    # Sort key of a global expert: the group rank of its owner (torch orders a group's ranks ascending) * n_local
    # + its local index, so the send buffer is in all_to_all_single's order whatever the mesh's rank layout.
    E, nl = info.n_experts, info.n_local
    grank = {r: j for j, r in enumerate(sorted(info.group_ranks))}
    info._key = torch.tensor([grank[info.group_ranks[e // nl]] * nl + e % nl for e in range(E)], dtype=torch.long)

    _, block = _find_module(model, info.boundary)
    experts = block.experts
    cls = type(experts)
    lo, hi = info.first_expert, info.first_expert + nl
    for pn in info.expert_params:
        old = getattr(experts, pn)
        new = torch.nn.Parameter(old.detach()[lo:hi].clone(), requires_grad=old.requires_grad)
        new._hp_ep = info
        setattr(experts, pn, new)
    experts.num_experts = nl
    experts._hp_num_experts_global = E
    info._local_forward = cls.forward
    experts._hp_ep = info
    experts.__class__ = _ep_class(cls)
    block._hp_ep = info
    return info

"""The torch.distributed.tensor.parallel styles a hyperpar plan becomes (one per module FQN).

Layout of activations (the invariant every style keeps):

    embed --DTensor(out_dst)--> norm --DTensor--> attention --DTensor(out_dst)--> + residual --> ... --> lm_head
                                                  | entry: in_src -> in_dst (a DTensor; R->R: f)
                                                  | inside: colwise Linear -> local tensor (the rank's heads/width)
                                                  |         rowwise Linear -> DTensor P (partial sums)
                                                  | exit:  out_src -> out_dst (+ deferred biases)

Between boundaries the residual stream is a DTensor on the tp mesh in the layout the plan gives it (S(1) with
sequence parallelism, R without), so the model's own code (shapes, position ids, the causal mask, the residual
adds) sees global shapes. Inside an attention or MLP boundary the head/width-sharded tensors are local, so
transformers' `.view(*shape, -1, head_dim)` finds the rank's local heads. A boundary's output leaves as a DTensor,
except the last one (the logits) when it is Replicate: then it is the local (whole) tensor.

Every style here is a ParallelStyle, so `parallelize_module(model, tp_mesh, plan_styles(plan, mesh))` applies the
same tensor parallelism as `hyperpar.torch.parallelize`, which also checks the plan against the model first, sets
the tp-local attributes, puts every gradient in its parameter's layout and adds data parallelism (_grads.py).
"""
import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from .._native import Error
from . import _layout as L


def _param(t, mesh, placement, src_data_rank):
    """A parameter distributed over the tp mesh. src_data_rank as torch's parallelize_module: 0 scatters rank 0's
    full tensor (the other ranks' values are ignored); None keeps each rank's own slice of its own full tensor (every
    rank must then hold the same weights: the same seed or the same checkpoint)."""
    if isinstance(t, DTensor):
        return t
    return nn.Parameter(distribute_tensor(t.detach(), mesh, [L.norm(placement, t.ndim)], src_data_rank=src_data_rank),
                        requires_grad=t.requires_grad)


class _ReplicateGrad(torch.autograd.Function):
    """Identity forward; backward makes a Partial gradient Replicate (an all-reduce). Used where a replicated
    activation's gradient may arrive as a partial sum: behind an R -> R boundary entry (see _enter), and behind the
    exit of a vocab-parallel embedding whose output is Replicate (torch cannot redistribute a Partial gradient back
    through a MaskPartial reduction)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if isinstance(g, DTensor) and any(isinstance(p, Partial) for p in g.placements):
            g = g.redistribute(g.device_mesh, [Replicate() if isinstance(p, Partial) else p for p in g.placements])
        return g


def _rows(p, ndim, rows2d):
    """A plan placement of the [B, S, H] stream, for a tensor of the block's rows flattened to [B*S, H] (Qwen2-MoE
    calls its shared expert so): the sequence split S(1) is a split of the rows, Shard(0)."""
    if rows2d and ndim == 2 and isinstance(p, Shard) and p.dim in (1, -2):
        return Shard(0)
    return p


def _enter(x, mesh, src, dst, fqn, name, rows2d=False):
    """An input of a boundary: annotated (or checked) as in_src, redistributed to in_dst."""
    if not isinstance(x, torch.Tensor):
        return x
    src, dst = _rows(src, x.ndim, rows2d), _rows(dst, x.ndim, rows2d)
    if isinstance(x, DTensor):
        # A DTensor knows its layout. It is in_src unless the model's own code re-laid it out between boundaries
        # (generate's last-position slice hidden_states[:, -1:] gathers a sequence-sharded tensor); then it goes
        # from the layout it has, and the entry's collective is the one that layout needs.
        src = x.placements[0]
    else:
        x = DTensor.from_local(x, mesh, [L.norm(src, x.ndim)], run_check=False)
    if not L.same(src, dst, x.ndim):
        x = x.redistribute(mesh, [L.norm(dst, x.ndim)])
    elif isinstance(dst, Replicate) and x.is_floating_point():
        # R -> R: no collective forward; backward, the gradient the module gives its replicated input is a partial
        # sum when tp cuts the module (heads, width, vocabulary): sum it here, the dual of an identity entry
        # (Megatron's f), so no partial gradient leaves the boundary and flows through the model's casts and norms
        x = _ReplicateGrad.apply(x)
    return x


def _exit(y, mesh, src, dst, fqn, biases, local, rows2d=False):
    """The output of a boundary: checked (or annotated) as out_src, redistributed to out_dst, deferred biases added
    once after the reduction, returned as a DTensor (or local when `local`)."""
    if not isinstance(y, torch.Tensor):
        return y
    if src is not None and dst is not None:
        src, dst = _rows(src, y.ndim, rows2d), _rows(dst, y.ndim, rows2d)
    if src is not None and dst is not None:
        if isinstance(y, DTensor):
            if not L.same(y.placements[0], src, y.ndim):
                raise Error("hyperpar.torch: boundary '%s': the module computes its output as %s on tp, but the plan's "
                            "out_src says %s (a parameter placement and out_src disagree)"
                            % (fqn, L.show(y.placements[0]), L.show(src)))
        else:
            y = DTensor.from_local(y, mesh, [L.norm(src, y.ndim)], run_check=False)
        if not L.same(src, dst, y.ndim):
            masked = type(y.placements[0]) is not Partial and isinstance(y.placements[0], Partial)
            y = y.redistribute(mesh, [L.norm(dst, y.ndim)])
            if masked and isinstance(dst, Replicate):
                y = _ReplicateGrad.apply(y)
    for b in biases:
        if not isinstance(y, DTensor):
            y = DTensor.from_local(y, mesh, [Replicate()], run_check=False)
        y = y + b
    if local and isinstance(y, DTensor):
        y = y.to_local()
    return y


class BoundaryStyle(ParallelStyle):
    """One plan boundary: its entry (in_src -> in_dst for each named input), its exit (out_src -> out_dst for the
    output, or the first element of a tuple output), the deferred biases (D-22) added after the exit, and the
    parameters that belong to the boundary module itself (a leaf boundary: embedding, lm_head, norm), distributed
    as the plan places them.

    inputs: [(plan name, src, dst)]; output: (src, dst) or None (no exit communication); params: {param name:
    Placement}, and with replicate_rest every other parameter of the module itself Replicate (norms); deferred:
    [child path] whose `.bias` is added after the exit; local: return the output as a local tensor."""

    def __init__(self, fqn, inputs, output, params=None, deferred=(), local=False, replicate_rest=False,
                 local_params=None, rows2d=False):
        super().__init__()
        self.fqn = fqn
        self.inputs = list(inputs)
        self.output = output
        self.params = dict(params or {})
        self.deferred = list(deferred)
        self.local = local
        self.replicate_rest = replicate_rest
        self.local_params = dict(local_params or {})
        self.rows2d = rows2d

    def _apply(self, module, device_mesh):
        where = resolve_inputs(self.fqn, module, [n for n, _, _ in self.inputs])
        for name, placement in self.params.items():
            module.register_parameter(name, _param(getattr(module, name), device_mesh, placement, self.src_data_rank))
        for name, placement in self.local_params.items():
            module.register_parameter(name, _param(getattr(module, name), device_mesh, placement, self.src_data_rank))
        if self.replicate_rest:
            for name, p in list(module.named_parameters(recurse=False)):
                if name not in self.params:
                    module.register_parameter(name, _param(p, device_mesh, Replicate(), self.src_data_rank))
        mesh = device_mesh
        inputs = [(n, arg, pos, src, dst) for (n, src, dst), (arg, pos) in zip(self.inputs, where)]
        own = list(self.local_params)
        rows2d = self.rows2d

        def pre(mod, args, kwargs):
            args = list(args)
            for pname, arg, pos, src, dst in inputs:
                if arg in kwargs:
                    kwargs[arg] = _enter(kwargs[arg], mesh, src, dst, self.fqn, pname, rows2d)
                elif pos is not None and pos < len(args):
                    args[pos] = _enter(args[pos], mesh, src, dst, self.fqn, pname, rows2d)
            for name in own:
                # the module computes on the rank's heads: its own per-head tensor is the rank's slice, a local
                # tensor in the instance dict, which attribute lookup finds before nn.Module's parameters (the
                # parameter itself stays the DTensor; to_local's backward gives it its slice's gradient)
                mod.__dict__[name] = mod._parameters[name].to_local()
            return tuple(args), kwargs

        def post(mod, args, out):
            for name in own:
                mod.__dict__.pop(name, None)
            biases = [mod.get_submodule(c).bias for c in self.deferred]
            src, dst = self.output if self.output is not None else (None, None)
            if isinstance(out, tuple) and out:
                return (_exit(out[0], mesh, src, dst, self.fqn, biases, self.local, rows2d),) + tuple(out[1:])
            return _exit(out, mesh, src, dst, self.fqn, biases, self.local, rows2d)

        module.register_forward_pre_hook(pre, with_kwargs=True)
        module.register_forward_hook(post)
        return module

    def __repr__(self):
        ins = ", ".join("%s: %s->%s" % (n, L.show(s), L.show(d)) for n, s, d in self.inputs)
        out = "none" if self.output is None else "%s->%s" % (L.show(self.output[0]), L.show(self.output[1]))
        ps = ", ".join("%s: %s" % (k, L.show(v)) for k, v in self.params.items())
        return "hyperpar.BoundaryStyle(%s; in {%s}; out %s; params {%s}; deferred %s)" % (
            self.fqn, ins, out, ps, self.deferred)


class _NoBiasLinear(nn.Linear):
    """A Linear whose bias is added by its boundary after the exit reduction (D-22), not in the product."""

    def forward(self, input):
        return F.linear(input, self.weight)


class LinearStyle(ParallelStyle):
    """A Linear inside an attention or MLP boundary, computing on the rank's slice:

    - colwise (weight S(0), bias S(0)): input Replicate, output the rank's columns as a local tensor
      (torch's ColwiseParallel with use_local_output=True);
    - rowwise (weight S(1)): input the rank's columns (local, or a DTensor S(-1)), output a DTensor P of partial
      sums that the boundary's exit reduces (torch's RowwiseParallel with output_layouts=Partial(),
      use_local_output=False); its bias, when present, is deferred: added once by the boundary after the reduction;
    - replicate (weight R): the input's layout kept (a local input is Replicate), the output as the input came.
    """

    def __init__(self, mode, has_bias=False, defer_bias=False, partial=False):
        super().__init__()
        assert mode in ("colwise", "rowwise", "replicate")
        self.mode = mode
        self.has_bias = has_bias
        self.defer_bias = defer_bias
        self.partial = partial

    def _apply(self, module, device_mesh):
        wp = {"colwise": Shard(0), "rowwise": Shard(1), "replicate": Replicate()}[self.mode]
        bp = Shard(0) if self.mode == "colwise" else Replicate()
        module.register_parameter("weight", _param(module.weight, device_mesh, wp, self.src_data_rank))
        if getattr(module, "bias", None) is not None:
            module.register_parameter("bias", _param(module.bias, device_mesh, bp, self.src_data_rank))
            if self.defer_bias:
                module.__class__ = _NoBiasLinear
        mode, mesh = self.mode, device_mesh
        # partial: in a module that tp cuts (it has column-parallel Linears) and that also computes replicated
        # intermediates (MLA's latent projections q_a_proj, kv_a_proj_with_mqa), such an intermediate is a local
        # tensor (the module's own code mixes it with local tensors: the rotary cos/sin, the rank's heads) whose
        # gradient on each rank is that rank's heads' share: a replicated Linear gives its output as a local tensor
        # with a Partial gradient, and a column-parallel Linear takes such a local input without summing its
        # gradient; the sum happens once, at the boundary's entry (and for the weights, in _grads.py's hook).
        grad = [Partial()] if self.partial else None

        def pre(mod, args):
            x = args[0]
            was_local = not isinstance(x, DTensor)
            if mode == "colwise":
                x = DTensor.from_local(x, mesh, [Replicate()], run_check=False, grad_placements=grad) \
                    if was_local else x
                if not isinstance(x.placements[0], Replicate):
                    x = x.redistribute(mesh, [Replicate()])
            elif mode == "rowwise":
                x = DTensor.from_local(x, mesh, [Shard(x.ndim - 1)], run_check=False) if was_local else x
                if not L.same(x.placements[0], Shard(-1), x.ndim):
                    x = x.redistribute(mesh, [Shard(x.ndim - 1)])
            else:
                x = DTensor.from_local(x, mesh, [Replicate()], run_check=False, grad_placements=grad) \
                    if was_local else x
            mod._hp_local_in = was_local
            return (x,) + tuple(args[1:])

        def post(mod, args, out):
            if mode == "colwise":
                return out.to_local()
            if mode == "replicate" and (mod._hp_local_in or grad is not None):
                return out.to_local(grad_placements=grad)
            return out

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module

    def __repr__(self):
        return "hyperpar.LinearStyle(%s%s)" % (self.mode, ", bias deferred" if self.defer_bias else "")


class _ShareToWhole(torch.autograd.Function):
    """Identity forward; backward sums the ranks' shares of a replicated local tensor's gradient (all-reduce)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        torch.distributed.all_reduce(g, group=ctx.group)
        return g, None


class _WholeToShare(torch.autograd.Function):
    """Identity forward; backward turns a whole gradient into shares that sum to it exactly: tp rank 0 keeps it,
    the others give zeros."""

    @staticmethod
    def forward(ctx, x, first):
        ctx.first = first
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (g if ctx.first else torch.zeros_like(g)), None


class NestedNormStyle(ParallelStyle):
    """A norm nested in an attention boundary (Qwen3's q_norm/k_norm, MLA's q_a/kv_a layernorms): it runs on the
    attention's local tensors, in plain torch, with its weight as a local tensor, so the plan's residual-stream
    contract is not its layout.

    - A 4-D local input [B, S, heads, head_dim] holds the rank's heads: the weight's gradient is each rank's heads'
      share, Partial, summed over tp once after backward (_grads.py; transformers' replicated_with_grad_allreduce).
    - Any other local input is a replicated latent (MLA) whose gradient each rank holds as its heads' share (see
      LinearStyle's `partial`). The norm (transformers computes it in float32) must run its backward on the whole
      gradient, as the unsharded model does: the output's gradient is summed over tp first, the weight's gradient is
      then whole on every rank, and the input's leaves as shares again (tp rank 0 the whole, the others zeros).
    - A DTensor input keeps its layout, and DTensor computes."""

    def _apply(self, module, device_mesh):
        for name, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(name, _param(p, device_mesh, Replicate(), self.src_data_rank))
        names = [n for n, _ in module.named_parameters(recurse=False)]
        group = device_mesh.get_group()
        first = device_mesh.get_local_rank() == 0

        def pre(mod, args):
            x = args[0]
            mod._hp_mode = None
            if isinstance(x, DTensor):
                return args
            mod._hp_mode = "heads" if x.ndim == 4 else "latent"
            grad = [Partial()] if mod._hp_mode == "heads" else None
            for n in names:
                mod.__dict__[n] = mod._parameters[n].to_local(grad_placements=grad)
            if mod._hp_mode == "latent" and x.requires_grad:
                x = _WholeToShare.apply(x, first)
            return (x,) + tuple(args[1:])

        def post(mod, args, out):
            for n in names:
                mod.__dict__.pop(n, None)
            if mod._hp_mode == "latent" and isinstance(out, torch.Tensor) and out.requires_grad:
                out = _ShareToWhole.apply(out, group)
            return out

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module

    def __repr__(self):
        return "hyperpar.NestedNormStyle()"


class TiedHeadStyle(ParallelStyle):
    """The head of a model whose lm_head shares the embedding's weight (tied_pairs; such a plan has no lm_head
    boundary). Applied to the root module after the embedding's style: it re-points the head's weight at the
    embedding's distributed parameter (so the two stay one parameter, one gradient) and wraps the head with the
    column-parallel head contract of docs/run.md: in_dst R, out_src S(-1), out_dst R or S(-1) (loss-parallel)."""

    def __init__(self, head, embed, boundary):
        super().__init__()
        self.head, self.embed, self.boundary = head, embed, boundary

    def _apply(self, module, device_mesh):
        emb, name = self.embed.rsplit(".", 1)
        w = getattr(module.get_submodule(emb), name)
        if not isinstance(w, DTensor):
            raise Error("hyperpar.torch: tied head '%s': the embedding weight '%s' is not distributed yet; apply the "
                        "embedding's style first" % (self.head, self.embed))
        head = module.get_submodule(self.head)
        head.weight = w
        self.boundary.src_data_rank = self.src_data_rank
        self.boundary._apply(head, device_mesh)
        return module

    def __repr__(self):
        return "hyperpar.TiedHeadStyle(%s = %s, %r)" % (self.head, self.embed, self.boundary)


class ExpertBlockStyle(ParallelStyle):
    """An expert-parallel MoE block (hyperpar.torch.ep: its experts exchange rows over the EP group with plain
    collectives) inside the tp region. The block computes on local tensors: its input arrives as the plan's in_src
    DTensor, goes to in_dst and enters as the rank's local rows ([B, S/tp, H] with sequence parallelism, the whole
    [B, S, H] without); its output (a tensor, or the first element of a tuple: gpt-oss returns the router scores
    too) leaves as those rows, annotated out_src and redistributed to out_dst, a DTensor again. Its router and
    other replicated tensors stay plain tensors (hyperpar.torch's gradient hooks reduce them); a shared expert
    nested in it has its own BoundaryStyle with local input and output."""

    def __init__(self, fqn, name, src, dst, output):
        super().__init__()
        self.fqn, self.name, self.src, self.dst, self.output = fqn, name, src, dst, output

    def _apply(self, module, device_mesh):
        (arg, pos), = resolve_inputs(self.fqn, module, [self.name])
        mesh, fqn, name, src, dst = device_mesh, self.fqn, self.name, self.src, self.dst
        osrc, odst = self.output if self.output is not None else (dst, dst)

        def rows(x):
            if not isinstance(x, torch.Tensor):
                return x
            x = _enter(x, mesh, src, dst, fqn, name)
            return x.to_local() if isinstance(x, DTensor) else x

        def pre(mod, args, kwargs):
            if arg in kwargs:
                kwargs[arg] = rows(kwargs[arg])
                return tuple(args), kwargs
            args = list(args)
            if pos < len(args):
                args[pos] = rows(args[pos])
            return tuple(args), kwargs

        def post(mod, args, out):
            if isinstance(out, tuple) and out:
                return (_exit(out[0], mesh, osrc, odst, fqn, [], False),) + tuple(out[1:])
            return _exit(out, mesh, osrc, odst, fqn, [], False)

        module.register_forward_pre_hook(pre, with_kwargs=True)
        module.register_forward_hook(post)
        return module

    def __repr__(self):
        out = "none" if self.output is None else "%s->%s" % (L.show(self.output[0]), L.show(self.output[1]))
        return "hyperpar.ExpertBlockStyle(%s; in %s: %s->%s; out %s)" % (
            self.fqn, self.name, L.show(self.src), L.show(self.dst), out)


def resolve_inputs(fqn, module, names):
    """Where each plan input name is in module.forward's arguments: [(argument name, position)]. A name that is an
    argument is that one; a boundary with one input whose name is not (an MLP's `x`, a Linear's `input`) takes the
    first argument."""
    args = forward_args(module)
    out = []
    for n in names:
        if n in args:
            out.append((n, args.index(n)))
        elif len(names) == 1 and args:
            out.append((args[0], 0))
        else:
            raise Error("hyperpar.torch: boundary '%s': input '%s' is not an argument of %s.forward (%s)"
                        % (fqn, n, type(module).__name__, ", ".join(args) or "no named arguments"))
    return out


def forward_args(module):
    """The argument names of module.forward, in order (without self)."""
    try:
        sig = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return []
    return [n for n, p in sig.parameters.items()
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]


__all__ = ["resolve_inputs", "BoundaryStyle", "LinearStyle", "NestedNormStyle", "TiedHeadStyle", "ExpertBlockStyle"]

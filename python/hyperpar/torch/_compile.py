"""A plan read against a live model and a DeviceMesh, into what parallelize applies: every check first, nothing
changed here.

compile(model, plan, device_mesh) -> Program, or hyperpar.Error naming the boundary (or the mesh) that torch cannot
express. A Program holds:

    styles   [(module FQN, ParallelStyle)] in plan order, applied on the tp sub-mesh (none when tp is 1);
    ep       [boundary] the moe_mlp boundaries that python/hyperpar/torch/ep.py applies (ep_mode != "none");
    attrs    [(module FQN, attribute, global, local)] the tp-local head counts (D-17) to set;
    dp       the dp process group and size (gradients averaged over it), or None.

The mapping, per boundary type (tp placement of the parameter, as docs/plan-format.md writes it):

    embed      nn.Embedding   weight S(0): vocab-parallel, produces P;  S(1): produces S(-1);  R: produces R
    lm_head    nn.Linear      weight S(0): column-parallel, in_dst R, produces S(-1);  R: produces in_dst
    norm       any norm       every parameter R, the input's last dim whole; produces in_dst (SequenceParallel
                              when that is S(1)); nested in an attention boundary: NestedNormStyle
    attention  container of nn.Linear: S(0) (+ bias S(0)) colwise, S(1) rowwise (bias deferred), R replicated;
    mlp        in_dst R when anything is colwise; produces P when anything is rowwise, else in_dst
    moe_mlp / moe_gate with ep_mode != "none": ep.apply_expert_parallel; with "none": as a container when every
               parameter sits in an nn.Linear (per-expert modules), else refused

Transitions follow the runtime's lowering table (docs/run.md): equal, S(d)->R, P->R, P->S(d), R->S(d); anything
else is refused, as are unknown placements, unknown boundary types, packed S(d)x2 shards, parameters the model
does not have and trainable parameters no boundary declares.
"""
import inspect

import torch.nn as nn
from torch.distributed.tensor import Partial, Replicate, Shard

from .._native import Error
from . import _layout as L
from ._styles import (BoundaryStyle, ExpertBlockStyle, LinearStyle, NestedNormStyle, TiedHeadStyle, forward_args,
                      resolve_inputs)

# Attribute names transformers versions use for the head counts the plan divides (tp_local_attrs).
_ALIASES = {
    "num_attention_heads": ("num_attention_heads", "num_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads"),
}


class Program:
    def __init__(self):
        self.styles = []
        self.ep = []
        self.attrs = []
        self.tp_mesh = None
        self.tp = 1
        self.dp_group = None
        self.dp = 1
        self.notes = []
        self.ep_roots = []


def _berr(fqn, msg):
    return Error("hyperpar.torch: boundary '%s': %s" % (fqn, msg))


def _plan_data(plan):
    data = getattr(plan, "data", plan)
    if not isinstance(data, dict) or data.get("format") != "hyperpar-plan":
        raise Error("hyperpar.torch: the plan is not a hyperpar plan (expected a hyperpar.Plan or its JSON dict with "
                    "\"format\": \"hyperpar-plan\")")
    if data.get("version") != 1:
        raise Error("hyperpar.torch: plan version %r is not 1, the version this hyperpar.torch reads"
                    % (data.get("version"),))
    return data


def check_mesh(data, device_mesh):
    """The device mesh's dims must be the plan's mesh dims, in the plan's order, with the same sizes; a plan dim
    of size 1 may be absent. Returns {name: size} of the plan."""
    dims = data.get("mesh", {}).get("dims", [])
    plan_dims = [(d["name"], int(d["size"])) for d in dims]
    names = getattr(device_mesh, "mesh_dim_names", None)
    if not names:
        raise Error("hyperpar.torch: the device mesh has no dim names; make it with init_device_mesh(..., "
                    "mesh_dim_names=%r) as the plan's mesh %s"
                    % (tuple(n for n, s in plan_dims if s > 1), _show_dims(plan_dims)))
    mesh_dims = [(n, device_mesh.size(i)) for i, n in enumerate(names)]
    want = [(n, s) for n, s in plan_dims if s > 1]
    have = [(n, s) for n, s in mesh_dims if s > 1]
    known = dict(plan_dims)
    for n, s in mesh_dims:
        if n not in known:
            raise Error("hyperpar.torch: the device mesh %s has dim '%s', which the plan's mesh %s does not have"
                        % (_show_dims(mesh_dims), n, _show_dims(plan_dims)))
        if s != known[n]:
            raise Error("hyperpar.torch: the device mesh %s does not match the plan's mesh %s: '%s' is %d there, %d "
                        "in the plan" % (_show_dims(mesh_dims), _show_dims(plan_dims), n, s, known[n]))
    if want != have:
        raise Error("hyperpar.torch: the device mesh %s does not match the plan's mesh %s (dims of size > 1 must be "
                    "the same, in the same order)" % (_show_dims(mesh_dims), _show_dims(plan_dims)))
    return dict(plan_dims)


def _show_dims(dims):
    return "(" + ", ".join("%s=%d" % (n, s) for n, s in dims) + ")"


def _transition(fqn, what, name, src, dst):
    """The plan's lowering table (docs/run.md): what one tp transition may be."""
    if L.same(src, dst, 8):
        return
    ok = ((isinstance(src, Shard) and isinstance(dst, Replicate)) or
          (isinstance(src, Partial) and isinstance(dst, (Replicate, Shard))) or
          (isinstance(src, Replicate) and isinstance(dst, Shard)))
    if not ok:
        raise _berr(fqn, "%s '%s': %s -> %s is not a transition hyperpar lowers (all-gather, all-reduce, "
                    "reduce-scatter or a local slice)" % (what, name, L.show(src), L.show(dst)))


def _tp(fqn, where, pmap, axes=("tp",)):
    try:
        return L.tp_of(pmap, axes)
    except L.Unmappable as e:
        raise _berr(fqn, "%s: %s" % (where, e))


def _io(fqn, b, module):
    """The boundary's named inputs [(plan name, src, dst)] and its exit (src, dst) or None. With the module, each
    input name is checked to be one of its forward's arguments (resolve_inputs)."""
    in_src, in_dst = b.get("in_src") or {}, b.get("in_dst") or {}
    if not isinstance(in_src, dict) or not isinstance(in_dst, dict):
        raise _berr(fqn, "in_src/in_dst are not objects")
    names = sorted(set(in_src) | set(in_dst))
    inputs = []
    for n in names:
        src = _tp(fqn, "in_src '%s'" % n, in_src.get(n))
        dst = _tp(fqn, "in_dst '%s'" % n, in_dst.get(n))
        _transition(fqn, "input", n, src, dst)
        inputs.append((n, src, dst))
    if module is not None:
        resolve_inputs(fqn, module, names)
    out_src, out_dst = b.get("out_src"), b.get("out_dst")
    output = None
    if out_src is not None and out_dst is not None:
        if not isinstance(out_src, dict) or not isinstance(out_dst, dict) or len(out_src) > 1 or len(out_dst) > 1:
            raise _berr(fqn, "out_src/out_dst must each name one output (the module's output, or the first element "
                        "of its tuple)")
        on = next(iter(out_src or out_dst), "output")
        src = _tp(fqn, "out_src '%s'" % on, next(iter(out_src.values()), None))
        dst = _tp(fqn, "out_dst '%s'" % on, next(iter(out_dst.values()), None))
        _transition(fqn, "output", on, src, dst)
        output = (src, dst)
    return inputs, output


def _owner(model, fqn, rel):
    """(owner module path, owner module, parameter name) of a boundary's relative parameter path; the owner is None
    without a model (plan_styles: nothing to check against)."""
    full = (fqn + "." if fqn else "") + rel
    path, _, name = full.rpartition(".")
    if model is None:
        return path, None, name
    try:
        owner = model.get_submodule(path)
    except AttributeError:
        raise _berr(fqn, "parameter '%s' is not a parameter of this model (no module '%s')" % (rel, path))
    if name not in owner._parameters or owner._parameters[name] is None:
        raise _berr(fqn, "parameter '%s' is not a parameter of this model (%s has %s)"
                    % (rel, type(owner).__name__, ", ".join(owner._parameters) or "no parameters of its own"))
    return path, owner, name


def _placement(fqn, rel, pmap, owner, name):
    p = _tp(fqn, "parameter '%s'" % rel, pmap)
    if isinstance(p, Partial):
        raise _berr(fqn, "parameter '%s' is placed P, which no parameter can be" % rel)
    if owner is not None and isinstance(p, Shard):
        nd = owner._parameters[name].ndim
        if not -nd <= p.dim < nd:
            raise _berr(fqn, "parameter '%s': %s does not fit its %d dims" % (rel, L.show(p), nd))
        p = L.norm(p, nd)
    return p


def _leaf_params(fqn, b, model, module):
    """Placements of the parameters a leaf boundary (embedding, head, norm) owns itself: {name: Placement}."""
    out = {}
    for rel, pmap in (b.get("params") or {}).items():
        path, owner, name = _owner(model, fqn, rel)
        if path != fqn:
            raise _berr(fqn, "parameter '%s' belongs to a submodule; a %s boundary holds only its own parameters"
                        % (rel, b.get("type")))
        out[name] = _placement(fqn, rel, pmap, owner, name)
    return out


def _expect(fqn, what, got, want, ndim):
    if not L.same(got, want, ndim):
        raise _berr(fqn, "%s: the module computes %s here but the plan says %s" % (what, L.show(got), L.show(want)))


def _embed(fqn, b, model, module):
    if module is not None and not isinstance(module, nn.Embedding):
        raise _berr(fqn, "an embed boundary must be an nn.Embedding for hyperpar.torch (found %s)"
                    % type(module).__name__)
    params = _leaf_params(fqn, b, model, module)
    w = L.norm(params.get("weight", Replicate()), 2)
    inputs, output = _io(fqn, b, module)
    for n, src, dst in inputs:
        if not isinstance(dst, Replicate):
            raise _berr(fqn, "input '%s' is placed %s; the token ids must be Replicate on tp" % (n, L.show(dst)))
    if w == Shard(0):
        produced = Partial()   # vocab-parallel: each rank's rows, the others' ids masked to 0, summed at the exit
    elif w == Shard(1):
        produced = Shard(2)    # each rank's columns of every token's vector
    elif isinstance(w, Replicate):
        produced = Replicate()
    else:
        raise _berr(fqn, "the embedding weight's placement %s is not one hyperpar.torch maps" % L.show(w))
    if output is not None:
        _expect(fqn, "out_src", produced, output[0], 3)
    params["weight"] = w
    return BoundaryStyle(fqn, inputs, output, params, [], False)


def _head(fqn, b, model, module, loss_parallel):
    if module is not None and not isinstance(module, nn.Linear):
        raise _berr(fqn, "an lm_head boundary must be an nn.Linear for hyperpar.torch (found %s)"
                    % type(module).__name__)
    params = _leaf_params(fqn, b, model, module)
    w = L.norm(params.get("weight", Replicate()), 2)
    has_bias = getattr(module, "bias", None) is not None if module is not None else "bias" in params
    inputs, output = _io(fqn, b, module)
    if b.get("deferred_biases"):
        raise _berr(fqn, "a deferred bias on the head itself is not supported by hyperpar.torch")
    if len(inputs) != 1:
        raise _berr(fqn, "the head takes one input, the plan names %d" % len(inputs))
    dst = inputs[0][2]
    bias = L.norm(params.get("bias", Replicate()), 1)
    if w == Shard(0):
        if not isinstance(dst, Replicate):
            raise _berr(fqn, "a column-parallel head (weight S(0)) computes on a Replicate input, the plan's in_dst is "
                        "%s" % L.show(dst))
        if has_bias and bias != Shard(0):
            raise _berr(fqn, "a column-parallel head's bias must be S(0) with its weight, the plan says %s"
                        % L.show(bias))
        produced = Shard(2)
    elif isinstance(w, Replicate):
        if has_bias and not isinstance(bias, Replicate):
            raise _berr(fqn, "a replicated head's bias must be R")
        produced = dst
    else:
        raise _berr(fqn, "the head's weight placement %s is not one hyperpar.torch maps (S(0) column-parallel, or R)"
                    % L.show(w))
    params["weight"] = w
    if has_bias:
        params["bias"] = bias
    if output is not None:
        _expect(fqn, "out_src", produced, output[0], 3)
        final = output[1]
    else:
        final = produced
    if loss_parallel and not isinstance(final, Shard) and isinstance(w, Shard):
        pass  # a loss-parallel plan whose head gathers anyway: torch computes the loss on whole logits, still exact
    return BoundaryStyle(fqn, inputs, output, params, [], isinstance(final, Replicate))


def _norm(fqn, b, model, module):
    params = _leaf_params(fqn, b, model, module)
    for name, p in params.items():
        if not isinstance(p, Replicate):
            raise _berr(fqn, "norm parameter '%s' is placed %s; hyperpar.torch runs norms with replicated "
                        "parameters only" % (name, L.show(p)))
    if module is not None:
        for name, p in module.named_parameters():
            if "." in name:
                raise _berr(fqn, "a norm boundary with parameters in submodules (%s) is not supported" % name)
    inputs, output = _io(fqn, b, module)
    if len(inputs) != 1:
        raise _berr(fqn, "a norm takes one input, the plan names %d" % len(inputs))
    dst = inputs[0][2]
    if isinstance(dst, Partial) or (isinstance(dst, Shard) and dst.dim in (-1, 2)):
        raise _berr(fqn, "a norm computes over the last dim, which in_dst %s does not hold whole" % L.show(dst))
    if output is not None:
        _expect(fqn, "out_src", dst, output[0], 3)
    return BoundaryStyle(fqn, inputs, output, params, [], False, replicate_rest=True)


def _deferred(fqn, b, model):
    """deferred_biases as child paths ('o_proj.bias' -> 'o_proj'), each the bias of an nn.Linear of the boundary."""
    out = []
    for rel in b.get("deferred_biases") or []:
        if not isinstance(rel, str) or not rel.endswith(".bias"):
            raise _berr(fqn, "deferred bias %r is not the '.bias' of a Linear, which is what hyperpar.torch adds after "
                        "the exit" % (rel,))
        _owner(model, fqn, rel)
        out.append(rel[:-len(".bias")])
    return out


def _container(fqn, b, model, module, tp=2, nested=False):
    """An attention or MLP boundary: every parameter sits in an nn.Linear child (or in a nested norm boundary), or,
    in an attention, is a per-head tensor of the module itself placed S(0) (gpt-oss's sinks: the rank's heads).
    nested: an MLP inside an expert-parallel block (a shared expert), called on the block's local rows: its input
    arrives and its output leaves as local tensors ([B*S, H] rows too: Qwen2-MoE flattens them)."""
    inputs, output = _io(fqn, b, module)
    deferred = _deferred(fqn, b, model)
    linears = {}  # child path -> {param name: Placement}
    own = {}  # the module's own per-head parameters -> Shard(0)
    problems = []  # every parameter torch cannot express here, so that one message names them all
    for rel, pmap in (b.get("params") or {}).items():
        path, owner, name = _owner(model, fqn, rel)
        if path == fqn:
            try:
                pl = L.tp_of(pmap)
            except L.Unmappable as e:
                problems.append("parameter '%s': %s" % (rel, e))
                continue
            if b.get("type") == "attention" and isinstance(pl, Shard) and L.norm(pl, 1) == Shard(0):
                n0 = owner._parameters[name].shape[0] if owner is not None else None
                if owner is not None and (owner._parameters[name].ndim < 1 or n0 % tp):
                    problems.append("parameter '%s' (shape %s) of the attention module itself is placed S(0) but "
                                    "its first dim does not split over tp=%d"
                                    % (rel, list(owner._parameters[name].shape), tp))
                    continue
                own[name] = Shard(0)  # per-head (gpt-oss's sinks): the rank's heads, as the projections' S(0)
                continue
            problems.append("parameter '%s' belongs to the %s module itself (placed %s), which computes on local "
                            "tensors; hyperpar.torch maps its nn.Linear children, and in an attention the module's "
                            "own per-head tensors placed S(0)" % (rel, b.get("type"), L.show(pl)))
            continue
        if owner is not None and type(owner) is not nn.Linear:
            try:
                shown = " (placed %s)" % L.show(L.tp_of(pmap))
            except L.Unmappable as e:
                shown = " (%s)" % e
            problems.append("parameter '%s'%s sits in a %s, not an nn.Linear; hyperpar.torch has no style for it"
                            % (rel, shown, type(owner).__name__))
            continue
        if name not in ("weight", "bias"):
            problems.append("parameter '%s' is not a Linear's weight or bias" % rel)
            continue
        child = path[len(fqn) + 1:] if fqn else path
        linears.setdefault(child, {})[name] = _placement(fqn, rel, pmap, owner, name)
    if problems:
        more = " (and %d more)" % (len(problems) - 3) if len(problems) > 3 else ""
        raise _berr(fqn, "; ".join(problems[:3]) + more)
    modes = []
    for child, ps in linears.items():
        if module is not None:
            # an undeclared bias would stay replicated beside a sharded weight
            for name, _ in module.get_submodule(child).named_parameters(recurse=False):
                if name not in ps:
                    raise _berr(fqn, "parameter '%s.%s' is not declared by the boundary (its Linear's weight is)"
                                % (child, name))
        w = L.norm(ps.get("weight", Replicate()), 2)
        bias = ps.get("bias")
        defer = child in deferred
        if w == Shard(0):
            mode = "colwise"
            if bias is not None and L.norm(bias, 1) != Shard(0):
                raise _berr(fqn, "'%s.bias' is placed %s; a column-parallel Linear's bias must be S(0)"
                            % (child, L.show(bias)))
            if defer:
                raise _berr(fqn, "'%s.bias' is deferred, but its Linear is column-parallel" % child)
        elif w == Shard(1):
            mode = "rowwise"
            if bias is not None and not defer:
                raise _berr(fqn, "'%s.bias' sits on a row-parallel Linear and is not in deferred_biases; "
                            "hyperpar.torch adds such a bias only after the exit reduction (D-22)" % child)
            if bias is not None and not isinstance(bias, Replicate):
                raise _berr(fqn, "'%s.bias' is deferred and must be R, the plan says %s" % (child, L.show(bias)))
        elif isinstance(w, Replicate):
            mode = "replicate"
            if bias is not None and not isinstance(bias, Replicate):
                raise _berr(fqn, "'%s.bias' of a replicated Linear must be R" % child)
            if defer:
                raise _berr(fqn, "'%s.bias' is deferred, but its Linear is replicated" % child)
        else:
            raise _berr(fqn, "'%s.weight' is placed %s; an nn.Linear maps to S(0) (colwise), S(1) (rowwise) or R"
                        % (child, L.show(w)))
        modes.append((child, mode, bias is not None, defer))
    for child in deferred:
        if child not in linears:
            raise _berr(fqn, "deferred bias '%s.bias' belongs to no Linear the boundary declares" % child)
    kinds = set(m for _, m, _, _ in modes)
    if "colwise" in kinds:
        for n, src, dst in inputs:
            if not isinstance(dst, Replicate):
                raise _berr(fqn, "input '%s' arrives at the column-parallel Linears as %s; they compute on a "
                            "Replicate input (in_dst R)" % (n, L.show(dst)))
    if "rowwise" in kinds:
        produced = Partial()
    elif "colwise" in kinds:
        raise _berr(fqn, "column-parallel Linears without a row-parallel one leave the output sharded on its "
                    "width; hyperpar.torch does not map that boundary")
    else:
        produced = inputs[0][2] if inputs else Replicate()
    if output is not None:
        _expect(fqn, "out_src", produced, output[0], 3)
    elif isinstance(produced, Partial):
        raise _berr(fqn, "the module produces partial sums (P) but the plan gives it no exit (out_src/out_dst null)")
    if own and "colwise" not in kinds:
        raise _berr(fqn, "per-head parameters (%s) placed S(0) in an attention whose projections are not "
                    "column-parallel" % ", ".join(sorted(own)))
    if nested:
        if len(inputs) != 1:
            raise _berr(fqn, "a boundary nested in an expert-parallel block takes one input, the plan names %d"
                        % len(inputs))
        leave = output[1] if output is not None else produced
        if not L.same(inputs[0][1], leave, 3):
            raise _berr(fqn, "nested in an expert-parallel block, it is called on the block's local rows (in_src %s) "
                        "and its output is added to the block's rows, so out_dst must be the same layout (the plan "
                        "says %s)" % (L.show(inputs[0][1]), L.show(leave)))
    styles = [(fqn, BoundaryStyle(fqn, inputs, output, {}, deferred, nested, local_params=own, rows2d=nested))]
    partial = "colwise" in kinds and "replicate" in kinds  # MLA: replicated latents inside a tp-cut attention
    styles += [((fqn + "." if fqn else "") + child, LinearStyle(mode, has_bias, defer, partial))
               for child, mode, has_bias, defer in modes]
    return styles


def _ep_path(model, fqn):
    """The live module path of an expert-parallel block (ep.py's lookup, with its aliases); fqn itself without a
    model or when nothing is found (the caller then names the missing module)."""
    if model is None:
        return fqn
    for cand in (fqn, fqn.replace(".block_sparse_moe", ".mlp")):
        try:
            model.get_submodule(cand)
            return cand
        except AttributeError:
            pass
    return fqn


def _ep_block(fqn, b, module):
    """The tp contract of an expert-parallel block: one input, taken as the rank's local rows in in_dst (R, or
    split over batch or sequence), and the output leaving in the same layout (out_src = in_dst) -> out_dst."""
    inputs, output = _io(fqn, b, module)
    if len(inputs) != 1:
        raise _berr(fqn, "an expert-parallel block takes one input, the plan names %d" % len(inputs))
    name, src, dst = inputs[0]
    if not (isinstance(dst, Replicate) or L.norm(dst, 3) in (Shard(0), Shard(1))):
        raise _berr(fqn, "an expert-parallel block computes on whole rows: its in_dst is %s (R, S(0) or S(1))"
                    % L.show(dst))
    if output is not None:
        _expect(fqn, "out_src", dst, output[0], 3)
    return ExpertBlockStyle(fqn, name, src, dst, output)


def _local_attrs(fqn, b, module, tp, prog):
    """tp_local_attrs (D-17): the head counts the module keeps as attributes are set to the local counts; a module
    that reads the model-wide config count at run time cannot be given its own and is refused; transformers 5's
    attention modules keep none (their .view(..., -1, head_dim) takes the heads from the projection's width)."""
    attrs = b.get("tp_local_attrs") or {}
    try:
        src = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        src = ""
    for attr, spec in attrs.items():
        g, loc = (spec or {}).get("global"), (spec or {}).get("local")
        if not isinstance(g, int) or not isinstance(loc, int) or loc * tp != g:
            raise _berr(fqn, "tp_local_attrs '%s': local %r is not global %r / tp %d" % (attr, loc, g, tp))
        names = _ALIASES.get(attr, (attr,))
        found = [n for n in names
                 if isinstance(getattr(module, n, None), int) and not isinstance(getattr(module, n), bool)]
        for n in found:
            if getattr(module, n) != g:
                raise _berr(fqn, "tp_local_attrs '%s': the module's %s is %d, the plan's global count is %d"
                            % (attr, n, getattr(module, n), g))
            prog.attrs.append((fqn, n, g, loc))
        if not found and ("config.%s" % attr) in src:
            raise _berr(fqn, "tp_local_attrs '%s': %s.forward reads config.%s at run time, the model-wide (global) "
                        "count; hyperpar.torch cannot give this module its local count"
                        % (attr, type(module).__name__, attr))
        if not found:
            prog.notes.append("%s: %s: no attribute to set (the module takes its heads from the projection widths)"
                              % (fqn, attr))


def compile(model, plan, device_mesh):
    """The plan against the model (None: plan_styles, from the plan alone) and the mesh -> Program. Raises
    hyperpar.Error; changes nothing."""
    data = _plan_data(plan)
    sizes = check_mesh(data, device_mesh)
    names = list(device_mesh.mesh_dim_names)
    prog = Program()
    cp = sizes.get("cp", 1)
    if cp > 1:
        raise Error("hyperpar.torch: context parallelism (cp=%d) is not supported by hyperpar.torch: torch's "
                    "context_parallel rewrites only SDPA's flash, efficient and cuDNN kernels (CUDA) into ring "
                    "attention over load-balanced sequence chunks, while this plan's CP is contiguous chunks with K/V "
                    "all-gathered, and transformers' attention on the CPU runs SDPA's math kernel; run the plan with "
                    "`hyperpar run`/`hyperpar train`, or plan without --cp" % cp)
    for n, s in sizes.items():
        if n not in ("dp", "cp", "tp", "ep", "pp") and s > 1:
            raise Error("hyperpar.torch: mesh axis '%s' (size %d) is not one hyperpar.torch handles" % (n, s))
    if sizes.get("pp", 1) > 1:
        raise Error("hyperpar.torch: pipeline parallelism (pp=%d) is not supported" % sizes["pp"])
    tp = sizes.get("tp", 1)
    prog.tp = tp
    if tp > 1:
        prog.tp_mesh = device_mesh["tp"] if len(names) > 1 else device_mesh
    dp = sizes.get("dp", 1)
    if dp > 1:
        prog.dp = dp
        prog.dp_group = device_mesh.get_group("dp")
    ep_mode = data.get("mesh", {}).get("ep_mode", "none")
    loss_parallel = bool(data.get("loss_parallel"))

    bounds = data.get("boundaries")
    if not isinstance(bounds, list) or not bounds:
        raise Error("hyperpar.torch: the plan has no boundaries")
    fqns = [b.get("fqn") for b in bounds if isinstance(b, dict)]
    attn = [b["fqn"] for b in bounds if isinstance(b, dict) and b.get("type") == "attention"]
    # the expert-parallel blocks, plan fqn -> the live module's path (a Mixtral checkpoint's plan names
    # block_sparse_moe, which transformers 5 calls mlp: ep.py's alias)
    ep_roots = {}
    if ep_mode != "none":
        for b in bounds:
            if isinstance(b, dict) and b.get("type") == "moe_mlp" and isinstance(b.get("fqn"), str):
                ep_roots[b["fqn"]] = _ep_path(model, b["fqn"])
    declared = set()
    styles = []
    for b in bounds:
        fqn = b.get("fqn") if isinstance(b, dict) else None
        btype = b.get("type")
        if not isinstance(fqn, str):
            raise Error("hyperpar.torch: a boundary without an fqn")
        root = next((r for r in ep_roots if fqn.startswith(r + ".")), None)
        live = ep_roots[root] + fqn[len(root):] if root is not None else ep_roots.get(fqn, fqn)
        module = None
        if model is not None:
            try:
                module = model.get_submodule(live)
            except AttributeError:
                raise _berr(fqn, "no such module in this model")
        for rel in (b.get("params") or {}):
            declared.add((live + "." if live else "") + rel)
        if fqn in ep_roots:
            # ep.apply_expert_parallel cuts its experts and runs them over the EP group; on the tp mesh the block
            # gets its input as local rows (in_dst) and gives its output back as out_src -> out_dst
            prog.ep.append(b)
            if tp > 1:
                styles.append((live, _ep_block(fqn, b, module)))
            continue
        if btype == "moe_gate" and ep_mode != "none":
            # the router of an EP block (gpt-oss registers it before its block): it runs inside the block, on the
            # block's rows, with replicated (plain) tensors
            if root is None:
                raise _berr(fqn, "a moe_gate boundary outside every expert-parallel (moe_mlp) block")
            for rel, pmap in (b.get("params") or {}).items():
                path, owner, name = _owner(model, live, rel)
                if not isinstance(_placement(fqn, rel, pmap, owner, name), Replicate):
                    raise _berr(fqn, "the router of an expert-parallel block must be replicated on tp; '%s' is %s"
                                % (rel, L.show(_placement(fqn, rel, pmap, owner, name))))
            continue
        if root is not None:
            # a boundary inside an EP block: the shared expert's MLP, called on the block's local rows
            if btype != "mlp":
                raise _berr(fqn, "a %r boundary nested in the expert-parallel block '%s'; hyperpar.torch applies "
                            "nested MLPs (shared experts) and skips nested routers only" % (btype, root))
            if b.get("is_boundary") is False:
                raise _berr(fqn, "a parameter-only spec (is_boundary false) has no I/O contract hyperpar.torch can "
                            "run its parameters under")
            if tp > 1:
                styles.extend(_container(live, b, model, module, tp, nested=True))
            else:
                for rel, pmap in (b.get("params") or {}).items():
                    path, owner, name = _owner(model, live, rel)
                    p = _placement(fqn, rel, pmap, owner, name)
                    if not isinstance(p, Replicate):
                        raise _berr(fqn, "parameter '%s' is placed %s on a mesh without tp" % (rel, L.show(p)))
            continue
        if b.get("is_boundary") is False:
            raise _berr(fqn, "a parameter-only spec (is_boundary false) has no I/O contract hyperpar.torch can run "
                        "its parameters under")
        if tp == 1:
            for rel, pmap in (b.get("params") or {}).items():
                path, owner, name = _owner(model, fqn, rel)
                p = _placement(fqn, rel, pmap, owner, name)
                if not isinstance(p, Replicate):
                    raise _berr(fqn, "parameter '%s' is placed %s on a mesh without tp" % (rel, L.show(p)))
            if btype not in ("embed", "attention", "mlp", "norm", "lm_head", "moe_mlp", "moe_gate"):
                raise _berr(fqn, "boundary type %r is not one hyperpar.torch handles" % (btype,))
            continue
        if btype == "embed":
            styles.append((fqn, _embed(fqn, b, model, module)))
        elif btype == "lm_head":
            styles.append((fqn, _head(fqn, b, model, module, loss_parallel)))
        elif btype == "norm":
            if any(fqn.startswith(a + ".") for a in attn):
                for rel, pmap in (b.get("params") or {}).items():
                    path, owner, name = _owner(model, fqn, rel)
                    p = _placement(fqn, rel, pmap, owner, name)
                    if not isinstance(p, Replicate):
                        raise _berr(fqn, "a norm inside an attention boundary must have replicated parameters, "
                                    "'%s' is %s" % (rel, L.show(p)))
                styles.append((fqn, NestedNormStyle()))
            else:
                styles.append((fqn, _norm(fqn, b, model, module)))
        elif btype in ("moe_mlp", "moe_gate"):
            # without expert parallelism: only per-expert nn.Linear modules would map; transformers 5's stacked
            # experts and its TopKRouter do not
            try:
                styles.extend(_container(fqn, b, model, module, tp))
            except Error as e:
                raise Error("%s (a MoE block in a plan without expert parallelism: hyperpar.torch runs transformers' "
                            "MoE blocks with expert parallelism, plan with ep=N)" % e)
        elif btype in ("attention", "mlp"):
            styles.extend(_container(fqn, b, model, module, tp))
            if module is not None:
                _local_attrs(fqn, b, module, tp, prog)
        else:
            raise _berr(fqn, "boundary type %r is not one hyperpar.torch handles (embed, attention, mlp, norm, "
                        "lm_head; moe_mlp with expert parallelism through ep.py)" % (btype,))

    # tied embeddings: one parameter, so the head is the column-parallel contract on the embedding's slices
    tied = data.get("tied_pairs") or []
    if tp > 1:
        for pair in tied:
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise Error("hyperpar.torch: tied_pairs entry %r is not [embed weight, head weight]" % (pair,))
            emb_w, head_w = pair
            head = head_w.rsplit(".", 1)[0]
            if head in fqns:
                raise _berr(head, "the head is tied to '%s' and has its own boundary; hyperpar.torch needs one "
                            "placement for the one parameter" % emb_w)
            emb = emb_w.rsplit(".", 1)[0]
            eb = next((b for b in bounds if b.get("fqn") == emb), None)
            ew = L.norm(_tp(emb, "parameter 'weight'", ((eb or {}).get("params") or {}).get("weight")), 2)
            if model is not None:
                try:
                    hm = model.get_submodule(head)
                except AttributeError:
                    raise Error("hyperpar.torch: tied head '%s' is not a module of this model" % head)
                if not isinstance(hm, nn.Linear) or getattr(hm, "bias", None) is not None:
                    raise _berr(head, "a tied head must be an nn.Linear without bias")
            last = bounds[-1]
            arrive = Shard(1) if data.get("sequence_parallel") else Replicate()
            if last.get("type") == "norm" and last.get("out_dst"):
                arrive = _tp(last["fqn"], "out_dst", next(iter(last["out_dst"].values())))
            if ew == Shard(0):
                dst = Replicate()
                out = (Shard(2), Shard(2) if loss_parallel else Replicate())
            elif isinstance(ew, Replicate):
                dst = arrive
                out = (arrive, arrive)
            else:
                raise _berr(head, "tied to an embedding placed %s; hyperpar.torch maps a tied head only on a "
                            "vocab-parallel (S(0)) or replicated embedding" % L.show(ew))
            _transition(head, "input", "hidden_states", arrive, dst)
            bs = BoundaryStyle(head, [("hidden_states", arrive, dst)], out, {}, [], isinstance(out[1], Replicate))
            styles.append(("", TiedHeadStyle(head, emb_w, bs)))
            declared.add(head_w)

    # every trainable parameter must be declared: an undeclared one would stay a plain tensor beside DTensors
    if tp > 1 and model is not None:
        for name, p in model.named_parameters():
            if name in declared or not p.requires_grad:
                continue
            if any(name.startswith(r + ".") for r in ep_roots.values()):
                continue  # the block's own tensors (router, shared gate, experts): replicated or ep.py's
            raise Error("hyperpar.torch: parameter '%s' is declared by no boundary of the plan; hyperpar.torch "
                        "places every parameter as the plan says and does not guess one (make the plan from this "
                        "model, or add the parameter to a boundary)" % name)

    # the expert-parallel blocks: ep.py must be there
    if prog.ep:
        try:
            from . import ep as _ep
            _ep.apply_expert_parallel
        except (ImportError, AttributeError) as e:
            raise _berr(prog.ep[0]["fqn"], "expert parallelism (ep_mode %s) needs hyperpar.torch.ep."
                        "apply_expert_parallel, which is not available here (%s)" % (ep_mode, e))
        check = getattr(_ep, "check_expert_parallel", None)
        if check is not None and model is not None:
            for b in prog.ep:
                try:
                    check(model, b, plan, device_mesh)
                except NotImplementedError as e:
                    raise _berr(b["fqn"], "expert parallelism is not implemented by hyperpar.torch.ep here: %s" % e)
    prog.styles = styles
    prog.ep_roots = list(ep_roots.values())
    return prog

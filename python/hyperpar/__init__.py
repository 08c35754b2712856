"""hyperpar from Python: the planner, cost model, adviser and inspector of the C library (libhyperpar_c.so, no
MPI), and `hyperpar.torch.parallelize`, which applies a plan to a transformers model under torch.distributed.

    import hyperpar as hp
    plan = hp.plan("tests/data/configs/qwen3-30b-a3b.json", mesh={"tp": 2, "ep": 2})
    plan.placements["model.layers.0.self_attn.q_proj.weight"]   # {"tp": "S(0)"}
    hp.cost("tests/data/configs/llama-3-8b.json", mesh={"tp": 8}, mode="train", seq=4096)

Every call returns what the CLI's `--format json` prints (as a dict; Plan.json is the exact text), and every
refusal raises hyperpar.Error with the CLI's message.
"""
import json as _json

from ._native import Error, call as _call

__all__ = ["Error", "Plan", "plan", "cost", "advise", "inspect", "model_source"]


def model_source(model):
    """What the C library reads for a model: a path (checkpoint folder, config.json, .safetensors), a config dict,
    or a live torch.nn.Module (a transformers model: its config and its parameters' names, shapes and dtypes)."""
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        import os
        return {"path": os.fspath(model)}
    if isinstance(model, dict):
        return {"config": model}
    if hasattr(model, "named_parameters") and hasattr(model, "config"):
        cfg = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(model.config)
        tensors = []
        for name, p in model.named_parameters():
            tensors.append({"name": name, "shape": list(p.shape), "dtype": _torch_dtype(p.dtype),
                            "trainable": bool(p.requires_grad)})
        return {"config": cfg, "tensors": tensors, "label": "%s.config" % type(model).__name__}
    raise TypeError("hyperpar: a model is a path, a config dict or a transformers model (torch.nn.Module with a "
                    ".config), got %s" % type(model).__name__)


def _torch_dtype(dt):
    name = str(dt).replace("torch.", "")
    return {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16", "int8": "I8", "uint8": "U8",
            "int32": "I32", "int64": "I64", "bool": "BOOL"}.get(name, name.upper())


def _mesh(mesh, ep_axis):
    if mesh is None:
        return None
    if isinstance(mesh, str):
        return mesh
    if hasattr(mesh, "mesh_dim_names") and hasattr(mesh, "size"):  # a torch DeviceMesh
        mesh = {n: mesh.size(i) for i, n in enumerate(mesh.mesh_dim_names)}
    if not isinstance(mesh, dict):
        raise TypeError("hyperpar: mesh is a dict such as {'dp': 2, 'tp': 2, 'ep': 2}, a string 'dp=2,tp=2' or a "
                        "torch DeviceMesh with dim names, got %s" % type(mesh).__name__)
    return {str(k): int(v) for k, v in mesh.items()}


def _plan_options(mesh=None, ep=None, ep_axis=False, sequence_parallel=None, loss_parallel=False, overrides=None,
                  ep_compute=None, freeze=None, allow_uncovered=False, packed_fused=False):
    o = {}
    m = _mesh(mesh, ep_axis)
    if m is not None:
        o["mesh"] = m
    if ep is not None:
        o["ep"] = int(ep)
    if ep_axis:
        o["ep_axis"] = True
    if sequence_parallel is not None:
        o["sequence_parallel"] = bool(sequence_parallel)
    if loss_parallel:
        o["loss_parallel"] = True
    if overrides is not None:
        if isinstance(overrides, dict):
            o["overrides_text"] = _json.dumps(overrides)  # JSON is YAML
        elif isinstance(overrides, str) and "\n" in overrides:
            o["overrides_text"] = overrides
        else:
            o["overrides"] = str(overrides)
    if ep_compute is not None:
        o["ep_compute"] = ep_compute
    if freeze:
        o["freeze"] = [freeze] if isinstance(freeze, str) else list(freeze)
    if allow_uncovered:
        o["allow_uncovered"] = True
    if packed_fused:
        o["packed_fused"] = True
    return o


class Plan:
    """A derived sharding plan. `json` is the exact text `hyperpar plan --format json` writes for the same model and
    options; `data` is it parsed (docs/plan-format.md)."""

    def __init__(self, text, request=None):
        self.json = text
        self.data = _json.loads(text)
        self._request = request

    @classmethod
    def from_json(cls, text):
        return cls(text if isinstance(text, str) else _json.dumps(text))

    @property
    def mesh(self):
        return self.data["mesh"]

    @property
    def boundaries(self):
        return self.data["boundaries"]

    @property
    def placements(self):
        """Every declared parameter's full FQN -> {axis: placement} (an axis left out is Replicate)."""
        out = {}
        for b in self.data["boundaries"]:
            for rel, pl in b["params"].items():
                out[(b["fqn"] + "." if b["fqn"] else "") + rel] = dict(pl)
        return out

    def boundary(self, fqn):
        for b in self.data["boundaries"]:
            if b["fqn"] == fqn:
                return b
        raise KeyError(fqn)

    def _again(self, **extra):
        if self._request is None:
            raise Error("hyperpar: this plan was read from JSON; explain and to_hf need the plan made by hp.plan()")
        req = dict(self._request)
        req.update(extra)
        return _call(req)

    def explain(self, name=None):
        """The `--format explain` report; name: one boundary, module or parameter (as --fqn)."""
        return self._again(format="explain", fqn=name)

    def to_hf(self, target=None):
        """A transformers tp_plan/ep_plan for `DistributedConfig` (`--format hf --hf-version`): target is the
        transformers version the plan is for (default: the installed one, else the newest style names)."""
        if target is None:
            try:
                import transformers
                target = transformers.__version__
            except ImportError:
                target = None
        return _json.loads(self._again(format="hf", hf_version=target))

    def to_torch(self, device_mesh):
        """The torch.distributed.tensor.parallel styles of this plan, {module FQN: ParallelStyle}, for users who
        call parallelize_module themselves."""
        from .torch import plan_styles
        return plan_styles(self, device_mesh)

    def __repr__(self):
        dims = ",".join("%s=%d" % (d["name"], d["size"]) for d in self.mesh["dims"])
        return "<hyperpar.Plan %s mesh %s, %d boundaries>" % (
            (self.data.get("model") or {}).get("model_type", "?"), dims, len(self.boundaries))


def plan(model, mesh=None, **options):
    """Derives the plan for model (a path, a config dict or a transformers model) on mesh; options as the CLI's
    plan flags: ep, ep_axis, sequence_parallel, loss_parallel, overrides (path, YAML text or dict), ep_compute,
    freeze, allow_uncovered, packed_fused."""
    req = {"command": "plan", "model": model_source(model), "options": _plan_options(mesh, **options)}
    return Plan(_call(dict(req, format="json")), req)


_PLAN_KEYS = ("ep", "ep_axis", "sequence_parallel", "loss_parallel", "overrides", "ep_compute", "freeze",
              "allow_uncovered", "packed_fused")


def _split(options):
    """Plan options (as hp.plan takes them) apart from the cost settings (the CLI's cost flags: mode, seq, batch,
    micro_batch, global_batch, context, hardware, recompute, mem_per_rank, mem_reserve, zero, ...)."""
    po = {k: options.pop(k) for k in list(options) if k in _PLAN_KEYS}
    settings = {k.replace("_", "-"): v for k, v in options.items()}
    return po, settings


def cost(model, mesh=None, rank=None, **options):
    """`hyperpar cost --format json` as a dict: every rank's memory, FLOPs, collectives and time for the plan of
    model on mesh. Settings as the CLI's flags with _ for -: mode="train", seq=4096, batch=8, micro_batch=1,
    hardware="H100", mem_per_rank="80GB", recompute="selective", zero=1, ...; plan options as hp.plan's.
    rank: whose events are listed (default: the most-loaded rank)."""
    return _json.loads(_call(_cost_request(model, mesh, rank, **options)))


def _cost_request(model, mesh=None, rank=None, **options):
    po, settings = _split(options)
    req = {"command": "cost", "model": model_source(model), "options": _plan_options(mesh, **po), "cost": settings}
    if rank is not None:
        req["rank"] = int(rank)
    return req


def advise(model, world, prefer=None, max_pp=None, **options):
    """`hyperpar advise --format json` as a dict: every mesh of `world` ranks, the ones that fit first, best first.
    max_pp caps the pipeline stages a candidate may have (advise's --max-pp; None: any, 1: no pipeline).
    Needs a budget: mem_per_rank="80GB" or a GPU hardware="H100". When none fits, hyperpar.Error is raised with the
    CLI's message, and its .report holds the advice (the binding constraint and the nearest changes)."""
    return _json.loads(_call(_advise_request(model, world, prefer, max_pp, **options)))


def _advise_request(model, world, prefer=None, max_pp=None, **options):
    po, settings = _split(options)
    req = {"command": "advise", "model": model_source(model), "world": int(world),
           "options": _plan_options(None, **po), "cost": settings}
    if prefer is not None:
        req["prefer"] = prefer
    if max_pp is not None:
        req["max_pp"] = max_pp
    return req


def inspect(model, tensors=False):
    """`hyperpar inspect --json` as a dict (tensors=True: every tensor, as --tensors)."""
    return _json.loads(_call({"command": "inspect", "model": model_source(model), "tensors": bool(tensors)}))

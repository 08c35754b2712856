"""Plan placements (docs/plan-format.md, "Placement grammar") as torch.distributed.tensor placements.

A plan writes a placement map {axis: "R" | "P" | "S(d)" | "S(d)x2"} per parameter and per boundary input and
output. hyperpar.torch runs tensor parallelism on the 1-D tp sub-mesh, so only the tp entry becomes a torch
placement: Replicate(), Partial() (sum) or Shard(d). A missing tp key is Replicate. "S(d)x2" (a packed fused
gate/up weight) has no torch counterpart here and is refused by the caller, as is any string the grammar does not
have.
"""
import re

from torch.distributed.tensor import Partial, Replicate, Shard

_SHARD = re.compile(r"^S\((-?[0-9]+)\)$")


class Unmappable(ValueError):
    """A placement string torch cannot express; the caller names the boundary and the parameter or input."""


def parse(text):
    """One placement string -> Replicate(), Partial() or Shard(d) (d as written, possibly negative)."""
    if not isinstance(text, str):
        raise Unmappable("placement %r is not a string" % (text,))
    if text == "R":
        return Replicate()
    if text == "P":
        return Partial()
    m = _SHARD.match(text)
    if m:
        return Shard(int(m.group(1)))
    if re.match(r"^S\(-?[0-9]+\)x2$", text):
        raise Unmappable("placement %r is a packed fused shard (--packed-fused), which hyperpar.torch does not "
                         "map to a torch style" % text)
    raise Unmappable("placement %r is not one of R, P, S(d), S(d)x2" % text)


def tp_of(pmap, axes=("tp",)):
    """The tp placement of a placement map (Replicate when tp is absent). Keys other than `axes` are refused:
    cp never reaches here (cp > 1 is refused first), ep only on expert-parallel boundaries (handled by ep.py) and,
    as "R", on the explicit ep axis, over which everything outside the experts is replicated (data parallel)."""
    if pmap is None:
        return Replicate()
    if not isinstance(pmap, dict):
        raise Unmappable("placement map %r is not an object" % (pmap,))
    for k in pmap:
        if k == "ep" and pmap[k] == "R":
            continue
        if k not in axes:
            raise Unmappable("placement map %s has axis %r, which hyperpar.torch's tensor parallelism does not "
                             "handle here" % (_show(pmap), k))
    return parse(pmap.get("tp", "R"))


def norm(p, ndim):
    """Shard(d) with d made non-negative for a tensor of ndim dims (Shard(-1) of a 3-D tensor is Shard(2));
    other placements as they are."""
    if isinstance(p, Shard) and p.dim < 0:
        return Shard(p.dim + ndim)
    return p


def same(a, b, ndim):
    """Placement equality as a plan means it: Shard dims compared after normalising, any sum Partial (torch's
    embedding gives MaskPartial, a Partial subclass) equal to P."""
    a, b = norm(a, ndim), norm(b, ndim)
    if isinstance(a, Partial) and isinstance(b, Partial):
        return a.reduce_op == b.reduce_op
    return a == b


def show(p):
    """A torch placement back in the plan's grammar, for messages."""
    if isinstance(p, Shard):
        return "S(%d)" % p.dim
    if isinstance(p, Partial):
        return "P"
    if isinstance(p, Replicate):
        return "R"
    return str(p)


def _show(pmap):
    return "{" + ", ".join("%s: %s" % (k, v) for k, v in pmap.items()) + "}"

"""hyperpar.torch.parallelize on the MoE families, against the unsharded model, under torchrun (CPU, gloo, float64).

    torchrun --standalone --nproc_per_node N tests/python/torch_moe_parallel.py HYPERPAR_BIN CASE...

CASE is MESH or MESH:FAMILY[,FAMILY...] (default: the six MoE families mixtral, qwen2_moe, qwen3_moe, deepseek_v3,
glm4_moe, gpt_oss), or `refuse`. MESH (the plan options hp.plan gets; the device mesh's dims in brackets):

    tp2-ep2        [tp=2]        ep=2: TP-extend-EP, sequence parallelism on            2 processes
    tp2-ep2-nosp   [tp=2]        ep=2, sequence_parallel=False                          2 processes
    tp2-ep2-lp     [tp=2]        ep=2, loss_parallel=True (loss under loss_parallel)    2 processes
    dp2-ep2        [dp=2]        ep=2: TP-extend-EP over the two dp ranks (tp=1)        2 processes
    ep2            [ep=2]        the explicit ep axis (dp=1): each rank its own rows    2 processes
    dp2-tp2-ep2    [dp=2, tp=2]  ep=2: the EP groups are the tp pairs                   4 processes
    dp2-ep2-axis   [dp=2, ep=2]  the explicit ep axis: the batch split over dp x ep     4 processes

A MESH may end in `+plan` (the plan made first with hyperpar.plan(model, mesh=...) on the live module and passed
to parallelize; otherwise parallelize(model, mesh, **options) derives it itself, plan=None), in `+bmm`
(transformers' batched_mm experts instead of eager) and in `+accum` (each rank's rows as two micro-batches, each
loss halved, the gradients accumulated over the two backwards).

Each model case: a tiny random model of tests/data/forward/<family>/config.json (the same seed on every rank; every
parameter drawn at 0.15 scale, norms around 1, DeepSeek/GLM's correction bias too), deep-copied and parallelized;
each rank feeds its rows of a 4 x 8 batch (the batch split: dp, or dp x ep on the ep axis); logits, loss and every
parameter's gradient (DTensor.full_tensor(), expert slices all-gathered over the EP group) are compared with the
unsharded model on the whole batch, then two AdamW steps on both and every parameter compared, and the logits and
loss of the third forward (the copy's AdamW over hyperpar.torch.param_groups with foreach=True). Bar: 1e-10
absolute, except DeepSeek-V3's and GLM-4.5's router weight, which transformers computes in float32 whatever the
model's dtype: its gradient is compared relatively at 1e-6, its value after a step absolutely at 1e-6, and the copy
then takes the reference's value so that the next step compares everything else from the same point (as
tests/python/torch_ep.py does).

Exit 0 on success, 1 on a failure, 77 when torch or transformers cannot be imported (unless HP_REQUIRE_TORCH=1).
"""
import copy
import json
import os
import sys

import hp_torchtest as tt
from hp_torchtest import Failure, allmax, ce, check, full, say

tt.need("torch_moe_parallel")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

import hyperpar  # noqa: E402
import hyperpar.torch as hpt  # noqa: E402
from hyperpar import Error  # noqa: E402

TOL = 1e-10
TOL32 = 1e-6
MOE = ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss"]
BATCH, SEQ = 4, 8

# mesh case -> (device mesh dims, sizes, plan options)
MESHES = {
    "tp2-ep2": (("tp",), (2,), {"ep": 2}),
    "tp2-ep2-nosp": (("tp",), (2,), {"ep": 2, "sequence_parallel": False}),
    "tp2-ep2-lp": (("tp",), (2,), {"ep": 2, "loss_parallel": True}),
    "dp2-ep2": (("dp",), (2,), {"ep": 2}),
    "ep2": (("ep",), (2,), {}),
    "dp2-tp2-ep2": (("dp", "tp"), (2, 2), {"ep": 2}),
    "dp2-ep2-axis": (("dp", "ep"), (2, 2), {}),
}


def make_model(family, impl="eager", seed=0):
    """The family's tiny model (sdpa attention, eager for gpt-oss which has none; the experts run by impl), every
    parameter drawn anew (hp_torchtest.redraw), in training mode."""
    m = tt.redraw(tt.tiny_model(os.path.join(tt.FORWARD, family), seed, "sdpa", impl), seed + 1234)
    m.train()
    return m


def gather_experts(t, info):
    """A parameter's (or gradient's) expert slice -> all E experts, gathered over the EP group."""
    parts = [torch.empty_like(t) for _ in range(info.ep_size)]
    dist.all_gather(parts, t.contiguous(), group=info.group)
    order = sorted(info.group_ranks)  # all_gather's order: the group's ranks ascending
    return torch.cat([parts[order.index(r)] for r in info.group_ranks], 0)


def whole(p, t):
    """The whole tensor t (p's value or gradient) as the unsharded model holds it."""
    info = getattr(p, "_hp_ep", None)
    if info is not None:
        return gather_experts(t, info)
    return full(t)


maxdiff = tt.max_abs_diff


def parse(case):
    spec, _, fams = case.partition(":")
    parts = spec.split("+")
    mesh = parts[0]
    if mesh not in MESHES:
        raise SystemExit("torch_moe_parallel: unknown mesh %r" % mesh)
    extra = set(parts[1:])
    bad = extra - {"plan", "bmm", "accum"}
    if bad:
        raise SystemExit("torch_moe_parallel: unknown modifier(s) %s" % sorted(bad))
    return mesh, extra, (fams.split(",") if fams else MOE)


def run_model_case(mesh_name, extra, family):
    names, sizes, options = MESHES[mesh_name]
    world = 1
    for s in sizes:
        world *= s
    check(dist.get_world_size() == world, "%s needs %d processes, torchrun gave %d"
          % (mesh_name, world, dist.get_world_size()))
    mesh = init_device_mesh("cpu", sizes, mesh_dim_names=names)
    coord = dict(zip(names, mesh.get_coordinate()))
    lp = bool(options.get("loss_parallel"))
    impl = "batched_mm" if "bmm" in extra else "eager"
    ref = make_model(family, impl)
    par = copy.deepcopy(ref)
    if "plan" in extra:
        opts = dict(options)
        if "ep" in names:
            opts["ep_axis"] = True
        plan = hyperpar.plan(par, mesh=mesh, **opts)
        hpt.parallelize(par, mesh, plan)
    else:
        plan = None
        hpt.parallelize(par, mesh, **options)

    # the rows of this rank: dp, times the ep coordinate on the explicit ep axis (hp_mesh_batch_index)
    nblk, blk = 1, 0
    for ax in ("dp", "ep"):
        if ax in coord:
            nblk, blk = nblk * mesh.size(names.index(ax)), blk * mesh.size(names.index(ax)) + coord[ax]
    rows = slice(blk * BATCH // nblk, (blk + 1) * BATCH // nblk)

    rp, pp = dict(ref.named_parameters()), dict(par.named_parameters())
    check(sorted(rp) == sorted(pp), "parameter names differ after parallelize: %s" % sorted(set(rp) ^ set(pp)))
    n_ep = sum(getattr(p, "_hp_ep", None) is not None for p in pp.values())
    check(n_ep > 0, "no expert-parallel parameter after parallelize")
    if "tp" in names:
        n_dt = sum(isinstance(p, DTensor) for p in pp.values())
        check(n_dt > 0, "no DTensor parameter at tp=2")
    f32_router = {n + ".weight" for n, m in ref.named_modules() if hasattr(m, "e_score_correction_bias")}
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    # DTensor and plain parameters in separate groups, so that the foreach kernels (CUDA's default) run
    opt_par = torch.optim.AdamW(hpt.param_groups(par), lr=1e-2, weight_decay=0.1, foreach=True)
    d = {"logits": 0.0, "loss": 0.0, "grad": 0.0, "param": 0.0, "router32_grad_rel": 0.0, "router32_param": 0.0}
    gen = torch.Generator().manual_seed(77)
    vocab = ref.config.vocab_size
    for step in range(3):
        ids = torch.randint(0, vocab, (BATCH, SEQ), generator=gen)
        opt_ref.zero_grad(set_to_none=True)
        opt_par.zero_grad(set_to_none=True)
        logits_ref = ref(ids).logits
        loss_ref = ce(logits_ref, ids)
        loss_ref.backward()
        if lp:
            with hpt.loss_parallel():
                out = par(ids[rows]).logits
                check(isinstance(out, DTensor), "loss-parallel: the logits are not a DTensor")
                loss = ce(out, ids[rows])
                loss.backward()
            logits, loss = out.full_tensor().detach(), full(loss).detach()
        elif "accum" in extra:  # two micro-batches of the rank's rows, gradients accumulated
            mine = ids[rows]
            half = mine.shape[0] // 2
            outs, loss = [], 0.0
            for part in (mine[:half], mine[half:]):
                out = par(part).logits
                part_loss = ce(out, part) / 2
                part_loss.backward()
                outs.append(out.detach())
                loss = loss + part_loss.detach()
            logits = torch.cat(outs, 0)
        else:
            out = par(ids[rows]).logits
            check(not isinstance(out, DTensor), "the logits came back as a DTensor without loss-parallel")
            loss = ce(out, ids[rows])
            loss.backward()
            logits, loss = out.detach(), loss.detach()
        loss = loss.clone()
        dist.all_reduce(loss)  # every rank's mean over its rows; tp ranks hold the same value
        d["logits"] = max(d["logits"], allmax(maxdiff(logits, logits_ref[rows])))
        d["loss"] = max(d["loss"], allmax(abs(loss.item() / world - loss_ref.item())))
        if step == 2:
            break
        if step == 0:
            g, g32 = 0.0, 0.0
            for n, p in rp.items():
                q = pp[n]
                check(q.grad is not None, "%s: no gradient on the parallelized model" % n)
                want = p.grad if p.grad is not None else torch.zeros_like(p)
                diff = maxdiff(whole(q, q.grad), want)
                if n in f32_router:
                    g32 = max(g32, diff / max(want.abs().max().item(), 1e-300))
                else:
                    g = max(g, diff)
            d["grad"] = allmax(g)
            d["router32_grad_rel"] = allmax(g32)
        opt_ref.step()
        opt_par.step()
        pd, pd32 = 0.0, 0.0
        for n, p in rp.items():
            q = pp[n]
            diff = maxdiff(whole(q, q.detach()), p)
            if n in f32_router:
                pd32 = max(pd32, diff)
                with torch.no_grad():  # the next step starts from the reference's router (float32 rounding)
                    q.copy_(p.detach())
            else:
                pd = max(pd, diff)
        d["param"] = max(d["param"], allmax(pd))
        d["router32_param"] = max(d["router32_param"], allmax(pd32))
    for k in ("logits", "loss", "grad", "param"):
        check(d[k] <= TOL, "%s differs by %.3g (bar %.0e)" % (k, d[k], TOL))
    for k in ("router32_grad_rel", "router32_param"):
        check(d[k] <= TOL32, "float32 router: %s %.3g (bar %.0e)" % (k, d[k], TOL32))
    return ("max|diff| logits %.2e  loss %.2e  grads %.2e  params after 2 AdamW steps %.2e%s"
            % (d["logits"], d["loss"], d["grad"], d["param"],
               "  (float32 router: grad %.1e rel, param %.1e)" % (d["router32_grad_rel"], d["router32_param"])
               if family in ("deepseek_v3", "glm4_moe") else ""))


# ---- refusals ----------------------------------------------------------------------------------------------------

def expect_error(fn, needles, what):
    try:
        fn()
    except Error as e:
        msg = str(e)
        for n in needles:
            check(n in msg, "%s: the error does not say %r: %s" % (what, n, msg))
        say("ok   refuse     %s: %s" % (what, msg))
        return
    raise Failure("%s: no hyperpar.Error" % what)


def snapshot(model):
    return ({n: p.detach().clone() for n, p in model.named_parameters()},
            {n: type(m) for n, m in model.named_modules()})


def unchanged(model, snap, what):
    params, classes = snap
    for n, p in model.named_parameters():
        check(not isinstance(p, DTensor), "%s: parameter %s became a DTensor" % (what, n))
        check(getattr(p, "_hp_ep", None) is None, "%s: parameter %s became an expert slice" % (what, n))
        check(torch.equal(p.detach(), params[n]), "%s: parameter %s changed" % (what, n))
    check(sorted(n for n, _ in model.named_parameters()) == sorted(params), "%s: parameters added or removed" % what)
    check({n: type(m) for n, m in model.named_modules()} == classes, "%s: a module changed class" % what)
    for n, m in model.named_modules():
        check(not m._forward_pre_hooks and not m._forward_hooks, "%s: module '%s' got hooks" % (what, n))


def run_refuse():
    check(dist.get_world_size() == 2, "refuse runs on 2 processes")
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    # tp only (no ep): transformers 5's stacked experts would be cut over tp, which the planner does only as packed
    # halves (--packed-fused, S(d)x2) and hyperpar.torch does not map: refused naming the block, model unchanged
    m = make_model("qwen3_moe")
    snap = snapshot(m)
    expect_error(lambda: hpt.parallelize(m, mesh), ["fused gate/up", "--packed-fused"],
                 "qwen3_moe tp=2 without ep (the planner)")
    plan = hyperpar.plan(m, mesh=mesh, packed_fused=True)
    expect_error(lambda: hpt.parallelize(m, mesh, plan), ["model.layers.0.mlp", "S(1)x2",
                                                          "without expert parallelism"], "qwen3_moe tp=2 packed_fused")
    unchanged(m, snap, "qwen3_moe tp only")
    # gpt-oss's gate_up_proj interleaves gate and up columns, so the planner cuts it over tp without packing;
    # hyperpar.torch still has no style for the stacked experts and the router without ep
    m = make_model("gpt_oss")
    snap = snapshot(m)
    expect_error(lambda: hpt.parallelize(m, mesh), ["model.layers.0.mlp", "without expert parallelism"],
                 "gpt_oss tp=2 without ep")
    unchanged(m, snap, "gpt_oss tp only")
    # an expert-parallel block with a nested boundary hyperpar.torch does not apply, and a router cut over tp:
    # refused before anything changes (ep.py's check runs for every block first, then nothing is applied)
    m = make_model("deepseek_v3")
    snap = snapshot(m)
    base = hyperpar.plan(m, mesh=mesh, ep=2)

    def edited(fn):
        data = json.loads(base.json)
        fn({b["fqn"]: b for b in data["boundaries"]}, data)
        return hyperpar.Plan.from_json(json.dumps(data))

    def nested_norm(b, d):
        b["model.layers.2.mlp.shared_experts"]["type"] = "norm"
    expect_error(lambda: hpt.parallelize(m, mesh, edited(nested_norm)),
                 ["model.layers.2.mlp.shared_experts", "nested in the expert-parallel block"], "nested norm")
    unchanged(m, snap, "nested norm")

    def router_tp(b, d):
        b["model.layers.2.mlp"]["params"]["gate.weight"] = {"tp": "S(0)"}
    expect_error(lambda: hpt.parallelize(m, mesh, edited(router_tp)), ["model.layers.2.mlp", "gate.weight"],
                 "router cut over tp (ep.py's check, before the first block is applied)")
    unchanged(m, snap, "router cut over tp")

    def shared_out(b, d):
        b["model.layers.1.mlp.shared_experts"]["out_dst"] = {"output": {"tp": "R"}}
    expect_error(lambda: hpt.parallelize(m, mesh, edited(shared_out)),
                 ["model.layers.1.mlp.shared_experts", "out_dst"], "shared expert leaving in another layout")
    unchanged(m, snap, "shared expert layout")
    # a device mesh without the ep axis the plan has
    m = make_model("qwen3_moe")
    snap = snapshot(m)
    axis_plan = hyperpar.plan(m, mesh={"dp": 1, "ep": 2}, ep_axis=True)
    dp_mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    expect_error(lambda: hpt.parallelize(m, dp_mesh, axis_plan), ["device mesh"], "ep-axis plan on a dp mesh")
    unchanged(m, snap, "ep-axis plan on a dp mesh")
    # plan_styles has no style for an expert-parallel block
    expect_error(lambda: hpt.plan_styles(hyperpar.plan(m, mesh=mesh, ep=2), mesh), ["expert-parallel"],
                 "plan_styles with EP")


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    tt.start()
    cases = []
    for case in sys.argv[2:]:
        if case == "refuse":
            cases.append((case, run_refuse))
            continue
        mesh_name, extra, fams = parse(case)
        label = mesh_name + "".join("+" + e for e in sorted(extra))
        cases += [("%s %s" % (label, fam), lambda m=mesh_name, e=extra, f=fam: run_model_case(m, e, f))
                  for fam in fams]
    return tt.run_cases("torch_moe_parallel", cases)


if __name__ == "__main__":
    tt.end(main())

#!/usr/bin/env python3
"""hyperpar.torch.ep against the unsharded model: six MoE families, CPU, gloo, float64.

    torchrun --standalone --nproc_per_node N tests/python/torch_ep.py HYPERPAR_BINARY CASE

CASE np2 (2 processes) or np4 (4 processes) picks the meshes below. For each family a tiny random model is built
from tests/data/forward/<family>/config.json (the same seed on every rank), its plan comes from the CLI
(get_plan), the copy gets apply_expert_parallel on every moe_mlp boundary, each rank takes its rows, and the
copy's logits, loss, every gradient, and the parameters after two AdamW steps are compared with the original's
(max |difference| <= 1e-10).

The dense region is not sharded here (that is hyperpar.torch.parallelize's part): data parallelism is done by
hand (each rank its rows, gradients averaged), and the tp and cp axes of a plan are emulated by running the
dense region replicated on their ranks, which gives an MoE block the input TP and CP give it: the same rows on
every tp rank without sequence parallelism, and with SP (or CP) each rank's sequence block (a forward pre-hook
slices it, a forward hook all-gathers the output back, each with its dual in the backward, as SP's transitions
are).

Exit 0: all passed; 1: a failure (the message says which); 77: torch or transformers cannot be imported (or
torchrun gave fewer processes than the case needs), unless HP_REQUIRE_TORCH=1.
"""
import copy
import itertools
import os
import subprocess
import sys

import hp_torchtest as tt
from hp_torchtest import Failure, allmax

TOL = 1e-10
TOL32 = 1e-6  # float32 routers (DeepSeek-V3, GLM-4.5): relative gradient, absolute parameter difference
FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss"]
BATCH, SEQ = 4, 8

# (label, plan flags, the experts implementation transformers dispatches to: the block's own local compute;
# grouped_mm takes no float64 on CPU)
MESHES = {
    "np2": [
        ("ep-axis dp=1,ep=2", dict(mesh="dp=1,ep=2", ep_axis=True), "eager"),
        ("ep-axis dp=1,ep=2", dict(mesh="dp=1,ep=2", ep_axis=True), "batched_mm"),
        ("tp-extend-ep dp=2,ep=2", dict(dp=2, ep=2), "eager"),
        ("tp-extend-ep tp=2,ep=2 SP", dict(tp=2, ep=2), "eager"),
        ("tp-extend-ep tp=2,ep=2 no SP", dict(tp=2, ep=2, no_sequence_parallel=True), "eager"),
        ("tp-extend-ep cp=2,ep=2", dict(cp=2, ep=2), "eager"),
        # 21 rows over 2 tp copies: chunks of 10 and 11
        ("tp-extend-ep tp=2,ep=2 no SP, batch 3x7", dict(tp=2, ep=2, no_sequence_parallel=True), "eager",
         dict(batch=3, seq=7)),
        # the plan of the per-expert hub checkpoint: ep_stack names, Mixtral's block_sparse_moe
        ("ep-axis dp=1,ep=2, plan of the checkpoint", dict(mesh="dp=1,ep=2", ep_axis=True, checkpoint=True), "eager"),
        # every token to EP index 0's experts: rank 1 receives no row, its experts get zero gradients
        ("ep-axis dp=1,ep=2, all to EP index 0", dict(mesh="dp=1,ep=2", ep_axis=True), "eager", dict(skew=True)),
    ],
    "np4": [
        ("ep-axis dp=2,ep=2", dict(mesh="dp=2,ep=2", ep_axis=True), "eager"),
        ("tp-extend-ep dp=2,tp=2,ep=2 SP", dict(dp=2, tp=2, ep=2), "batched_mm"),
        ("tp-extend-ep dp=2,tp=2,ep=2 no SP", dict(dp=2, tp=2, ep=2, no_sequence_parallel=True), "eager"),
        ("tp-extend-ep dp=2,tp=2,ep=4 SP", dict(dp=2, tp=2, ep=4), "eager"),
        ("tp-extend-ep tp=4,ep=2 SP", dict(tp=4, ep=2), "eager"),
        ("tp-extend-ep cp=2,tp=2,ep=2 SP", dict(cp=2, tp=2, ep=2), "eager"),
        ("ep-axis cp=2,ep=2", dict(mesh="cp=2,ep=2", ep_axis=True), "eager"),
    ],
}


tt.need("torch_ep")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import hyperpar  # noqa: E402
from hyperpar._native import Error  # noqa: E402
from hyperpar.torch.ep import apply_expert_parallel, check_expert_parallel  # noqa: E402

if len(sys.argv) != 3 or sys.argv[2] not in MESHES:
    print("usage: torchrun --standalone --nproc_per_node N %s HYPERPAR_BINARY np2|np4" % sys.argv[0])
    sys.exit(2)
BIN, CASE = sys.argv[1], sys.argv[2]
if "RANK" not in os.environ:
    print("%s runs under torchrun: torchrun --standalone --nproc_per_node %s %s %s %s"
          % (sys.argv[0], CASE[2:], sys.argv[0], BIN, CASE))
    sys.exit(2)


def get_plan(folder, checkpoint=False, **flags):
    """`hyperpar plan` of a forward/ folder's config.json with transformers' batched expert names, as a
    hyperpar.Plan. flags are the CLI's plan flags (dp=2 -> --dp 2, ep_axis=True -> --ep-axis).

    The folder's checkpoint is per-expert with hub names (Mixtral's block_sparse_moe.experts.N.w1); the live
    transformers 5 model holds model.layers.N.mlp.experts.gate_up_proj, which is what meta mode with
    --expert-layout batched names. checkpoint=True plans the checkpoint itself (its stacked per-expert names and
    Mixtral's block_sparse_moe), which apply_expert_parallel maps onto the live model."""
    if checkpoint:
        args = [BIN, "plan", folder, "--format", "json"]
    else:
        args = [BIN, "plan", os.path.join(folder, "config.json"), "--expert-layout", "batched", "--format", "json"]
    for k, v in flags.items():
        opt = "--" + k.replace("_", "-")
        if v is True:
            args.append(opt)
        elif v not in (False, None):
            args += [opt, str(v)]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr.strip()))
    return hyperpar.Plan.from_json(r.stdout)


causal_lm_loss = tt.ce


def build_model(folder, experts_impl="eager", skew=False):
    """The family's tiny model (eager attention, the experts run by experts_impl), every parameter drawn anew
    (hp_torchtest.redraw), in training mode. skew: every token routed to the first half of the experts (a
    selection-only correction bias, or gpt-oss's router bias); None when the family has neither."""
    m = tt.redraw(tt.tiny_model(folder, 0, "eager", experts_impl), 1234)
    with torch.no_grad():
        skewed = False
        for n, b in m.named_buffers():
            if n.endswith("e_score_correction_bias"):
                skewed = True
                if skew:  # selection only: the first half of the experts wins
                    b[: b.shape[0] // 2] += 10
        for n, mod in m.named_modules():
            if skew and n.endswith("mlp.router") and getattr(mod, "bias", None) is not None:
                mod.bias[: mod.bias.shape[0] // 2] += 10  # gpt-oss: the router's bias
                skewed = True
    if skew and not skewed:
        return None
    m.train()
    return m


# --- the test's own SP transitions (what TP's sequence parallelism does around the block) ---------------------

def _seq_gather(x, group, n):
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, 1)


class SeqSlice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, n, i):
        ctx.g = (group, n)
        s = x.shape[1] // n
        return x[:, i * s:(i + 1) * s].clone()

    @staticmethod
    def backward(ctx, g):
        return _seq_gather(g, *ctx.g), None, None, None


class SeqGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, n, i):
        ctx.a = (n, i)
        return _seq_gather(x, group, n)

    @staticmethod
    def backward(ctx, g):
        n, i = ctx.a
        s = g.shape[1] // n
        return g[:, i * s:(i + 1) * s].contiguous(), None, None, None


def add_sp(block, group, n, i):
    def pre(mod, args, kwargs):
        return (SeqSlice.apply(args[0], group, n, i),) + tuple(args[1:]), kwargs

    def post(mod, args, kwargs, out):
        if isinstance(out, tuple):
            return (SeqGather.apply(out[0], group, n, i),) + tuple(out[1:])
        return SeqGather.apply(out, group, n, i)

    block.register_forward_pre_hook(pre, with_kwargs=True)
    block.register_forward_hook(post, with_kwargs=True)


# --- comparison ---------------------------------------------------------------------------------------------

def run_case(family, label, flags, impl, opts, world, rank):
    folder = os.path.join(tt.FORWARD, family)
    B, S = opts.get("batch", BATCH), opts.get("seq", SEQ)
    ref = build_model(folder, impl, opts.get("skew", False))
    if ref is None:
        return None  # no router bias to skew
    plan = get_plan(folder, **flags)
    dims = [(d["name"], d["size"]) for d in plan.mesh["dims"]]
    mode = plan.mesh["ep_mode"]
    P = plan.mesh["ep"]
    if plan.mesh["world"] != world:
        raise Failure("the plan's world %d is not the %d processes" % (plan.mesh["world"], world))
    dm = init_device_mesh("cpu", tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))
    coord = dict(zip([n for n, _ in dims], dm.get_coordinate()))
    sizes = dict(dims)

    shard = copy.deepcopy(ref)
    bnds = [b for b in plan.boundaries if b["type"] == "moe_mlp"]
    if not bnds:
        raise Failure("the plan has no moe_mlp boundary")
    for b in bnds:
        check_expert_parallel(shard, b, plan, dm)
    infos = [apply_expert_parallel(shard, b, plan, dm) for b in bnds]

    # The groups are hyperpar's: tp-extend-ep flat blocks of P consecutive ranks (init_device_mesh lays the
    # ranks out row-major, as hyperpar numbers them), ep-axis the ranks differing only in the ep coordinate.
    for info in infos:
        if mode == "tp-extend-ep":
            want = tuple(range(rank // P * P, rank // P * P + P))
        else:
            want = tuple(rank - coord["ep"] + i for i in range(P))
        if info.group_ranks != want or info.ep_index != want.index(rank):
            raise Failure("%s: EP group %s index %d, expected %s index %d" % (
                info.boundary, info.group_ranks, info.ep_index, want, want.index(rank)))
        E = info.n_experts
        if (info.first_expert, info.n_local) != (E * info.ep_index // P, E // P):
            raise Failure("%s: experts [%d, +%d) on EP index %d of %d" % (
                info.boundary, info.first_expert, info.n_local, info.ep_index, P))

    # The axes whose ranks route rows of their own inside one batch block (SP's tp, cp): the test slices the
    # sequence over them around each block (cp-major, as hyperpar nests them); the block's replicated tensors'
    # gradients are then partial sums over them.
    in_pm = next(iter(bnds[0]["in_dst"].values()))
    split = [a for a in ("cp", "tp") if sizes.get(a, 1) > 1 and in_pm.get(a, "R") != "R"]
    split_group = None
    if split:
        names = [n for n, _ in dims]
        sax = [names.index(a) for a in split]
        mine = tuple(c for j, c in enumerate(dm.get_coordinate()) if j not in sax)
        sets = {}
        for c in itertools.product(*[range(sz) for _, sz in dims]):
            key = tuple(v for j, v in enumerate(c) if j not in sax)
            sets.setdefault(key, []).append(int(dm.mesh[c]))
        for key, members in sets.items():  # every rank makes every group, in one order
            g = dist.new_group(members)
            if key == mine:
                split_group, members_me = g, members
        if members_me != sorted(members_me):
            raise Failure("the test's SP group %s is not in rank order" % members_me)
        for info in infos:
            add_sp(shard.get_submodule(info.module_fqn), split_group, len(members_me), members_me.index(rank))
    block_prefixes = tuple(info.module_fqn + "." for info in infos)

    # The rows of this rank: hp_mesh_batch_index (dp x an explicit ep axis, else dp).
    nblk = sizes.get("dp", 1) * (P if mode == "ep-axis" else 1)
    blk = coord.get("dp", 0) * (P if mode == "ep-axis" else 1) + (coord["ep"] if mode == "ep-axis" else 0)
    lo, hi = blk * B // nblk, (blk + 1) * B // nblk

    vocab = ref.config.vocab_size
    gen = torch.Generator().manual_seed(77)
    batches = [torch.randint(0, vocab, (B, S), generator=gen) for _ in range(2)]
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    sopt = torch.optim.AdamW(shard.parameters(), lr=1e-2, weight_decay=0.1)
    # DeepSeek-V3's and GLM-4.5's routers compute in float32 whatever the model's dtype (hf_reference §3.4):
    # their weight's gradient carries float32 rounding in the reference itself, so it is compared relatively at
    # float32's precision (TOL32), apart from the float64 tensors; after each AdamW step the copy takes the
    # reference's value of it, so that step 2 compares everything else from the same point at TOL.
    f32_router = {n + ".weight" for n, m in ref.named_modules() if hasattr(m, "e_score_correction_bias")}
    sparams = dict(shard.named_parameters())
    rparams = dict(ref.named_parameters())
    if set(sparams) != set(rparams):
        raise Failure("the parameter names changed: %s" % sorted(set(sparams) ^ set(rparams)))
    res = {}
    for step, ids in enumerate(batches):
        ropt.zero_grad(set_to_none=True)
        sopt.zero_grad(set_to_none=True)
        rlogits = ref(input_ids=ids).logits
        rloss = causal_lm_loss(rlogits, ids)
        rloss.backward()
        slogits = shard(input_ids=ids[lo:hi]).logits
        sloss = causal_lm_loss(slogits, ids[lo:hi])
        sloss.backward()
        if opts.get("skew"):
            for info in infos:
                if info.ep_index != 0 and info.last_rows[1] != 0:
                    raise Failure("%s: EP index %d received %d rows; the skewed router sends every token to EP "
                                  "index 0" % (info.boundary, info.ep_index, info.last_rows[1]))
        dlog = tt.max_abs_diff(slogits, rlogits[lo:hi])
        loss = sloss.detach().clone()
        dist.all_reduce(loss)
        dloss = abs(loss.item() / world - rloss.item())
        # Gradients as the data-parallel step would leave them: a replicated block tensor's gradient is a partial
        # sum over the tp ranks that split its rows (SP), every replicated tensor is averaged over the world (the
        # tp copies hold the same value), an expert slice over the ranks holding the same experts.
        dgrad, dexp, d32 = 0.0, 0.0, 0.0
        for n, p in sparams.items():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            r = rparams[n]
            rg = r.grad if r.grad is not None else torch.zeros_like(r)
            info = getattr(p, "_hp_ep", None)
            if info is not None:
                if info.grad_group is not None:
                    dist.all_reduce(p.grad, group=info.grad_group)
                    p.grad /= len(info.grad_ranks)
                f = info.first_expert
                dexp = max(dexp, tt.max_abs_diff(p.grad, rg[f:f + info.n_local]))
            else:
                if split and n.startswith(block_prefixes):
                    dist.all_reduce(p.grad, group=split_group)
                dist.all_reduce(p.grad)
                p.grad /= world
                d = tt.max_abs_diff(p.grad, rg)
                if n in f32_router:
                    d32 = max(d32, d / max(rg.abs().max().item(), 1e-300))
                else:
                    dgrad = max(dgrad, d)
        ropt.step()
        sopt.step()
        dpar, dpar32 = 0.0, 0.0
        for n, p in sparams.items():
            r = rparams[n].detach()
            info = getattr(p, "_hp_ep", None)
            if info is not None:
                r = r[info.first_expert:info.first_expert + info.n_local]
            d = tt.max_abs_diff(p, r)
            if n in f32_router:
                dpar32 = max(dpar32, d)
                with torch.no_grad():  # step 2 starts from the same router: its float32 rounding is not EP's
                    p.copy_(r)
            else:
                dpar = max(dpar, d)
        for k, v in (("logits", dlog), ("loss", dloss), ("grad", dgrad), ("expert_grad", dexp), ("param", dpar),
                     ("router32_grad_rel", d32), ("router32_param", dpar32)):
            key = "%s%d" % (k, step + 1)
            res[key] = allmax(v)
    return res


def check_refusals(rank):
    """check_expert_parallel refuses what it cannot express, naming the boundary, and changes nothing."""
    folder = os.path.join(tt.FORWARD, "deepseek_v3")
    plan = get_plan(folder, mesh="dp=1,ep=2", ep_axis=True)
    dims = [(d["name"], d["size"]) for d in plan.mesh["dims"]]
    dm = init_device_mesh("cpu", tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))
    model = build_model(folder)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    classes = {n: type(m) for n, m in model.named_modules()}
    moe = [b for b in plan.boundaries if b["type"] == "moe_mlp"][0]
    fqn = moe["fqn"]

    def data_with(f):
        d = copy.deepcopy(plan.data)
        f(d)
        return hyperpar.Plan.from_json(d)

    def bnd(d):
        return [b for b in d["boundaries"] if b["fqn"] == fqn][0]

    dense = dict(moe, fqn="model.layers.0.mlp")  # first_k_dense_replace: a dense MLP
    cases = [
        ("a boundary that is not moe_mlp", dict(moe, type="mlp"), plan, dm, "moe_mlp"),
        ("a dense layer", dense, plan, dm, "no experts module"),
        ("a missing module", dict(moe, fqn="model.layers.9.mlp"), plan, dm, "no module"),
        ("experts not divisible by ep", moe,
         data_with(lambda d: d["mesh"].update(ep=3)), dm, "do not split over ep=3"),
        ("experts cut over tp", dict(moe, params=dict(moe["params"], **{
            "experts.gate_up_proj": {"tp": "S(1)x2", "ep": "S(0)"}})), plan, dm, "cut over tp"),
        ("an expert tensor the module lacks", dict(moe, params=dict(moe["params"], **{
            "experts.w1": {"ep": "S(0)"}})), plan, dm, "does not hold"),
        ("a router cut over ep", dict(moe, params=dict(moe["params"], **{"gate.weight": {"ep": "S(0)"}})),
         plan, dm, "replicated"),
        ("a capacity factor", dict(moe, local_compute_fn={"_target_": "deepseekv3_sigmoid_group_shared",
                                                          "capacity_factor": 1.25}), plan, dm, "capacity_factor"),
        ("no expert parallelism in the plan", moe,
         data_with(lambda d: d["mesh"].update(ep_mode="none")), dm, "ep_mode"),
        ("a device mesh of other dims", moe, plan,
         init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)), "device mesh"),
    ]
    for what, b, p, mesh, needle in cases:
        try:
            check_expert_parallel(model, b, p, mesh)
        except Error as e:
            msg = str(e)
            if needle not in msg or b["fqn"] not in msg:
                raise Failure("refusal of %s: message lacks %r or the boundary: %s" % (what, needle, msg))
            if rank == 0:
                print("  refused %s: %s" % (what, msg), flush=True)
        else:
            raise Failure("check_expert_parallel accepted %s" % what)
    after = model.state_dict()
    if set(after) != set(before) or any(not torch.equal(after[k], before[k]) for k in before):
        raise Failure("a refused check changed the model's tensors")
    if {n: type(m) for n, m in model.named_modules()} != classes:
        raise Failure("a refused check changed the model's modules")
    apply_expert_parallel(model, moe, plan, dm)
    # A deep copy of an expert-parallel model shares its process groups and computes the same.
    twin = copy.deepcopy(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(5 + rank))
    with torch.no_grad():
        if not torch.equal(model(input_ids=ids).logits, twin(input_ids=ids).logits):
            raise Failure("a deep copy of the expert-parallel model computes other logits")
    try:
        check_expert_parallel(model, moe, plan, dm)
    except Error as e:
        if "already applied" not in str(e):
            raise Failure("the second application's refusal: %s" % e)
        if rank == 0:
            print("  refused a second application: %s" % e, flush=True)
    else:
        raise Failure("check_expert_parallel accepted a block already expert-parallel")


def model_case(fam, label, flags, impl, opts, world, rank):
    """One family at one mesh: run_case, then the bars; the line to report."""
    try:
        res = run_case(fam, label, flags, impl, opts, world, rank)
    except RuntimeError as e:
        if "hyperpar plan" in str(e) or "exit 2" in str(e):  # the planner refuses this mesh for fam
            raise tt.NotApplicable("the planner refuses: %s" % str(e).split(": ", 2)[-1])
        raise Failure(str(e))
    if res is None:
        raise tt.NotApplicable("no router bias or correction bias to skew")
    worst = max(v for k, v in res.items() if not k.startswith("router32"))
    worst32 = max(v for k, v in res.items() if k.startswith("router32"))
    line = ("logits %.1e loss %.1e grad %.1e expert grad %.1e | after 2 AdamW steps: params %.1e (step 2: logits %.1e "
            "loss %.1e grad %.1e expert grad %.1e)%s" % (
                res["logits1"], res["loss1"], res["grad1"], res["expert_grad1"], res["param2"], res["logits2"],
                res["loss2"], res["grad2"], res["expert_grad2"],
                "; float32 router: grad %.1e relative, params %.1e" % (
                    max(res["router32_grad_rel1"], res["router32_grad_rel2"]), res["router32_param2"])
                if worst32 else ""))
    tt.check(worst <= TOL and worst32 <= TOL32, "max diff %.3g (tolerance %g), float32 router %.3g (tolerance %g): %s"
             % (worst, TOL, worst32, TOL32, line))
    return line


def main():
    tt.start()
    world, rank = dist.get_world_size(), dist.get_rank()
    need = 2 if CASE == "np2" else 4
    if world != need:
        dist.destroy_process_group()
        tt.skip("torch_ep", "case %s needs %d processes, torchrun gave %d" % (CASE, need, world))
    cases = []
    if CASE == "np2":
        cases.append(("refusals (check_expert_parallel names the boundary, changes nothing)",
                      lambda: check_refusals(rank)))
    for entry in MESHES[CASE]:
        label, flags, impl = entry[:3]
        opts = entry[3] if len(entry) > 3 else {}
        label = "%s [%s]" % (label, impl)
        cases += [("%-12s %s" % (fam, label), lambda f=fam, la=label, fl=flags, i=impl, o=opts:
                   model_case(f, la, fl, i, o, world, rank)) for fam in FAMILIES]
    return tt.run_cases("torch_ep %s (tolerance %g)" % (CASE, TOL), cases)


if __name__ == "__main__":
    tt.end(main())

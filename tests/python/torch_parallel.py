"""hyperpar.torch.parallelize against the unsharded model, under torchrun (CPU, gloo, float64).

    torchrun --standalone --nproc_per_node N tests/python/torch_parallel.py HYPERPAR_BIN CASE...

CASE is MESH or MESH:FAMILY[,FAMILY...] (default families: llama, mistral, qwen2, qwen3), or `refuse`, or `comm`:

    tp2          tp=2, sequence parallelism on (the plan's default)             2 processes
    tp2-nosp     tp=2, --no-sequence-parallel                                   2 processes
    tp2-lp       tp=2, --loss-parallel (loss under torch's loss_parallel)       2 processes
    dp2-tp2      dp=2 x tp=2, each dp rank its half of the batch                4 processes
    dp2-tp2-lp   dp=2 x tp=2 with --loss-parallel                               4 processes
    refuse       refusals: bad placement / boundary type / packed shard (model unchanged), meshes that do not match
                 the plan, cp, the glue to ep.py, MoE blocks without ep        2 processes
    comm         CommDebugMode's collectives of one forward+backward of llama at tp=2 against `hyperpar cost`

Each model case: a tiny random model from tests/data/forward/<family>/config.json (same seed on every rank),
deep-copied and parallelized with the plan of the live module (parallelize(model, mesh, **options) derives it with
hyperpar.plan; the FAMILY_bias variants make it first with hyperpar.plan(model, mesh=mesh) and pass it); logits,
loss and every parameter's gradient (DTensor.full_tensor()) compared with the unsharded model on the whole batch,
then two AdamW steps on both and every parameter compared. Bar: 1e-10 absolute.

Exit 0 on success, 1 on a failure (the message says which case and what), 77 when torch or transformers cannot be
imported (unless HP_REQUIRE_TORCH=1, then 1).
"""
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

import hp_torchtest as tt
from hp_torchtest import Failure, ce, check, full, rank, say

tt.need("torch_parallel")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

import hyperpar  # noqa: E402
import hyperpar.torch as hpt  # noqa: E402
from hyperpar import Error, Plan  # noqa: E402

TOL = 1e-10
DENSE = ["llama", "mistral", "qwen2", "qwen3"]
BATCH, SEQ = 4, 12
HP_BIN = None
TMP = None


def get_plan(folder, **flags):
    """The CLI's plan of `folder` for the mesh flags (tp=2, dp=2, cp=2, ep=2, ep_axis=True, no_sequence_parallel=True,
    loss_parallel=True, expert_layout="batched"), wrapped: the refusals edit it, and `comm` compares it with
    `hyperpar cost`. The model cases plan the live module with hyperpar.plan (run_model_case)."""
    cmd = [HP_BIN, "plan", folder, "--format", "json"]
    for k, v in flags.items():
        opt = "--" + k.replace("_", "-")
        if v is True:
            cmd.append(opt)
        elif v is not False and v is not None:
            cmd += [opt, str(v)]
    return Plan.from_json(subprocess.check_output(cmd).decode())


def make_model(family, seed=1234):
    """A tiny random model of tests/data/forward/<family>/config.json, float64, the same on every rank. Biases and
    norm weights (which transformers initialises to 0 and 1) get random values too, so that a bias added twice or a
    norm weight taken from the wrong rank shows. FAMILY_bias: the family with attention_bias and mlp_bias on (the
    row-parallel o_proj/down_proj biases are then deferred, D-22), its config written to a folder of its own."""
    base = family[:-len("_bias")] if family.endswith("_bias") else family
    folder = os.path.join(tt.FORWARD, base)
    config = transformers.AutoConfig.from_pretrained(folder)
    if family.endswith("_bias"):
        config.attention_bias = True
        config.mlp_bias = True
        folder = os.path.join(TMP, family)
        os.makedirs(folder, exist_ok=True)
        config.to_json_file(os.path.join(folder, "config.json"))
        folder = os.path.join(folder, "config.json")
    # sdpa (gpt-oss, which only the refusals build, has no SDPA path: eager)
    return tt.perturb_vectors(tt.tiny_model(config, seed), seed + 1), folder


def batch_ids(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (BATCH, SEQ), generator=g)


def mesh_of(spec):
    """(device mesh, plan flags, dp size, loss_parallel) of a mesh case name."""
    lp = spec.endswith("-lp")
    base = spec[:-3] if lp else spec
    nosp = base.endswith("-nosp")
    base = base[:-5] if nosp else base
    dims = {"tp2": (("tp",), (2,)), "dp2-tp2": (("dp", "tp"), (2, 2))}.get(base)
    if dims is None:
        raise SystemExit("torch_parallel: unknown case %r" % spec)
    names, sizes = dims
    world = 1
    for s in sizes:
        world *= s
    if dist.get_world_size() != world:
        raise Failure("case %s needs %d processes, torchrun gave %d" % (spec, world, dist.get_world_size()))
    mesh = init_device_mesh("cpu", sizes, mesh_dim_names=names)
    flags = {n: s for n, s in zip(names, sizes)}
    if nosp:
        flags["no_sequence_parallel"] = True
    if lp:
        flags["loss_parallel"] = True
    return mesh, flags, flags.get("dp", 1), lp


def forward_loss(model, ids, lp):
    """Logits (whole) and loss of the parallelized model on ids, backward run; loss-parallel inside its context."""
    if lp:
        with hpt.loss_parallel():
            logits = model(ids).logits
            if not isinstance(logits, DTensor):
                raise Failure("loss-parallel: the logits are not a DTensor (%s)" % type(logits).__name__)
            loss = ce(logits, ids)
            loss.backward()
        return logits.full_tensor().detach(), full(loss).detach()
    logits = model(ids).logits
    if isinstance(logits, DTensor):
        raise Failure("without loss-parallel the logits should come back whole, got a DTensor %s"
                      % (logits.placements,))
    loss = ce(logits, ids)
    loss.backward()
    return logits.detach(), loss.detach()


maxdiff = tt.max_abs_diff


def run_model_case(spec, family):
    mesh, flags, dp, lp = mesh_of(spec)
    ref, folder = make_model(family)
    par = copy.deepcopy(ref)
    # the plan of the live module (hyperpar.plan reads its config and parameter names): derived by parallelize
    # itself (plan=None), or, for the _bias variants, made first with hyperpar.plan and passed in
    options = {}
    if flags.get("no_sequence_parallel"):
        options["sequence_parallel"] = False
    if flags.get("loss_parallel"):
        options["loss_parallel"] = True
    if family.endswith("_bias"):
        hpt.parallelize(par, mesh, hyperpar.plan(par, mesh=mesh, **options))
    else:
        hpt.parallelize(par, mesh, **options)
    dp_rank = mesh.get_local_rank("dp") if dp > 1 else 0
    rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt_par = torch.optim.AdamW(par.parameters(), lr=1e-2, weight_decay=0.1)
    d = {"logits": 0.0, "loss": 0.0, "grad": 0.0, "param": 0.0}
    ref_params = dict(ref.named_parameters())
    par_params = dict(par.named_parameters())
    check(sorted(ref_params) == sorted(par_params), "parameter names differ after parallelize")
    if family.endswith("_bias"):
        for i, layer in enumerate(par.model.layers):
            for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
                check(type(lin).__name__ == "_NoBiasLinear", "layer %d: a row-parallel bias is not deferred" % i)
    n_dtensor = sum(isinstance(p, DTensor) for p in par_params.values())
    check(n_dtensor == len(par_params), "%d of %d parameters are DTensors" % (n_dtensor, len(par_params)))
    for step in range(3):
        ids = batch_ids(ref.config.vocab_size, 100 + step)
        logits_ref = ref(ids).logits
        loss_ref = ce(logits_ref, ids)
        loss_ref.backward()
        logits_par, loss_par = forward_loss(par, ids[rows], lp)
        if dp > 1:  # each dp rank's loss is the mean over its rows; the batch's mean is their mean
            loss_par = loss_par.clone()
            dist.all_reduce(loss_par, group=mesh.get_group("dp"))
            loss_par /= dp
        if step == 0:
            d["logits"] = maxdiff(logits_par, logits_ref[rows])
            d["loss"] = abs(loss_par.item() - loss_ref.item())
            check(d["logits"] <= TOL, "logits differ by %.3g" % d["logits"])
            check(d["loss"] <= TOL, "loss differs by %.3g" % d["loss"])
            for name, p in ref_params.items():
                q = par_params[name]
                check(q.grad is not None, "%s: no gradient on the parallelized model" % name)
                d["grad"] = max(d["grad"], maxdiff(full(q.grad), p.grad))
                check(d["grad"] <= TOL, "%s: gradient differs by %.3g" % (name, d["grad"]))
        if step == 2:
            break
        opt_ref.step()
        opt_par.step()
        opt_ref.zero_grad()
        opt_par.zero_grad()
    for name, p in ref_params.items():
        d["param"] = max(d["param"], maxdiff(full(par_params[name].data if not isinstance(par_params[name], DTensor)
                                                  else par_params[name]), p))
    # the last forward ran after two AdamW steps: its logits must agree too
    d["logits"] = max(d["logits"], maxdiff(logits_par, logits_ref[rows]))
    d["loss"] = max(d["loss"], abs(loss_par.item() - loss_ref.item()))
    for k, v in d.items():
        check(v <= TOL, "%s differs by %.3g (bar %.0e)" % (k, v, TOL))
    return ("max|diff| logits %.2e  loss %.2e  grads %.2e  params after 2 AdamW steps %.2e (rank 0)"
            % (d["logits"], d["loss"], d["grad"], d["param"]))


# ---- refusals ----------------------------------------------------------------------------------------------------

def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def unchanged(model, snap, what):
    for n, p in model.named_parameters():
        check(not isinstance(p, DTensor), "%s: parameter %s became a DTensor: the model was changed" % (what, n))
        check(torch.equal(p.detach(), snap[n]), "%s: parameter %s changed" % (what, n))
    check(sorted(n for n, _ in model.named_parameters()) == sorted(snap), "%s: parameters added or removed" % what)
    for n, m in model.named_modules():
        check(not m._forward_pre_hooks and not m._forward_hooks, "%s: module '%s' got hooks" % (what, n))
    check(type(model.model.layers[0].self_attn.o_proj) is torch.nn.Linear, "%s: a Linear changed class" % what)


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


def run_refuse():
    check(dist.get_world_size() == 2, "refuse runs on 2 processes")
    model, folder = make_model("llama")
    snap = snapshot(model)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    base = get_plan(folder, tp=2)

    def edited(fn):
        data = json.loads(base.json)
        fn({b["fqn"]: b for b in data["boundaries"]}, data)
        return Plan.from_json(json.dumps(data))

    def bad_placement(b, d):
        b["model.layers.0.mlp"]["params"]["up_proj.weight"] = {"tp": "Q(7)"}  # after the attention's
    plan = edited(bad_placement)
    expect_error(lambda: hpt.parallelize(model, mesh, plan), ["model.layers.0.mlp", "Q(7)"], "unknown placement")
    unchanged(model, snap, "unknown placement")

    def packed(b, d):
        b["model.layers.0.self_attn"]["params"]["k_proj.weight"] = {"tp": "S(0)x2"}
    expect_error(lambda: hpt.parallelize(model, mesh, edited(packed)), ["model.layers.0.self_attn", "packed"],
                 "packed shard")
    unchanged(model, snap, "packed shard")

    def bad_type(b, d):
        b["lm_head"]["type"] = "linear_attention"
    expect_error(lambda: hpt.parallelize(model, mesh, edited(bad_type)), ["lm_head", "linear_attention"],
                 "boundary type")
    unchanged(model, snap, "boundary type")

    def no_lowering(b, d):
        b["model.layers.0.self_attn"]["in_dst"] = {"hidden_states": {"tp": "S(2)"}}  # S(1) -> S(2): no lowering
    expect_error(lambda: hpt.parallelize(model, mesh, edited(no_lowering)),
                 ["model.layers.0.self_attn", "S(1) -> S(2)"],
                 "transition without a lowering")
    unchanged(model, snap, "transition without a lowering")

    def rowwise_mismatch(b, d):
        b["model.layers.0.mlp"]["out_src"] = {"output": {"tp": "R"}}  # the MLP's down_proj is S(1): it produces P
    expect_error(lambda: hpt.parallelize(model, mesh, edited(rowwise_mismatch)), ["model.layers.0.mlp", "out_src"],
                 "out_src that the weights do not produce")
    unchanged(model, snap, "out_src that the weights do not produce")

    def undeclared(b, d):
        d["boundaries"].remove(b["lm_head"])
    expect_error(lambda: hpt.parallelize(model, mesh, edited(undeclared)), ["lm_head.weight", "no boundary"],
                 "undeclared parameter")
    unchanged(model, snap, "undeclared parameter")

    def missing_param(b, d):
        b["model.layers.0.self_attn"]["params"]["q_proj.bias"] = {"tp": "S(0)"}
    expect_error(lambda: hpt.parallelize(model, mesh, edited(missing_param)),
                 ["model.layers.0.self_attn", "q_proj.bias"],
                 "parameter the model does not have")
    unchanged(model, snap, "parameter the model does not have")

    # meshes that do not match the plan
    dp_mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    expect_error(lambda: hpt.parallelize(model, dp_mesh, base), ["device mesh", "dp"], "mesh dim not in the plan")
    def tp4(b, d):
        d["mesh"]["dims"][2]["size"] = 4  # the plan's mesh says tp=4 (llama's 2 kv heads do not allow a real one)
        d["mesh"]["world"] = 4
    expect_error(lambda: hpt.parallelize(model, mesh, edited(tp4)), ["'tp' is 2 there, 4 in the plan"],
                 "mesh size differs")
    plan_dp = get_plan(folder, dp=2, tp=2)
    expect_error(lambda: hpt.parallelize(model, mesh, plan_dp), ["device mesh (tp=2)", "dp=2"], "mesh dims differ")
    unnamed = init_device_mesh("cpu", (2,))
    expect_error(lambda: hpt.parallelize(model, unnamed, base), ["no dim names"], "mesh without names")
    unchanged(model, snap, "meshes")

    # context parallelism, refused by name
    cp_mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
    expect_error(lambda: hpt.parallelize(model, cp_mesh, get_plan(folder, cp=2)),
                 ["context parallelism (cp=2) is not supported by hyperpar.torch"], "cp")
    unchanged(model, snap, "cp")

    # expert parallelism: ep.py's apply_expert_parallel, or a refusal naming the block before anything changes
    moe, moe_folder = make_model("qwen3_moe")
    moe_snap = snapshot(moe)
    ep_plan = get_plan(os.path.join(moe_folder, "config.json"), tp=2, ep=2, expert_layout="batched")
    ep_b = next(b["fqn"] for b in ep_plan.boundaries if b["type"] == "moe_mlp")
    try:
        import hyperpar.torch.ep  # noqa: F401
        have_ep = True
    except ImportError:
        have_ep = False
    if not have_ep:
        expect_error(lambda: hpt.parallelize(moe, mesh, ep_plan), [ep_b, "expert parallelism"], "ep without ep.py")
        for n, p in moe.named_parameters():
            check(not isinstance(p, DTensor) and torch.equal(p.detach(), moe_snap[n]), "ep refusal changed %s" % n)
    else:
        say("note refuse     hyperpar.torch.ep is present: the ep refusal is its worker's to test")
    # the glue to ep.py, with a stand-in module: NotImplementedError from the first block is a refusal naming it,
    # with the model unchanged; otherwise apply_expert_parallel(model, boundary, plan, device_mesh) is called once
    # per moe_mlp boundary, in plan order, before the dense styles
    import types
    real = sys.modules.get("hyperpar.torch.ep"), getattr(hpt, "ep", None)
    calls = []

    def not_yet(model, boundary, plan, device_mesh):
        raise NotImplementedError("stand-in")

    def record(model, boundary, plan, device_mesh):
        calls.append((boundary["fqn"], plan is ep_plan, device_mesh is mesh,
                      any(isinstance(p, DTensor) for p in model.parameters())))
    try:
        for fn in (not_yet, record):
            fake = types.ModuleType("hyperpar.torch.ep")
            fake.apply_expert_parallel = fn
            sys.modules["hyperpar.torch.ep"] = fake
            hpt.ep = fake
            if fn is not_yet:
                expect_error(lambda: hpt.parallelize(moe, mesh, ep_plan), [ep_b, "stand-in", "unchanged"],
                             "ep.py raising NotImplementedError")
                for n, p in moe.named_parameters():
                    check(not isinstance(p, DTensor) and torch.equal(p.detach(), moe_snap[n]),
                          "ep NotImplementedError changed %s" % n)
            else:
                hpt.parallelize(moe, mesh, ep_plan)
                want = [b["fqn"] for b in ep_plan.boundaries if b["type"] == "moe_mlp"]
                check([c[0] for c in calls] == want, "apply_expert_parallel calls %s, want %s" % (calls, want))
                check(all(c[1] and c[2] and not c[3] for c in calls), "apply_expert_parallel arguments: %s" % calls)
                say("ok   refuse     ep glue: apply_expert_parallel called for %s, before the dense styles" % want)
    finally:
        if real[0] is None:
            sys.modules.pop("hyperpar.torch.ep", None)
        else:
            sys.modules["hyperpar.torch.ep"] = real[0]
        if real[1] is None:
            if hasattr(hpt, "ep"):
                del hpt.ep
        else:
            hpt.ep = real[1]

    # MoE models with a tp-only plan (ep_mode none): transformers 5 keeps the experts of a layer in one module of
    # stacked tensors, which the plan can cut over tp only as packed halves (--packed-fused) and torch's styles do
    # not express, and its router in a TopKRouter. Each is refused naming its boundary, model unchanged (with ep,
    # tests/python/torch_moe_parallel.py runs them).
    for fam, flags, where, why in (("qwen3_moe", {"packed_fused": True}, "model.layers.0.mlp", "TopKRouter"),
                                   ("mixtral", {"packed_fused": True}, "model.layers.0.mlp", "TopKRouter"),
                                   ("gpt_oss", {}, "model.layers.0.mlp", "without expert parallelism")):
        m, f = make_model(fam)
        m_snap = snapshot(m)
        p = get_plan(os.path.join(f, "config.json"), tp=2, expert_layout="batched", **flags)
        expect_error(lambda: hpt.parallelize(m, mesh, p), [where, why], "%s tp-only" % fam)
        for n, q in m.named_parameters():
            check(not isinstance(q, DTensor) and torch.equal(q.detach(), m_snap[n]), "%s refusal changed %s" % (fam, n))

    # plan_styles: the same styles, from the plan alone, applied with torch's own parallelize_module
    styles = hpt.plan_styles(base, mesh)
    check("model.layers.0.self_attn.q_proj" in styles and "lm_head" in styles, "plan_styles misses entries")
    check(base.to_torch(mesh).keys() == styles.keys(), "Plan.to_torch differs from plan_styles")
    say("ok   refuse     plan_styles: %d styles, e.g. %r" % (len(styles), styles["model.layers.0.mlp"]))
    from torch.distributed.tensor.parallel import parallelize_module
    for fam in ("llama", "qwen2"):  # qwen2: the tied head, an entry on the root module
        ref, f = make_model(fam)
        par = copy.deepcopy(ref)
        parallelize_module(par, mesh, hpt.plan_styles(get_plan(f, tp=2), mesh))
        ids = batch_ids(ref.config.vocab_size, 3)
        lr, lp = ref(ids).logits, par(ids).logits
        ce(lr, ids).backward()
        ce(lp, ids).backward()
        dl = maxdiff(lp, lr)
        dg = max(maxdiff(full(q.grad), p.grad)
                 for (_, p), (_, q) in zip(ref.named_parameters(), par.named_parameters()))
        check(dl <= TOL and dg <= TOL, "%s through parallelize_module(plan_styles): logits %.3g, grads %.3g"
              % (fam, dl, dg))
        say("ok   refuse     %s through parallelize_module(model, mesh, plan_styles(plan, mesh)): logits %.2e "
            "grads %.2e" % (fam, dl, dg))

    # generate() with a KV cache (greedy, 6 new tokens) under a plan without sequence parallelism
    ref, f = make_model("llama")
    par = hpt.parallelize(copy.deepcopy(ref), mesh, get_plan(f, tp=2, no_sequence_parallel=True))
    prompt = batch_ids(ref.config.vocab_size, 5)[:2, :5]
    with torch.no_grad():
        g_ref = ref.generate(prompt, max_new_tokens=6, do_sample=False)
        g_par = par.generate(prompt, max_new_tokens=6, do_sample=False)
    check(torch.equal(g_ref, g_par), "generate differs: %s vs %s" % (g_par.tolist(), g_ref.tolist()))
    say("ok   refuse     generate (tp=2, no SP, KV cache): the same %d tokens" % g_par.numel())


# ---- the cost model against torch's collectives ------------------------------------------------------------------

def run_comm():
    """One forward+backward (and the AdamW step after it) of llama at tp=2, SP on and off, under CommDebugMode,
    against `hyperpar cost --mode train`'s events for the same plan and batch (one micro-batch)."""
    from torch.distributed.tensor.debug import CommDebugMode
    check(dist.get_world_size() == 2, "comm runs on 2 processes")
    for fam, sp in (("llama", True), ("llama", False), ("qwen3", True), ("qwen3", False)):
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        model, folder = make_model(fam)
        flags = {"tp": 2} if sp else {"tp": 2, "no_sequence_parallel": True}
        hpt.parallelize(model, mesh, get_plan(folder, **flags))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = batch_ids(model.config.vocab_size, 7)
        modes = {"forward": CommDebugMode(), "backward": CommDebugMode(), "optimizer": CommDebugMode()}
        with modes["forward"]:
            loss = ce(model(ids).logits, ids)
        with modes["backward"]:
            loss.backward()
        with modes["optimizer"]:
            opt.step()
        counts = {}
        for phase, mode in modes.items():
            for op, n in mode.get_comm_counts().items():
                counts[(phase, _kind(str(op)))] = counts.get((phase, _kind(str(op))), 0) + n
        cmd = [HP_BIN, "cost", folder, "--mode", "train", "--batch", str(BATCH), "--seq", str(SEQ), "--micro-batch",
               str(BATCH), "--format", "json", "--tp", "2"] + ([] if sp else ["--no-sequence-parallel"])
        cost = json.loads(subprocess.check_output(cmd).decode())
        pred = {}
        for e in cost["events"]:
            phase = "backward" if e["step"] == "backward" else "forward"
            pred[(phase, e["kind"])] = pred.get((phase, e["kind"]), 0) + e["calls"]
        name = fam + (" tp2 SP" if sp else " tp2 no SP")
        kinds = ["all-gather", "reduce-scatter", "all-reduce"]
        for phase in ("forward", "backward", "optimizer"):
            say("comm %-9s %-9s torch: %s | hyperpar cost: %s" % (
                name, phase, ", ".join("%s %d" % (k, counts.get((phase, k), 0)) for k in kinds),
                ", ".join("%s %d" % (k, pred.get((phase, k), 0)) for k in kinds) if phase != "optimizer" else "-"))
        extra = set(k for _, k in counts) - set(kinds)
        check(not extra, "%s: torch ran collectives of other kinds: %s" % (name, sorted(extra)))
        # the forward is the plan's program: torch runs exactly the collectives cost counts
        for k in kinds:
            check(counts.get(("forward", k), 0) == pred.get(("forward", k), 0),
                  "%s forward: torch ran %d %s, hyperpar cost predicts %d" % (name, counts.get(("forward", k), 0), k,
                                                                            pred.get(("forward", k), 0)))
        # the backward: cost counts each forward collective's transpose and the tp sums of the gradients of the
        # norm weights that run on sequence-split rows (src/cost/cost.c, train_events): torch runs the same kinds
        # and counts.
        L = model.config.num_hidden_layers
        for k in kinds:
            check(counts.get(("backward", k), 0) == pred.get(("backward", k), 0), "%s backward: torch ran %d %s, "
                  "hyperpar cost predicts %d" % (name, counts.get(("backward", k), 0), k, pred.get(("backward", k), 0)))
        # the rule itself (_torch_backward), and no collective in the optimizer step
        want = _torch_backward(L, sp, qk=hasattr(model.model.layers[0].self_attn, "q_norm"))
        for phase in ("backward", "optimizer"):
            for k in kinds:
                check(counts.get((phase, k), 0) == want[phase].get(k, 0), "%s %s: torch ran %d %s, the "
                      "transposition rule says %d" % (name, phase, counts.get((phase, k), 0), k, want[phase].get(k, 0)))
        dist.barrier()


def _kind(op):
    if "all_gather" in op:
        return "all-gather"
    if "reduce_scatter" in op:
        return "reduce-scatter"
    if "all_reduce" in op or "allreduce" in op:
        return "all-reduce"
    if "all_to_all" in op:
        return "all-to-all"
    return op


def _torch_backward(L, sp, qk=False):
    """The collectives torch's backward and the first AdamW step run for llama's plan of L layers, by the
    transposition rule: each forward all-gather whose gradient arrives partial becomes a reduce-scatter, each
    reduce-scatter an all-gather, an all-reduce nothing (the gradient of a replicated tensor is whole), a gather of
    the vocabulary (the head's exit, the loss replicated on every rank) a local slice; an identity entry R -> R whose
    gradient is partial (tp cuts the module) an all-reduce (hyperpar.torch's _ReplicateGrad). Replicated weights
    that saw other rows on each rank (the norms under SP: 2L + 1) have their gradients summed once, in backward
    (_grads.py); so do the q/k norms of attention cut over tp (qk: Qwen3), whose heads differ per rank (2L); the
    optimizer step then runs no collective."""
    q = 2 * L if qk else 0
    if sp:
        return {"backward": {"all-gather": 2 * L + 1, "reduce-scatter": 2 * L + 1, "all-reduce": 2 * L + 1 + q},
                "optimizer": {}}
    return {"backward": {"all-reduce": 2 * L + 1 + q}, "optimizer": {}}


def main():
    global HP_BIN, TMP
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    HP_BIN = os.path.abspath(sys.argv[1])
    TMP = tempfile.mkdtemp(prefix="hp_torch_parallel.")
    tt.start()
    cases = []
    for case in sys.argv[2:]:
        spec, _, fams = case.partition(":")
        if spec == "refuse":
            cases.append((case, run_refuse))
        elif spec == "comm":
            cases.append((case, run_comm))
        else:
            cases += [("%s %s" % (spec, fam), lambda s=spec, f=fam: run_model_case(s, f))
                      for fam in (fams.split(",") if fams else DENSE)]
    try:
        return tt.run_cases("torch_parallel", cases)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    tt.end(main())

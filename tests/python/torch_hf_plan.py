"""The transformers plan export (`hyperpar.plan(folder, mesh={"tp": 2}).to_hf()`) loaded by transformers itself.

    torchrun --standalone --nproc_per_node 2 tests/python/torch_hf_plan.py HYPERPAR_BINARY

For each tiny checkpoint of tests/data/forward (llama, qwen3, llama with its MLPs replicated by an override,
qwen3_moe with ep=2), on CPU with gloo and in float64: the export comes from the Python API (hyperpar.plan(...)
.to_hf(), for the installed transformers) and must equal the CLI's (`hyperpar plan FOLDER --tp 2 --format hf
--hf-version V`, the same flags); its `distributed_config` object goes to `DistributedConfig(**...)` unchanged, the
model is loaded with it by `AutoModelForCausalLM.from_pretrained`, and its logits and loss are compared with the
unsharded model loaded in the same process (within 1e-10). The check also asserts that the plan was applied: every
parameter the plan shards is a DTensor sharded over the 2 ranks, and every parameter it leaves whole is not sharded.

Exit 0 when every model matches, 1 on a mismatch or a failure (with the reason), 77 when torch or transformers
(or accelerate, which transformers needs to load with a distributed_config)
cannot be imported, unless HP_REQUIRE_TORCH=1 (then 1).
"""
import json
import os
import re
import subprocess
import sys

import hp_torchtest as tt

TOL = 1e-10
HERE = os.path.dirname(os.path.abspath(__file__))
FORWARD = os.path.join(HERE, "..", "data", "forward")
# (label, folder, extra plan flags): the dense pair the plan export must serve; llama with its MLPs kept whole by
# an override, which the export says with "replicate" (transformers merges a DistributedConfig plan into the
# model's own, which shards the MLPs); and one MoE model with expert parallelism.
# (label, folder, hyperpar.plan options; the CLI's flags are the same, --ep 2, --overrides FILE)
CASES = [("llama", "llama", {}), ("qwen3", "qwen3", {}),
         ("llama+mlp_replicated", "llama",
          {"overrides": os.path.join(HERE, "..", "data", "overrides", "mlp_replicated.yaml")}),
         ("qwen3_moe", "qwen3_moe", {"ep": 2})]


def say(msg):
    print("torch_hf_plan: " + msg, flush=True)


# accelerate: transformers loads a distributed_config model through it
tt.need("torch_hf_plan", "accelerate", "transformers.distributed")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.distributed import DistributedConfig  # noqa: E402

import hyperpar  # noqa: E402


def generic(name):
    """transformers' key lookup form: every all-digit path component becomes '*'."""
    return re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), name)


def plan_style(plan, param):
    """The style plan gives param: its own key, else its module's (as transformers looks it up)."""
    g = generic(param)
    if g in plan:
        return plan[g]
    return plan.get(g.rsplit(".", 1)[0]) if "." in g else None


def check_applied(model, dc, rank):
    """Every parameter the plan shards is a DTensor sharded on its tp/ep mesh; the others are whole. Returns the
    number of sharded parameters seen (0 would mean the plan was not applied)."""
    sharded_styles = {"colwise", "rowwise", "colwise_gather_output", "embedding_rowwise", "embedding_colwise",
                      "packed_colwise", "packed_rowwise", "grouped_gemm"}
    seen = 0
    for name, p in model.named_parameters():
        style = plan_style(dc.get("ep_plan", {}), name) or plan_style(dc.get("tp_plan", {}), name)
        shards = style in sharded_styles and not (style == "rowwise" and name.endswith(".bias"))
        is_sharded = isinstance(p, DTensor) and any(isinstance(pl, Shard) or "Shard" in type(pl).__name__
                                                    for pl in p.placements)
        if shards and not is_sharded:
            raise tt.Failure("%s: the plan says %s but the loaded parameter is not sharded (%s)"
                             % (name, style, type(p).__name__))
        if not shards and is_sharded:
            raise tt.Failure("%s: the plan leaves it whole (%s) but it is sharded %s"
                             % (name, style, p.placements))
        if shards:
            local = p.to_local()
            if local.numel() * 2 != p.numel():
                raise tt.Failure("%s: rank %d holds %d of %d elements, not half"
                                 % (name, rank, local.numel(), p.numel()))
            seen += 1
    return seen


def run_case(hp, folder, options, rank):
    exported = hyperpar.plan(folder, mesh={"tp": 2}, **options).to_hf()
    flags = []
    for k, v in options.items():
        flags += ["--" + k.replace("_", "-"), str(v)]
    cmd = [hp, "plan", folder, "--tp", "2", "--format", "hf", "--hf-version", transformers.__version__] + flags
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise tt.Failure("%s failed (exit %d): %s" % (" ".join(cmd), out.returncode, out.stderr.strip()))
    if json.loads(out.stdout) != exported:
        raise tt.Failure("hyperpar.plan(...).to_hf() differs from `%s`" % " ".join(cmd))
    if exported.get("unmapped"):
        raise tt.Failure("the export lists unmapped shards: %s" % exported["unmapped"])
    dc = exported["distributed_config"]

    torch.manual_seed(0)
    # "eager" experts: transformers' default grouped_mm has no float64 kernel on CPU.
    kw = {"dtype": torch.float64, "experts_implementation": "eager"}
    ref = AutoModelForCausalLM.from_pretrained(folder, **kw)
    ref.eval()
    vocab = ref.config.vocab_size
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(1234))

    model = AutoModelForCausalLM.from_pretrained(folder, distributed_config=DistributedConfig(**dc), **kw)
    model.eval()
    n_sharded = check_applied(model, dc, rank)
    if n_sharded == 0:
        raise tt.Failure("no parameter was sharded: the plan was not applied")

    worst = {}
    for mode in ("no_grad", "grad"):
        ctx = torch.no_grad() if mode == "no_grad" else torch.enable_grad()
        with ctx:
            want = ref(input_ids=ids, labels=ids)
            got = model(input_ids=ids, labels=ids)
            logits, loss = tt.full(got.logits), tt.full(got.loss)
            dl = tt.max_abs_diff(logits, want.logits)
            dloss = abs(loss.detach().item() - want.loss.detach().item())
        worst[mode] = (dl, dloss)
        if not (dl <= TOL and dloss <= TOL):
            raise tt.Failure("%s: max |logits diff| %.3e, |loss diff| %.3e exceed %.0e" % (mode, dl, dloss, TOL))
    return n_sharded, worst


def main():
    if len(sys.argv) != 2:
        say("usage: torchrun --nproc_per_node 2 %s HYPERPAR_BINARY" % sys.argv[0])
        return 2
    hp = os.path.abspath(sys.argv[1])
    if not os.access(hp, os.X_OK):
        say("FAIL: %s is not an executable hyperpar binary" % hp)
        return 1
    if "WORLD_SIZE" not in os.environ or os.environ["WORLD_SIZE"] != "2":
        say("FAIL: run under torchrun with 2 processes (WORLD_SIZE=%s)" % os.environ.get("WORLD_SIZE"))
        return 1
    tt.start()
    rank = dist.get_rank()

    def case(name, sub, options):
        folder = os.path.normpath(os.path.join(FORWARD, sub))
        n, worst = run_case(hp, folder, options, rank)
        return ("%s (transformers %s, hyperpar.plan(mesh={'tp': 2}%s).to_hf(), the CLI's export equal): %d sharded "
                "parameters; max |logits diff| %.3e, |loss diff| %.3e (no_grad), %.3e, %.3e (grad)"
                % (name, transformers.__version__, "".join(", %s=%s" % (k, os.path.basename(str(v)))
                                                           for k, v in options.items()), n,
                   worst["no_grad"][0], worst["no_grad"][1], worst["grad"][0], worst["grad"][1]))
    return tt.run_cases("torch_hf_plan", [(c[0], lambda c=c: case(*c)) for c in CASES])


if __name__ == "__main__":
    tt.end(main())

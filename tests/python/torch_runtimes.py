"""The two runtimes agree: `hyperpar run` (C, MPI) and hyperpar.torch.parallelize (torch.distributed), one plan.

    torchrun --standalone --nproc_per_node 2 tests/python/torch_runtimes.py HYPERPAR_BINARY

For a dense checkpoint (tests/data/forward/llama, tp=2) and a MoE one (tests/data/forward/qwen3_moe, tp=2 with
TP-extend-EP ep=2, its expert compute declared with ep_compute="suggested", which `hyperpar run` requires under
EP): one plan is made with hyperpar.plan(folder, ...) and written to a file; rank 0 runs

    mpirun --allow-run-as-root --oversubscribe -np 2 HYPERPAR run FOLDER --plan PLAN.json --ids ... -o OUT.safetensors

(the C runtime: each rank loads its slices of the checkpoint and runs the plan; rank 0 writes the logits F32
[B, S, V] and the loss), while every torch rank loads the checkpoint with AutoModelForCausalLM.from_pretrained in
float32 and applies the same plan with parallelize; the torch logits and loss (the mean next-token cross-entropy)
must equal the file's within 1e-5 (absolute; float32 on both sides, summed in other orders).

Exit 0 when both agree, 1 on a mismatch or a failure, 77 when torch/transformers cannot be imported or mpirun is
not installed (unless HP_REQUIRE_TORCH=1, then 1).
"""
import os
import shutil
import subprocess
import sys
import tempfile

import hp_torchtest as tt

tt.need("torch_runtimes", "safetensors.torch")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

import hyperpar  # noqa: E402
import hyperpar.torch as hpt  # noqa: E402

TOL = 1e-5
IDS = [[3, 17, 42, 99, 5, 64, 127, 8], [1, 2, 3, 4, 5, 6, 7, 8], [120, 33, 71, 0, 58, 91, 14, 26]]
CASES = [("llama", {}), ("qwen3_moe", {"ep": 2, "ep_compute": "suggested"})]


def run_case(hp_bin, family, options, tmp):
    folder = os.path.join(tt.FORWARD, family)
    plan = hyperpar.plan(folder, mesh={"tp": 2}, **options)  # the checkpoint's plan: one for both runtimes
    plan_file = os.path.join(tmp, family + ".plan.json")
    out = os.path.join(tmp, family + ".run.safetensors")
    err = None
    if dist.get_rank() == 0:
        with open(plan_file, "w") as f:
            f.write(plan.json)
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", hp_bin, "run", folder, "--plan",
               plan_file, "--ids", ";".join(",".join(str(i) for i in row) for row in IDS), "-o", out]
        env = dict(os.environ)
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            env.pop(k, None)  # torchrun's, not MPI's
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        if r.returncode != 0:
            err = "%s: exit %d: %s" % (" ".join(cmd), r.returncode, (r.stdout + r.stderr)[-2000:])
    flag = torch.tensor([0 if err else 1])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if flag.item() == 0:
        raise tt.Failure(err or "hyperpar run failed on rank 0")
    want = load_file(out)

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    hpt.parallelize(model, mesh, plan)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        logits = model(ids).logits
    logits = tt.full(logits)
    loss = tt.ce(logits.float(), ids)
    dl = tt.max_abs_diff(logits, want["logits"])
    dloss = abs(loss.item() - want["loss"].item())
    scale = want["logits"].abs().max().item()
    tt.check(dl <= TOL and dloss <= TOL, "max |logits diff| %.3e, |loss diff| %.3e exceed %.0e (max |logits| %.3g)"
             % (dl, dloss, TOL, scale))
    return ("plan %s: hyperpar run (mpirun -np 2) vs parallelize (torchrun 2, float32): max |logits diff| %.2e "
            "(max |logits| %.2f), |loss diff| %.2e" % (", ".join(["tp=2"] + ["%s=%s" % kv for kv in options.items()]),
                                                      dl, scale, dloss))


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    hp_bin = os.path.abspath(sys.argv[1])
    if shutil.which("mpirun") is None:
        tt.skip("torch_runtimes", "mpirun not found (hyperpar run needs it)")
    tt.start()
    if dist.get_world_size() != 2:
        tt.say("torch_runtimes: FAIL: runs on 2 processes, torchrun gave %d" % dist.get_world_size())
        return 1
    me = dist.get_rank()
    tmp = tempfile.mkdtemp(prefix="hp_torch_runtimes.") if me == 0 else None
    box = [tmp]
    dist.broadcast_object_list(box, src=0)
    tmp = box[0]
    rc = tt.run_cases("torch_runtimes", [(family, lambda f=family, o=options: run_case(hp_bin, f, o, tmp))
                                         for family, options in CASES])
    if me == 0:  # after run_cases' barrier: every rank is done with it
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    tt.end(main())

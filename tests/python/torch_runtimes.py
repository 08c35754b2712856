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
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
except Exception as e:  # noqa: BLE001 - any import failure means "cannot run here"
    from hp_skip import skip
    skip("torch_runtimes", "torch/transformers/safetensors not importable: %s" % e)

import hyperpar
import hyperpar.torch as hpt

TOL = 1e-5
IDS = [[3, 17, 42, 99, 5, 64, 127, 8], [1, 2, 3, 4, 5, 6, 7, 8], [120, 33, 71, 0, 58, 91, 14, 26]]
CASES = [("llama", {}), ("qwen3_moe", {"ep": 2, "ep_compute": "suggested"})]


def say(msg):
    if dist.get_rank() == 0:
        print("torch_runtimes: " + msg, flush=True)


def run_case(hp_bin, family, options, tmp):
    folder = os.path.join(ROOT, "tests", "data", "forward", family)
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
        raise RuntimeError(err or "hyperpar run failed on rank 0")
    want = load_file(out)

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    hpt.parallelize(model, mesh, plan)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        logits = model(ids).logits
    logits = logits.full_tensor() if isinstance(logits, DTensor) else logits
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    dl = (logits - want["logits"]).abs().max().item()
    dloss = abs(loss.item() - want["loss"].item())
    if not (dl <= TOL and dloss <= TOL):
        raise AssertionError("%s: max |logits diff| %.3e, |loss diff| %.3e exceed %.0e (max |logits| %.3g)"
                             % (family, dl, dloss, TOL, want["logits"].abs().max().item()))
    return dl, dloss, want["logits"].abs().max().item()


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    hp_bin = os.path.abspath(sys.argv[1])
    if shutil.which("mpirun") is None:
        from hp_skip import skip
        skip("torch_runtimes", "mpirun not found (hyperpar run needs it)")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    if dist.get_world_size() != 2:
        say("FAIL: runs on 2 processes, torchrun gave %d" % dist.get_world_size())
        return 1
    tmp = tempfile.mkdtemp(prefix="hp_torch_runtimes.") if dist.get_rank() == 0 else None
    box = [tmp]
    dist.broadcast_object_list(box, src=0)
    tmp = box[0]
    failed = 0
    for family, options in CASES:
        try:
            dl, dloss, scale = run_case(hp_bin, family, options, tmp)
            ok = 1
            msg = ("ok   %-10s plan %s: hyperpar run (mpirun -np 2) vs parallelize (torchrun 2, float32): max |logits "
                   "diff| %.2e (max |logits| %.2f), |loss diff| %.2e" % (
                       family, ", ".join(["tp=2"] + ["%s=%s" % kv for kv in options.items()]), dl, scale, dloss))
        except Exception as e:  # noqa: BLE001 - report, then let the ranks agree
            ok = 0
            msg = "FAIL %s (rank %d): %s\n%s" % (family, dist.get_rank(), e, traceback.format_exc())
        flag = torch.tensor([ok])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if ok == 0 or dist.get_rank() == 0:
            print("torch_runtimes: " + msg, flush=True)
        failed += flag.item() == 0
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    from hp_skip import end
    end(main())

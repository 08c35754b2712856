"""train_variant.py HYPERPAR — a layer shape the goldens do not have trains with PyTorch's gradients (issue 38).

Qwen3-MoE with mlp_only_layers = [1] puts a dense MLP between two MoE layers, and Qwen2-MoE with decoder_sparse_step
2 makes every other layer dense: the program lists those layers' steps differently, and the backward walks whatever
list it is given. The model is built by transformers (seeded), saved, trained one step by `hyperpar train` with
--grad-out at 1 process, tp=2 and tp=2 x ep=2 (TP-extend-EP), and every gradient is compared with torch autograd's
on the same batch: per tensor max|d| <= 1e-4·max|ref| + 1e-7, train_check.py's bar. Exits 77 (skipped) without
torch/transformers unless HP_REQUIRE_TORCH=1."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hp_skip import skip  # noqa: E402
from hp_torchtest import read_st, write_ids  # noqa: E402

WHO = "train_variant"
try:
    import torch
    import transformers
except Exception as e:  # noqa: BLE001
    skip(WHO, "torch/transformers do not import: %s" % e)


def torch_grads(model):
    """The reference gradients by checkpoint name: fused expert tensors cut back into the hub's per-expert names."""
    g = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            base, half = name[:-len("gate_up_proj")], p.shape[1] // 2
            for e in range(p.shape[0]):
                g["%s%d.gate_proj.weight" % (base, e)] = p.grad[e, :half]
                g["%s%d.up_proj.weight" % (base, e)] = p.grad[e, half:]
        elif name.endswith("mlp.experts.down_proj"):
            base = name[:-len("down_proj")]
            for e in range(p.shape[0]):
                g["%s%d.down_proj.weight" % (base, e)] = p.grad[e]
        else:
            g[name] = p.grad
    return g


def build(kind, out):
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                  tie_word_embeddings=False, max_position_embeddings=64)
    if kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(head_dim=16, mlp_only_layers=[1], decoder_sparse_step=1, norm_topk_prob=True,
                                          **common)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2MoeConfig(mlp_only_layers=[], decoder_sparse_step=2, norm_topk_prob=False,
                                          shared_expert_intermediate_size=48, **common)
        model = transformers.Qwen2MoeForCausalLM(cfg)
    model = model.float()
    model.save_pretrained(out, safe_serialization=True)
    return model


def main():
    hp = sys.argv[1]
    work = tempfile.mkdtemp(prefix="hp_train_variant.")
    bad = 0
    try:
        ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
        write_ids(os.path.join(work, "ids.safetensors"), ids)
        for kind in ("qwen3_moe", "qwen2_moe"):
            d = os.path.join(work, kind)
            model = build(kind, d)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            ref = torch_grads(model)
            mpi = shutil.which("mpirun")
            runs = [("1", [hp])]
            if mpi:
                launch = [mpi, "--allow-run-as-root", "--oversubscribe", "-np", "2", hp]
                runs += [("tp2", launch), ("tp2-ep2", launch)]
            for tag, cmd in runs:
                flags = {"1": [], "tp2": ["--tp", "2"], "tp2-ep2": ["--tp", "2", "--ep", "2", "--ep-compute", "suggested"]}[tag]
                gout = os.path.join(work, "%s.%s.g" % (kind, tag))
                r = subprocess.run(cmd + ["train", d, "--input", os.path.join(work, "ids.safetensors"), "--steps", "1",
                                          "--grad-out", gout] + flags, capture_output=True, text=True, timeout=600)
                if r.returncode:
                    print("FAIL %s %s: exit %d\n%s" % (kind, tag, r.returncode, r.stderr[-2000:]))
                    bad += 1
                    continue
                got = {k[len("grad."):]: v for k, v in read_st(gout).items() if k.startswith("grad.")}
                missing = sorted(set(ref) - set(got))
                if missing or not got:
                    print("FAIL %s %s: no gradient for %s" % (kind, tag, missing[:5]))
                    bad += 1
                worst = 0.0
                for name, g in got.items():
                    if name not in ref:
                        print("FAIL %s %s: %s is not a parameter of the model" % (kind, tag, name))
                        bad += 1
                        continue
                    r_ = ref[name].reshape(g.shape)
                    diff = (g - r_).abs().max().item()
                    tol = 1e-4 * r_.abs().max().item() + 1e-7
                    worst = max(worst, diff / tol)
                    if diff > tol:
                        print("FAIL %s %s: %s max|d| %.3g > %.3g" % (kind, tag, name, diff, tol))
                        bad += 1
                print("%s %s: %d gradients, worst max|d| / tol = %.3f" % (kind, tag, len(got), worst), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("%s: %s" % (WHO, "FAIL" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

# hyperpar cost against Megatron-LM's formulas (issue 21, "cost defects found by comparing with Megatron-LM"):
#  1. weights + gradients + optimizer + master per rank (--mode train) equal Megatron's
#     compute_weight_and_optimizer_memory, computed here independently from config.json, for dense and MoE meshes
#     with and without --zero 1 (and a --zero 2 / other byte model): 18 bytes per parameter without ZeRO (2
#     weight + 4 grad + 8 Adam moments + 4 master), 6 + 12/d with ZeRO-1, where d is the data-parallel group
#     (world / tp) for the dense parameters and the expert-data-parallel group (world / (ep·etp)) for the experts;
#     the expert gradients are all-reduced over that group.
#  2. train mode's saved activations are the residual stream's local blocks (sharded on tp under sequence
#     parallelism), and training charges no gathered logits or routing to rank 0; inference (run without --output)
#     gathers no logits either, only each sparse layer's routing.
#  3. MoE without sequence parallelism: a plan lint warning and a cost note; the exchange and FLOPs are x tp.
#  4. JSON numbers are never rounded to 6 digits: flops an integer, times with 17 significant digits.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
D=data/configs

megatron() { # CONFIG BYTEMODEL(grad,optim,master,zero) MESH-FLAGS...
    python3 - "$HP" "$@" <<'PY'
import json, subprocess, sys
hp, cfgp, model = sys.argv[1], sys.argv[2], sys.argv[3]
flags = sys.argv[4:]
grad, optim, master, zero = (int(x) for x in model.split(","))
c = json.load(open(cfgp))
H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
nh, nkv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
hd = c.get("head_dim") or H // nh
E = c.get("num_local_experts", 0)
I = c["intermediate_size"]
def flag(name, dflt):
    return int(flags[flags.index(name) + 1]) if name in flags else dflt
mesh = {}
if "--mesh" in flags:
    for kv in flags[flags.index("--mesh") + 1].split(","):
        k, v = kv.split("="); mesh[k] = int(v)
tp = mesh.get("tp", flag("--tp", 1)); dp = mesh.get("dp", flag("--dp", 1)); cp = mesh.get("cp", flag("--cp", 1))
ep_axis = "--ep-axis" in flags
ep = mesh.get("ep", 1) if ep_axis else flag("--ep", 1)
world = dp * cp * tp * (ep if ep_axis else 1)
# Megatron's parameter counts (theoretical_memory_usage.py), per layer: attention q, k, v, o; the gated MLP
# (3/2 x 2 x H x I); two RMSNorms; the embedding and the untied output layer; the final norm. For a MoE layer the
# experts (E x 3 x H x I) and, which Megatron's script leaves out, the router (H x E).
attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H
if E:
    experts = L * E * 3 * H * I
    dense_split = L * attn + 2 * V * H          # split over tp
    dense_whole = L * 2 * H + H + L * H * E     # norms and routers: whole on every tp rank
else:
    experts = 0
    dense_split = L * (attn + 3 * H * I) + 2 * V * H
    dense_whole = L * 2 * H + H
etp = 1                                          # the meshes below keep every expert whole on its EP rank
p_dense = dense_split // tp + dense_whole
p_exp = experts // (ep * etp)
d_dense, d_exp = world // tp, world // (ep * etp)
def zshare(n, d, on):
    return -(-n // d) if on else n
want_w = 2 * (p_dense + p_exp)
want_g = grad * (zshare(p_dense, d_dense, zero >= 2) + zshare(p_exp, d_exp, zero >= 2))
want_o = optim * (zshare(p_dense, d_dense, zero >= 1) + zshare(p_exp, d_exp, zero >= 1))
want_m = master * (zshare(p_dense, d_dense, zero >= 1) + zshare(p_exp, d_exp, zero >= 1))
out = subprocess.run([hp, "cost", cfgp, "--mode", "train", "--format", "json", "--grad-bytes", str(grad),
                      "--optim-bytes", str(optim), "--master-bytes", str(master), "--zero", str(zero)] + flags,
                     capture_output=True, text=True)
if out.returncode != 0:
    print(out.stderr); sys.exit(1)
d = json.loads(out.stdout)
bad = 0
if d["refused"]:
    print("refused:", d["refused"]); sys.exit(1)
for r in d["ranks"]:
    got = (r["weight_bytes"], r["grad_bytes"], r["optim_bytes"], r["master_bytes"])
    if got != (want_w, want_g, want_o, want_m):
        bad += 1
        print("rank", r["rank"], "got", got, "want", (want_w, want_g, want_o, want_m))
# the gradients' all-reduces: the dense ones over world / tp, the experts' over world / (ep·etp)
ev = [e for e in d["events"] if e["step"] in ("dp all-reduce", "edp all-reduce")]
want_ev = []
if d_dense > 1: want_ev.append(("dp", d_dense, p_dense * grad))
if d_exp > 1 and p_exp: want_ev.append(("edp", d_exp, p_exp * grad))
if sorted((e["axis"], e["group"], e["bytes"]) for e in ev) != sorted(want_ev):
    bad += 1
    print("gradient all-reduces", [(e["axis"], e["group"], e["bytes"]) for e in ev], "want", want_ev)
if bad:
    print(cfgp, model, flags); sys.exit(1)
tot = (want_w + want_g + want_o + want_m) / 2**30
print(f"{cfgp} {' '.join(flags)} ({model}): {tot:.2f} GiB per rank, as Megatron's model")
PY
}

# Dense: llama-3-8b.
for z in 0 1; do
    for mesh in "--tp 1" "--dp 2 --tp 2" "--dp 4 --tp 2" "--tp 8" "--dp 8" "--dp 2 --cp 2 --tp 2 --seq 4096"; do
        check "llama-3-8b $mesh zero $z" megatron $D/llama-3-8b.json 4,8,4,$z $mesh
    done
done
# MoE: mixtral-8x7b, TP-extend-EP and the explicit ep axis; the issue's mesh (--dp 2 --tp 2 --ep 4: every expert
# on one rank, its expert-data-parallel group of 1) among them.
for z in 0 1; do
    for mesh in "--dp 2 --tp 2 --ep 4" "--tp 2 --ep 2" "--dp 4 --tp 2 --ep 2" "--dp 2" "--mesh dp=2,ep=4 --ep-axis" \
        "--mesh dp=4,ep=2 --ep-axis"; do
        check "mixtral-8x7b $mesh zero $z" megatron $D/mixtral-8x7b.json 4,8,4,$z $mesh
    done
done
# Other byte models: ZeRO-2, and flags other than the defaults.
check "mixtral zero 2" megatron $D/mixtral-8x7b.json 4,8,4,2 --dp 4 --tp 2 --ep 2
check "llama zero 2, 2-byte grads" megatron $D/llama-3-8b.json 2,12,0,2 --dp 4 --tp 2
check "mixtral zero 1, no master" megatron $D/mixtral-8x7b.json 4,8,0,1 --mesh dp=2,ep=4 --ep-axis
# The issue's figure: 198 GiB (not 135) of weights + optimizer state on mixtral --dp 2 --tp 2 --ep 4 --zero 1.
mx=$("$HP" cost $D/mixtral-8x7b.json --dp 2 --tp 2 --ep 4 --mode train --zero 1 --train-state megatron --format json |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["ranks"][0]
print(round((r["weight_bytes"]+r["grad_bytes"]+r["optim_bytes"]+r["master_bytes"])/2**30))')
check "mixtral dp2 tp2 ep4 zero 1 is 198 GiB, got $mx" test "$mx" = 198

# 2. Saved activations and the logits in training.
train_check() {
    python3 - "$HP" "$@" <<'PY'
import json, subprocess, sys
hp, cfgp = sys.argv[1], sys.argv[2]
flags = sys.argv[3:]
def run(*extra):
    o = subprocess.run([hp, "cost", cfgp, "--format", "json"] + flags + list(extra), capture_output=True, text=True)
    assert o.returncode == 0, o.stderr
    return json.loads(o.stdout)
c = json.load(open(cfgp))
H, L = c["hidden_size"], c["num_hidden_layers"]
tp = int(flags[flags.index("--tp") + 1]); S = int(flags[flags.index("--seq") + 1])
sp = "--no-sequence-parallel" not in flags
tr, inf = run("--mode", "train"), run()
bad = 0
for r in tr["ranks"]:
    want = (L + 1) * S * H * 4 // (tp if sp else 1)       # one row; the residual stream's local block per layer
    if r["saved_bytes"] != want:
        bad += 1; print("rank", r["rank"], "saved", r["saved_bytes"], "want", want)
    if r["comm"]["calls"]["gather"] != 0 or r["comm"]["bytes"]["gather"] != 0:
        bad += 1; print("rank", r["rank"], "training gathers", r["comm"]["calls"]["gather"])
t0, t1 = tr["ranks"][0]["activation_bytes"], tr["ranks"][1]["activation_bytes"]
i0, i1 = inf["ranks"][0]["activation_bytes"], inf["ranks"][1]["activation_bytes"]
if t0 != t1:
    bad += 1; print("train: rank 0's activations", t0, "rank 1's", t1, "(rank 0 charged the logits?)")
moe = c.get("num_local_experts", c.get("num_experts", 0)) > 0
if i0 != i1 or inf["ranks"][0]["comm"]["calls"]["gather"] != (L if moe else 0):
    bad += 1; print("infer: rank 0 should gather the routing alone, no logits", i0, i1,
                    inf["ranks"][0]["comm"]["calls"]["gather"])
sys.exit(1 if bad else 0)
PY
}
check "llama-3-8b tp8 saved activations sharded (SP)" train_check $D/llama-3-8b.json --tp 8 --seq 4096
check "llama-3-8b tp8 no SP" train_check $D/llama-3-8b.json --tp 8 --seq 4096 --no-sequence-parallel
check "mixtral tp2 ep2 SP" train_check $D/mixtral-8x7b.json --tp 2 --ep 2 --seq 2048
check "qwen3-30b-a3b tp4 ep4" train_check $D/qwen3-30b-a3b.json --tp 4 --ep 4 --seq 1024

# 3. MoE without sequence parallelism: warned by plan (and cost), noted in cost's text and JSON; its exchange and
# expert FLOPs are tp times those with SP. With SP, or for a dense model, no warning.
NOSP="every tp rank routes and runs the experts of every token"
expect 0 "$NOSP" -- "$HP" plan $D/mixtral-8x7b.json --tp 2 --ep 2 --no-sequence-parallel -o "$WORK/p.json"
expect 0 "$NOSP" -- "$HP" plan $D/qwen3-30b-a3b.json --dp 2 --tp 4 --ep 8 --no-sequence-parallel -o "$WORK/p.json"
expect 0 "note: the MoE blocks" -- "$HP" cost $D/qwen1.5-moe-a2.7b.json --tp 2 --ep 2 --no-sequence-parallel
check "no warning with SP" bash -c "! '$HP' plan $D/mixtral-8x7b.json --tp 2 --ep 2 -o '$WORK/p.json' 2>&1 | grep -q 'routes and runs'"
check "no warning for a dense model" bash -c "! '$HP' plan $D/llama-3-8b.json --tp 2 --no-sequence-parallel -o '$WORK/p.json' 2>&1 | grep -q 'routes and runs'"
nosp() {
    python3 - "$HP" "$@" <<'PY'
import json, subprocess, sys
hp, cfgp, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
def run(*extra):
    o = subprocess.run([hp, "cost", cfgp, "--tp", str(tp), "--ep", str(tp), "--seq", "1024", "--format", "json"] +
                       list(extra), capture_output=True, text=True)
    assert o.returncode == 0, o.stderr
    return json.loads(o.stdout)
sp, no = run(), run("--no-sequence-parallel")
a, b = sp["ranks"][0]["comm"]["bytes"]["all-to-all"], no["ranks"][0]["comm"]["bytes"]["all-to-all"]
ok = sp["note"] is None and no["note"] is not None and "tp=%d" % tp in no["note"] and b == tp * a
ok = ok and no["ranks"][0]["flops"] > sp["ranks"][0]["flops"]
if not ok: print(cfgp, "exchange", a, b, "notes", sp["note"], no["note"])
sys.exit(0 if ok else 1)
PY
}
check "mixtral no-SP exchange x2" nosp $D/mixtral-8x7b.json 2
check "qwen3-moe no-SP exchange x4" nosp $D/qwen3-30b-a3b.json 4

# 4. JSON numbers at full precision: flops an exact integer, and the times read back as the very doubles cost
# computed: t_compute = flops / gemm_flops and t_step = t_compute + t_comm, redone here in IEEE doubles, are equal
# (6 significant digits would not be).
fullprec() {
    "$HP" cost "$@" --format json | python3 -c '
import json, re, sys
t = sys.stdin.read()
d = json.loads(t)
flops = re.findall(r"\"flops\": ([^,}]+)", t)
ok = bool(flops) and all(re.fullmatch(r"[0-9]+", f) for f in flops)
g = d["model"]["gemm_flops"]
for r in d["ranks"]:
    ok = ok and r["flops"] > 1e12 and r["t_compute"] == r["flops"] / g and r["t_step"] == r["t_compute"] + r["t_comm"]
ok = ok and sum(e["seconds"] for e in d["events"]) > 0
if not ok: print("flops", flops[:3], [(r["t_compute"], r["flops"] / g) for r in d["ranks"][:2]])
sys.exit(0 if ok else 1)'
}
check "llama json full precision" fullprec $D/llama-3-8b.json --tp 2
check "llama json full precision, other rate" fullprec $D/llama-3-8b.json --dp 2 --tp 2 --gemm-gflops 123.456789
check "deepseek json full precision, train" fullprec $D/deepseek-v3.json --dp 2 --tp 2 --ep 4 --mode train --seq 1024
adv=$("$HP" advise $D/llama-3-8b.json --world 4 --mem-per-rank 80GB --format json | python3 -c '
import json, sys
d = json.load(sys.stdin)
c = [x for x in d["candidates"] if x["ok"]]
print("ok" if c and all(x["t_step"] == x["t_compute"] + x["t_comm"] + x.get("t_bubble", 0) for x in c) else [x["t_step"] for x in c[:3]])')
check "advise json times full precision ($adv)" test "$adv" = ok
finish

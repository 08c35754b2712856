# hyperpar cost --hardware (issue 25, items 7 and 8): GPU profiles, Megatron-style activations with --recompute,
# micro-batches and gradient accumulation, ZeRO-0..3.
#  1. every profile's numbers are in the JSON ("engine": "estimate", "hardware": {...}); cpu is today's model,
#     to the byte; explicit flags override a profile's figures;
#  2. the activations under a GPU profile equal an independent recomputation of docs/cost.md's formula from
#     config.json (Python standard library), for recompute none, selective and full, dense (GQA), MoE (TP-extend
#     and experts cut over tp), MLA (DeepSeek-V3), with and without sequence parallelism, cp = 2, and inference;
#     and none > selective > full;
#  3. per-rank state ZeRO-3 < 2 < 1 < 0;
#  4. --micro-batch / --global-batch: micro-batches = GB / (MB x dp), activations per micro-batch, the step's
#     FLOPs all of them; a batch that does not divide is refused;
#  5. bad values exit 2 with a clear message.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
D=data/configs

# 1. the profiles' numbers
for hw in H100 H200 A100 MI300X h100-80g A100-80GB; do
    out=$("$HP" cost $D/llama-3-8b.json --tp 2 --hardware $hw --format json 2>&1)
    check "--hardware $hw: its numbers in the JSON" python3 - "$hw" "$out" <<'PY'
import json, sys
hw, d = sys.argv[1].upper().split("-")[0], json.loads(sys.argv[2])
want = {"H100": (80, 989e12, 450e9, 50e9), "H200": (141, 989e12, 450e9, 50e9), "A100": (80, 312e12, 300e9, 25e9),
        "MI300X": (192, 1307e12, 448e9, 50e9)}[hw]
h = d["hardware"]
ok = (d["engine"] == "estimate" and h["name"] == hw and h["memory_bytes"] == want[0] << 30 and h["flops"] == want[1]
      and h["intra_bw"] == want[2] and h["inter_bw"] == want[3] and h["ranks_per_node"] == 8 and h["source"]
      and h["activation_bytes"] == 2 and d["model"]["gemm_flops"] == want[1] and d["model"]["bw_intra"] == want[2])
if not ok: print(json.dumps(h))
sys.exit(0 if ok else 1)
PY
done
expect 0 "figures for a bf16 GPU engine (Megatron-style accounting), not hyperpar's runtime" -- \
    "$HP" cost $D/llama-3-8b.json --tp 2 --hardware MI300X --mode train
expect 0 "engine   hyperpar's own runtime" -- "$HP" cost $D/llama-3-8b.json --tp 2
# cpu is today's model: the same figures with and without it
a=$("$HP" cost $D/mixtral-8x7b.json --tp 2 --ep 2 --mode train --format json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["ranks"])')
b=$("$HP" cost $D/mixtral-8x7b.json --tp 2 --ep 2 --mode train --hardware cpu --format json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["ranks"], d["engine"])')
check "--hardware cpu = no --hardware, engine hyperpar" test "$a hyperpar" = "$b"
# explicit flags win over the profile's figures; --mem-per-rank defaults to the profile's memory
out=$("$HP" cost $D/llama-3-8b.json --tp 2 --hardware H100 --gemm-gflops 500 --intra-bw 100 --inter-bw 12.5 \
      --intra-latency-us 7 --ranks-per-node 4 --recompute full --mode train --format json)
check "explicit flags override the profile" python3 -c '
import json, sys
d = json.loads(sys.argv[1]); m = d["model"]; h = d["hardware"]
sys.exit(0 if (m["gemm_flops"], m["bw_intra"], m["bw_inter"], m["lat_intra"], m["ranks_per_node"], m["recompute"],
               h["flops"], h["memory_bytes"]) == (500e9, 100e9, 12.5e9, 7e-6, 4, "full", 500e9, 80 << 30) else 1)' "$out"
expect 0 "budget   80.00 GiB per rank" -- "$HP" cost $D/llama-3-8b.json --tp 2 --hardware H100 --mode train
expect 0 "budget   40.00 GiB per rank" -- "$HP" cost $D/llama-3-8b.json --tp 2 --hardware H100 --mode train --mem-per-rank 40GiB

# 2. the activations against the formula, recomputed here
acts() { # CONFIG RECOMPUTE MODE FLAGS...
    python3 - "$HP" "$@" <<'PY'
import json, subprocess, sys
hp, cfgp, rc, mode = sys.argv[1:5]
flags = sys.argv[5:]
c = json.load(open(cfgp))
def flag(name, dflt):
    return int(flags[flags.index(name) + 1]) if name in flags else dflt
tp, dp, cp, ep = flag("--tp", 1), flag("--dp", 1), flag("--cp", 1), flag("--ep", 1)
B, S, MB = flag("--batch", dp), flag("--seq", 4096), flag("--micro-batch", 0)
sp = "--no-sequence-parallel" not in flags
H, L, V, nh = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["num_attention_heads"]
nkv = c.get("num_key_value_heads", nh)
hd = c.get("head_dim") or H // nh
E = c.get("num_local_experts") or c.get("n_routed_experts") or c.get("num_experts") or 0
K = c.get("num_experts_per_tok", 0)
mI = c.get("moe_intermediate_size") or c["intermediate_size"]
sI = c.get("n_shared_experts", 0) * mI if "n_shared_experts" in c else 0
first_dense = c.get("first_k_dense_replace", 0)
mla = "kv_lora_rank" in c
t = tp
f = t if sp and t > 1 else 1
split = E and t > 1 and ep == 1            # no EP: the experts cut over tp; with --ep (TP-extend) they are whole
b = MB if mode == "train" and MB else B // dp
if mode == "train" and not MB and B % dp == 0: b = 1   # the default micro-batch: 1 row per replica (Megatron's)
S_pad = S                                   # the cases below keep S a multiple of 2 cp
s = S_pad // cp
T = s * b
def attention():
    lh = nh // t
    if mla:
        q = k = lh * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
        v = o = lh * c["v_head_dim"]
        extra = 2 * T * (c.get("q_lora_rank") or 0) + 2 * T * (c["kv_lora_rank"] + c["qk_rope_head_dim"])
    else:
        q, k, v, o = lh * hd, nkv // t * hd, nkv // t * hd, lh * hd
        extra = 0
    return 5 * T * H // f + 2 * T * (q + k + v + o) + extra, 5 * lh * b * s * S_pad
def ffn(l):
    if E and l >= first_dense:
        Tm = T if split else T // f
        mi, si = (mI // t, sI // t) if split else (mI, sI)
        return 5 * T * H // f + 4 * Tm * E + Tm * K * (4 * H + 6 * mi) + 6 * Tm * si
    return 5 * T * H // f + 6 * T * (c["intermediate_size"] // t)
kept = scores = 0
layers = []
for l in range(L):
    a, sc = attention()
    layers.append((a + ffn(l), sc))
Vl = V // t if t > 1 else V
if mode == "train":
    tail = 4 * T * H // f + 4 * T * Vl
    if rc == "none": want = (sum(k + s_ for k, s_ in layers) + tail, 0)
    elif rc == "selective": want = (sum(k for k, _ in layers) + tail, max(s_ for _, s_ in layers))
    else: want = (L * (2 * T * H // f) + tail, max(k + s_ for k, s_ in layers))
else:
    want = (0, max(k + s_ for k, s_ in layers) + 2 * T * Vl)
args = [hp, "cost", cfgp, "--hardware", "H100", "--mode", mode, "--format", "json"] + flags
if mode == "train": args += ["--recompute", rc]
out = subprocess.run(args, capture_output=True, text=True)
if out.returncode: print(out.stderr); sys.exit(1)
d = json.loads(out.stdout)
r = d["ranks"][0]
got = (r["saved_bytes"], r["activation_bytes"])
if got != want: print(cfgp, rc, mode, flags, "got", got, "want", want); sys.exit(1)
print(r["saved_bytes"] + r["activation_bytes"])
PY
}
for cfg_flags in "llama-3-8b.json --tp 2 --dp 2 --batch 4" "llama-3-8b.json --tp 4 --no-sequence-parallel" \
                 "llama-3-8b.json --tp 2 --cp 2 --seq 8192" "mixtral-8x7b.json --tp 2 --ep 2" \
                 "mixtral-8x7b.json --tp 2 --seq 2048" "mixtral-8x7b.json --tp 2 --ep 4 --dp 2 --batch 4 --micro-batch 1" \
                 "deepseek-v3.json --tp 8 --ep 8 --seq 2048" "deepseek-v3.json --tp 4 --ep 32 --dp 8 --seq 1024"; do
    set -- $cfg_flags
    cfg=$1; shift
    prev=""
    for rc in none selective full; do
        v=$(acts $D/$cfg $rc train "$@")
        check "activations = the formula: $cfg $* recompute $rc" test -n "$v"
        [ -n "$v" ] && [ -n "$prev" ] && check "recompute $rc keeps less: $cfg $*" test "$v" -lt "$prev"
        prev=$v
    done
done
v=$(acts $D/llama-3-8b.json none infer --tp 2 --batch 2)
check "inference activations = the formula (one layer + the bf16 logits)" test -n "$v"
v=$(acts $D/deepseek-v3.json none infer --tp 8 --ep 8 --seq 1024)
check "inference activations = the formula (DeepSeek-V3)" test -n "$v"

# 3. ZeRO-3 < 2 < 1 < 0, per rank: weights + gradients + optimizer + master (+ ZeRO-3's gathered layer)
state() { "$HP" cost $D/$1 --hardware "${HW:-H100}" --mode train --format json "${@:2}" | python3 -c '
import json, sys
r = json.load(sys.stdin)["ranks"][0]
print(r["weight_bytes"] + r["grad_bytes"] + r["optim_bytes"] + r["master_bytes"] + r["gather_bytes"], r["gather_bytes"])'; }
for m in "llama-3-8b.json --dp 4 --tp 2" "mixtral-8x7b.json --dp 4 --tp 2 --ep 2"; do
    set -- $m
    prev=""
    for z in 0 1 2 3; do
        read -r v g <<<"$(state "$@" --zero $z)"
        [ -n "$prev" ] && check "ZeRO-$z state < ZeRO-$((z - 1)): $*" test "$v" -lt "$prev"
        prev=$v
    done
    check "ZeRO-3 counts a gathered layer: $*" test "$g" -gt 0
done
# under the runtime model (cpu) too: --zero 2 and 3 are Megatron's byte model
read -r v2 g <<<"$(HW=cpu state llama-3-8b.json --dp 4 --tp 2 --zero 2)"
read -r v3 g <<<"$(HW=cpu state llama-3-8b.json --dp 4 --tp 2 --zero 3)"
check "cpu: ZeRO-3 < ZeRO-2" test "$v3" -lt "$v2"

# 4. micro-batches: GB / (MB x dp); activations per micro-batch; the step's FLOPs all of them
mb() { "$HP" cost $D/llama-3-8b.json --dp 2 --tp 2 --hardware H100 --mode train --format json "$@" | python3 -c '
import json, sys
d = json.load(sys.stdin); r = d["ranks"][0]
print(d["micro_batch"], d["micro_batches"], r["saved_bytes"], r["flops"], r["comm"]["calls"]["all-gather"])'; }
read -r m1 n1 s1 f1 c1 <<<"$(mb --global-batch 16 --micro-batch 1)"
read -r m2 n2 s2 f2 c2 <<<"$(mb --batch 16 --micro-batch 2)"
read -r m8 n8 s8 f8 c8 <<<"$(mb --batch 16 --micro-batch 8)"
read -r m0 n0 s0 f0 c0 <<<"$(mb --batch 16)"
check "micro-batches: 16 / (1 x 2) = 8, 16 / (2 x 2) = 4, 16 / (8 x 2) = 1; default 1 row, 8 of them" \
    test "$m1 $n1 $m2 $n2 $m8 $n8 $m0 $n0 $s0" = "1 8 2 4 8 1 1 8 $s1"
check "activations per micro-batch: MB 2 keeps more than MB 1, less than MB 8" \
    python3 -c "import sys; sys.exit(0 if $s1 < $s2 < $s8 else 1)"
check "the step's FLOPs cover every micro-batch (equal for any MB)" \
    python3 -c "import sys; sys.exit(0 if abs($f1 - $f8) <= 1e-9 * $f8 and abs($f2 - $f8) <= 1e-9 * $f8 else 1)"
check "the step runs each collective once per micro-batch" test "$c1" -eq $((c8 * 8))
expect 2 "the global batch of 10 rows does not divide into micro-batches of 2 rows on each of dp=2 replicas" -- \
    "$HP" cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --batch 10 --micro-batch 2
expect 2 "--micro-batch splits a training step" -- "$HP" cost $D/llama-3-8b.json --tp 2 --micro-batch 1
expect 2 "--batch 8 and --global-batch 16 name the same batch" -- \
    "$HP" cost $D/llama-3-8b.json --tp 2 --mode train --batch 8 --global-batch 16
# --batch alone: the default micro-batch of 1 row per replica (issue 36; formerly one micro-batch of each replica's
# rows, now --micro-batch B/dp)
a=$("$HP" cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --batch 8 --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ranks"])')
b=$("$HP" cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --global-batch 8 --micro-batch 1 --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ranks"])')
check "--batch 8 = --global-batch 8 --micro-batch 1 on dp=2" test "$a" = "$b"

# 5. bad values
expect 2 "--hardware expects cpu, H100 (H100-80G), H200, A100 (A100-80G) or MI300X, got 'foo'" -- \
    "$HP" cost $D/llama-3-8b.json --hardware foo
expect 2 "--hardware expects" -- "$HP" advise $D/llama-3-8b.json --world 8 --hardware H100-40G
expect 2 "--recompute full describes a GPU engine's backward" -- \
    "$HP" cost $D/llama-3-8b.json --mode train --recompute full
expect 2 "--recompute selective describes a GPU engine's backward" -- \
    "$HP" advise $D/llama-3-8b.json --world 8 --mem-per-rank 80GiB --mode train --recompute selective --hardware cpu
expect 2 "--recompute expects none, selective or full, got 'some'" -- \
    "$HP" cost $D/llama-3-8b.json --hardware H100 --recompute some
expect 2 "--zero expects" -- "$HP" cost $D/llama-3-8b.json --mode train --zero 4
expect 2 "--hardware H100 describes another engine" -- \
    "$HP" cost $D/llama-3-8b.json --mode train --hardware H100 --train-state runtime
expect 2 "--measure-gemm measures this machine's CPU" -- "$HP" cost $D/llama-3-8b.json --hardware A100 --measure-gemm
finish

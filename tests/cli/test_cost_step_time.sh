# hyperpar cost's step time under a GPU profile (issue 39, item 5, without pipeline parallelism; docs/cost.md
# "FLOPs and step time"):
#  1. recompute is priced: --recompute none < selective < full, and the FLOPs are 3 x the forward plus what the
#     backward repeats (selective: the attention core, full: the whole forward);
#  2. the efficiencies: --gemm-eff 0.5 doubles t_compute against --gemm-eff 1, the profile's own (H100: 0.75, 0.8)
#     are in the JSON, --link-eff scales every collective's bandwidth term, and a fraction outside (0, 1] is refused;
#  3. the dp gradient reduction overlaps the backward: t_step = t_compute + t_exposed + t_bubble, t_bubble 0;
#  4. MFU: printed, in (0, 1], model_flops / (slowest t_step x world x peak), and model_flops = mfu.c's 6·W·T plus
#     the attention scores' 12·L·heads·head_dim·S per token;
#  5. the cpu profile is unchanged: the figures of a training step equal those before this work (golden numbers
#     from the commit before it), t_step = t_compute + t_comm, nothing overlapped, no recompute;
#  6. the predictions docs/cost.md compares with llm-foundry's published MPT-7B runs are the ones cost prints.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
C=data/configs/llama-3-8b.json

cost_json() { # OUT FLAGS...
    local out="$1"
    shift
    "$HP" cost "$C" --format json "$@" >"$WORK/$out" 2>"$WORK/$out.err"
}

GPU=(--hardware H100 --mode train --tp 8 --dp 4 --batch 32 --seq 4096)
for r in none selective full; do
    check "cost --recompute $r runs" cost_json "rc_$r.json" "${GPU[@]}" --recompute "$r"
done
check "gemm-eff 0.5 runs" cost_json eff05.json "${GPU[@]}" --gemm-eff 0.5
check "gemm-eff 1 runs" cost_json eff1.json "${GPU[@]}" --gemm-eff 1
check "link-eff 0.4 runs" cost_json link04.json "${GPU[@]}" --link-eff 0.4
check "cpu train runs" cost_json cpu.json --mode train --tp 2 --dp 2 --batch 4 --seq 512
check "gpu inference runs" cost_json infer.json --hardware H100 --tp 8 --batch 1 --seq 4096

check "step times, efficiencies, overlap and MFU" python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
ld = lambda n: json.load(open(f"{w}/{n}"))
fails = []
def want(cond, what):
    if not cond: fails.append(what)

rc = {r: ld(f"rc_{r}.json") for r in ("none", "selective", "full")}
t = {r: rc[r]["ranks"][0]["t_step"] for r in rc}
want(t["none"] < t["selective"] < t["full"], f"recompute: t_step none < selective < full, got {t}")
for r, j in rc.items():
    for k in j["ranks"]:
        fwd = (k["flops"] - k["recompute_flops"]) / 3
        rf = {"none": 0, "selective": k["attn_flops"], "full": fwd}[r]
        want(abs(k["recompute_flops"] - rf) <= 1e-9 * k["flops"], f"{r}: rank {k['rank']} recompute_flops {k['recompute_flops']} != {rf}")
        want(k["attn_flops"] > 0, f"{r}: attn_flops {k['attn_flops']}")

hw = rc["none"]["hardware"]
want(hw["gemm_eff"] == 0.75 and hw["link_eff"] == 0.8 and hw["eff_source"], f"H100's efficiencies: {hw}")

a, b = ld("eff05.json")["ranks"][0], ld("eff1.json")["ranks"][0]
want(abs(a["t_compute"] - 2 * b["t_compute"]) <= 1e-12 * a["t_compute"],
     f"--gemm-eff 0.5 t_compute {a['t_compute']} is not twice --gemm-eff 1's {b['t_compute']}")
want(a["flops"] == b["flops"], "the efficiency changes the time, not the FLOPs")

base, lk = rc["selective"], ld("link04.json")
for e0, e1 in zip(base["events"], lk["events"]):
    if e0["seconds"] > 0: want(e1["seconds"] > e0["seconds"], f"--link-eff 0.4: {e1} not slower than {e0}")

for name, j in list(rc.items()) + [("eff05", ld("eff05.json"))]:
    gf, world = j["model"]["gemm_flops"], j["world"]
    slow = max(k["t_step"] for k in j["ranks"])
    want(0 < j["mfu"] <= 1, f"{name}: mfu {j['mfu']} outside (0, 1]")
    want(abs(j["mfu"] - j["model_flops"] / (slow * world * gf)) <= 1e-12, f"{name}: mfu is not model_flops / (t_step x world x peak)")
    for k in j["ranks"]:
        want(0 < k["mfu"] <= 1, f"{name}: rank {k['rank']} mfu {k['mfu']}")
        want(k["t_bubble"] == 0, f"{name}: t_bubble {k['t_bubble']} (no pipeline parallelism)")
        want(k["t_step"] == k["t_compute"] + k["t_exposed"] + k["t_bubble"], f"{name}: t_step != t_compute + t_exposed + t_bubble")
        bwd = (k["flops"] - (k["flops"] - k["recompute_flops"]) / 3) / (gf * j["model"]["gemm_eff"])
        dp = sum(e["seconds"] for e in j["events"] if e["axis"] in ("dp", "edp")) if k["rank"] == j["events_rank"] else k["t_overlap"]
        want(abs(k["t_overlap"] - dp) <= 1e-12 * max(dp, 1e-30), f"{name}: t_overlap {k['t_overlap']} != the dp events' {dp}")
        want(abs(k["t_exposed"] - (k["t_comm"] - min(k["t_overlap"], bwd))) <= 1e-12 * k["t_comm"], f"{name}: t_exposed")
        want(k["t_overlap"] > 0 and k["t_exposed"] < k["t_comm"], f"{name}: dp=4 has a gradient reduction to hide")
# model FLOPs: mfu.c's 6·W·T (W: the GEMM weights one token goes through) plus the attention scores'
c = json.load(open("data/configs/llama-3-8b.json"))
H, L, V, I = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
hd = H // nh
W = L * (2 * H * hd * (nh + nkv) + 3 * H * I) + V * H
B, S = 32, 4096
mf = 6 * W * B * S + 3 * 4 * nh * hd * S * S * B * L
want(abs(rc["none"]["model_flops"] - mf) <= 1e-9 * mf, f"model_flops {rc['none']['model_flops']} != {mf}")
# recompute none: the ranks compute exactly the model FLOPs between them (tp=8 splits every GEMM and head)
want(abs(sum(k["flops"] for k in rc["none"]["ranks"]) - mf) <= 1e-6 * mf, "none: the ranks' FLOPs are the model's")

inf = ld("infer.json")
want("mfu" not in inf and "mfu" not in inf["ranks"][0], "inference prints no MFU")
want(inf["ranks"][0]["t_step"] == inf["ranks"][0]["t_compute"] + inf["ranks"][0]["t_comm"], "inference overlaps nothing")

# the cpu profile: golden figures of the commit before this work (9101105), every rank
cpu = ld("cpu.json")
gold = (23466627563520, 234.6662756352, 1.8798106064000009, 236.54608624160002)
for k in cpu["ranks"]:
    f, tc, tm, ts = gold
    want((k["flops"], k["t_compute"], k["t_comm"], k["t_step"]) == (f, tc, tm, ts),
         f"cpu rank {k['rank']}: {(k['flops'], k['t_compute'], k['t_comm'], k['t_step'])} != {(f, tc, tm, ts)}")
    want(k["t_step"] == k["t_compute"] + k["t_comm"] and k["t_overlap"] == 0 and k["recompute_flops"] == 0,
         "cpu: nothing overlapped, no recompute")
want(cpu["hardware"]["gemm_eff"] == 1 and cpu["hardware"]["link_eff"] == 1, "cpu's efficiencies are 1")
want(0 < cpu["mfu"] <= 1, f"cpu mfu {cpu['mfu']}")
for f in fails: print("  ", f)
sys.exit(1 if fails else 0)
PY

# docs/cost.md's check against llm-foundry's published MPT-7B runs (FSDP, 8 GPUs, no pipeline): the predictions the
# table prints, for MPT-7B as a llama-shaped config of the same FLOPs (its 2·H·4H MLP as a gated 3·H·10923)
cat >"$WORK/mpt-7b-shape.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 10923,
 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 50432,
 "tie_word_embeddings": true, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-05, "max_position_embeddings": 4096,
 "hidden_act": "silu"}
JSON
mpt() { # HARDWARE RECOMPUTE BATCH MICRO SEQ TOKENS/S/GPU MFU
    "$HP" cost "$WORK/mpt-7b-shape.json" --mode train --dp 8 --zero 3 --hardware "$1" --recompute "$2" --batch "$3" \
        --micro-batch "$4" --seq "$5" --format json | python3 -c '
import json, sys
j = json.load(sys.stdin)
t = max(k["t_step"] for k in j["ranks"])
tok = j["batch"] * j["seq"] / j["world"] / t
sys.exit(0 if round(tok) == int(sys.argv[1]) and abs(j["mfu"] - float(sys.argv[2])) < 5e-4 else 1)' "$6" "$7"
}
check "MPT-7B H100 seq 2048: 17,204 tokens/s/GPU, MFU 75.0%" mpt H100 none 48 6 2048 17204 0.75
check "MPT-7B A100 seq 2048: 5,789 tokens/s/GPU, MFU 80.0%" mpt A100 none 96 6 2048 5789 0.80
check "MPT-7B H100 seq 4096, full recompute: 12,006 tokens/s/GPU, MFU 56.3%" mpt H100 full 256 16 4096 12006 0.5625

# the text prints the efficiencies, the overlap, the bubble and MFU
expect 0 "75% of 9.89e+05" -- "$HP" cost "$C" "${GPU[@]}"
expect 0 "pipeline bubble 0 ms" -- "$HP" cost "$C" "${GPU[@]}"
expect 0 "of dp gradient reduction beside the backward" -- "$HP" cost "$C" "${GPU[@]}"
expect 0 "MFU*: " -- "$HP" cost "$C" "${GPU[@]}"
expect 0 "with full recompute" -- "$HP" cost "$C" "${GPU[@]}" --recompute full
# a fraction outside (0, 1] is refused, saying what to give
expect 2 "--gemm-eff expects a fraction in (0, 1]" -- "$HP" cost "$C" "${GPU[@]}" --gemm-eff 1.5
expect 2 "--link-eff expects a fraction in (0, 1]" -- "$HP" cost "$C" "${GPU[@]}" --link-eff 0
# advise shares the settings: a lower GEMM efficiency makes its best step slower
check "advise takes --gemm-eff" bash -c "
    a=\$('$HP' advise '$C' --world 8 --hardware H100 --mode train --batch 8 --seq 4096 --format json --gemm-eff 0.5)
    b=\$('$HP' advise '$C' --world 8 --hardware H100 --mode train --batch 8 --seq 4096 --format json --gemm-eff 1)
    python3 -c 'import json,sys; a,b=(json.loads(x) for x in sys.argv[1:]); ta={c[\"mesh\"]: c[\"t_compute\"] for c in a[\"candidates\"] if c.get(\"ok\")}; tb={c[\"mesh\"]: c[\"t_compute\"] for c in b[\"candidates\"] if c.get(\"ok\")}; sys.exit(0 if ta and all(abs(ta[k]-2*tb[k])<=1e-12*ta[k] for k in ta if k in tb) else 1)' \"\$a\" \"\$b\""
finish

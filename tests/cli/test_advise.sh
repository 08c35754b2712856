# hyperpar advise: every mesh of N ranks, rejected ones with the reason, the accepted ranked; each accepted
# candidate (the template plan's cost at its sizes) agrees with `hyperpar cost` on its own plan: weight bytes,
# sent bytes (into collectives of more than one rank) and wire bytes (over links, ring algorithms) exactly, activations within 2% — for dense and MoE families, TP-extend-EP and the ep axis,
# inference and training. Rejections: tp vs heads, ep vs experts, memory, TP across nodes, the batch vs dp. No mesh
# fitting is exit 2 (the report still printed); --mem-per-rank needs a unit; --ranks-per-node divides the world.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
agree() {
    python3 - "$HP" "$@" <<'PY'
import json, os, subprocess, sys
hp, model, N = sys.argv[1], sys.argv[2], sys.argv[3]
need_cut = os.environ.get("NEED_CUT") == "1"  # the experts cut over tp must be among the accepted: tp>1 without EP, ep axis with tp>1
extra = sys.argv[4:]
adv = json.loads(subprocess.run([hp, "advise", model, "--world", N, "--mem-per-rank", "1TB", "--format", "json"] + extra,
                                capture_output=True, text=True, check=True).stdout)
bad = n = noep = axis = 0
for c in adv["candidates"]:
    if not c["ok"]:
        continue
    n += 1
    noep += c["tp"] > 1 and c["ep"] < 2
    axis += c["tp"] > 1 and c["ep_axis"]
    pp = c["pp"]
    if c["ep_axis"]:
        fl = ["--mesh", ("pp=%d," % pp if pp > 1 else "") + "dp=%d,cp=%d,tp=%d,ep=%d" % (c["dp"], c["cp"], c["tp"], c["ep"]),
              "--ep-axis"]
    else:
        fl = ["--dp", str(c["dp"]), "--cp", str(c["cp"]), "--tp", str(c["tp"])] + (["--ep", str(c["ep"])] if c["ep"] > 1 else [])
        fl += ["--pp", str(pp)] if pp > 1 else []
    fl += ["--pp-virtual", str(c["pp_virtual"])] if c["pp_virtual"] > 1 else []
    r = subprocess.run([hp, "cost", model, "--format", "json"] + fl + extra, capture_output=True, text=True)
    if r.returncode:
        print("cost refused", c["mesh"], r.stderr.strip()[:300]); bad += 1; continue
    k = json.loads(r.stdout)
    per = len(k["ranks"]) // pp  # advise evaluates the first and the last rank of every stage
    ends = [q for q in k["ranks"] if q["rank"] % per in (0, per - 1)]
    mx = max(k["ranks"], key=lambda q: q["total_bytes"])
    w = max(q["weight_bytes"] for q in k["ranks"]) if pp == 1 else mx["weight_bytes"]
    sent = max(q["sent_bytes"] for q in ends)
    wire = max(q["wire_bytes"] for q in ends)
    if not (w == c["weight_bytes"] and sent == c["sent_bytes"] and wire == c["wire_bytes"] and
            abs(mx["activation_bytes"] - c["activation_bytes"]) <= 0.02 * mx["activation_bytes"]):
        bad += 1
        print("MISMATCH", c["mesh"], "weights", w, c["weight_bytes"], "sent", sent, c["sent_bytes"], "wire", wire,
              c["wire_bytes"],
              "act", mx["activation_bytes"], c["activation_bytes"])
print(n, "candidates checked against their own plans,", bad, "disagree;", noep, "cut over tp without EP,", axis,
      "on an ep axis with tp")
if need_cut and not (noep and axis):
    print("MISSING experts cut over tp among the accepted"); bad += 1
sys.exit(0 if n > 0 and bad == 0 else 1)
PY
}
agree_cut() { local NEED_CUT=1; export NEED_CUT; agree "$@"; }
check "advise = cost: llama 8" agree $F/llama 8 --batch 8 --seq 32
check "advise = cost: qwen2 tied 4" agree $F/qwen2 4 --batch 4 --seq 16
check "advise = cost: llama train" agree $F/llama 4 --batch 4 --seq 16 --mode train --zero 1
check "advise = cost: qwen3_moe" agree $F/qwen3_moe 4 --batch 4 --seq 16 --overrides data/overrides/qwen3_moe_ep.yaml
check "advise = cost: deepseek_v3" agree $F/deepseek_v3 4 --batch 4 --seq 16 \
    --overrides data/overrides/deepseek_v3_forward_ep.yaml
# The experts cut over tp (tp > 1 without EP; an ep axis with tp > 1): accepted and equal to cost's own plan, for
# mixtral, the shared-expert families and a fused gate/up (which needs --packed-fused to be cut over tp).
check "advise = cost: mixtral, experts cut over tp" agree_cut $F/mixtral 4 --batch 4 --seq 16
check "advise = cost: qwen2_moe (shared expert), experts cut over tp" agree_cut $F/qwen2_moe 4 --batch 4 --seq 16
check "advise = cost: deepseek_v3 (shared expert), experts cut over tp" agree_cut $F/deepseek_v3 4 --batch 4 \
    --seq 16
check "advise = cost: qwen3_moe packed, experts cut over tp" agree_cut $F/qwen3_moe 4 --batch 4 --seq 16 \
    --packed-fused
check "advise = cost: glm4_moe packed train, experts cut over tp" agree_cut $F/glm4_moe 4 --batch 4 --seq 16 \
    --packed-fused --mode train --zero 1
# Without --packed-fused the planner refuses to cut qwen3_moe's fused gate/up over tp: those meshes carry its reason.
expect 0 "the planner refuses a plan that cuts the experts over tp without EP: 2 fused gate/up" -- "$HP" advise \
    $F/qwen3_moe --world 4 --mem-per-rank 1TB --batch 4 --seq 16
expect 0 "the planner refuses a plan that cuts the experts over tp on an ep axis" -- "$HP" advise \
    $F/qwen3_moe --world 4 --mem-per-rank 1TB --batch 4 --seq 16
check "advise = cost: gpt_oss" agree $F/gpt_oss 4 --batch 4 --seq 16 --overrides data/overrides/gpt_oss_ep.yaml
# Reasons.
L3=data/configs/llama-3-8b.json
# The bytes: what a rank puts into collectives (sent) and what the ring sends over links (wire), the JSON without
# the old name net_bytes.
expect 0 "sent/step   wire/step" -- "$HP" advise $L3 --world 8 --mem-per-rank 80GB --seq 4096
check "advise JSON: sent_bytes and wire_bytes, no net_bytes" bash -c "'$HP' advise $L3 --world 8 --mem-per-rank 80GB \
    --seq 4096 --format json | python3 -c 'import json,sys; c=[c for c in json.load(sys.stdin)[\"candidates\"] if c[\"ok\"]]; \
    sys.exit(0 if c and all(\"wire_bytes\" in x and \"sent_bytes\" in x and \"net_bytes\" not in x for x in c) else 1)'"
expect 0 "num_key_value_heads (8) is not divisible by tp (16)" -- "$HP" advise $L3 --world 16 --mem-per-rank 80GB --seq 4096 \
    --batch 1
expect 0 "the most-loaded rank needs" -- "$HP" advise $L3 --world 2 --mem-per-rank 12GB --seq 4096 --batch 1
expect 0 "does not fit inside a node of 4 ranks" -- "$HP" advise $L3 --world 8 --mem-per-rank 80GB --ranks-per-node 4
expect 0 "replicas but the batch has 1 rows" -- "$HP" advise $L3 --world 4 --mem-per-rank 80GB --batch 1
# The default batch is what --help says: a row per rank (N rows), the same for every candidate, so the dp > 1
# meshes are ranked, not all rejected for the batch (it was 1 row).
MX=data/configs/mixtral-8x7b.json
expect 0 "one row per rank, N rows" -- "$HP" advise --help
expect 0 "batch 8 x 4096" -- "$HP" advise $MX --world 8 --mem-per-rank 80GiB
check "default batch: dp > 1 meshes accepted, none rejected for the batch" bash -c "'$HP' advise $MX --world 8 \
    --mem-per-rank 80GiB --format json | python3 -c 'import json,sys; d=json.load(sys.stdin); c=d[\"candidates\"]; \
    sys.exit(0 if d[\"batch\"] == 8 and any(x[\"ok\"] and x[\"dp\"] > 1 for x in c) and \
    not any(\"rows\" in x.get(\"reason\", \"\") for x in c) else 1)'"
expect 0 "batch 8 x 4096," -- "$HP" bench advise $L3 --world 8 --reps 1
# Ties broken as printed: down the list, the printed step time never goes down (mixtral at 8 ranks ties at 3
# digits; llama at 16 used to print #1 44.9 s above #2 44.6 s).
monotone() {
    "$HP" advise "$@" --top 1000 | python3 -c '
import re, sys
u = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
t = [float(m.group(1)) * u[m.group(2)] for m in (re.search(r"([0-9.e+]+) (s|ms|us)$", l.rstrip()) for l in sys.stdin
     if re.match(r"\s+\d+\s+dp=", l)) if m]
print(len(t), "rows", t[:6])
sys.exit(0 if len(t) > 1 and all(a <= b for a, b in zip(t, t[1:])) else 1)'
}
check "ties as printed: mixtral 8" monotone $MX --world 8 --mem-per-rank 80GiB
check "ties as printed: llama 16 (the README example)" monotone $L3 --world 16 --mem-per-rank 24GB --seq 4096 \
    --ranks-per-node 8 --batch 1
check "ties as printed: deepseek-v3 64" monotone data/configs/deepseek-v3.json --world 64 --mem-per-rank 1TB --seq 1024
# "TP-extend" only where tp > 1: at tp = 1 the EP group rides on dp and nothing is extended.
check "no TP-extend at tp=1" bash -c "out=\$('$HP' advise $MX --world 8 --mem-per-rank 1TB --top 1000) && \
    grep -q 'tp=2 ep=8 (TP-extend)' <<<\"\$out\" && grep -q 'tp=1 ep=8  ' <<<\"\$out\" && \
    ! grep -q 'tp=1 ep=[0-9]* (TP-extend)' <<<\"\$out\""
# A config.json has no weights: the printed shard command names a CHECKPOINT placeholder and says why, never the
# config itself (which shard cannot read).
expect 0 "hyperpar shard CHECKPOINT --plan plan.json" -- "$HP" advise $MX --world 8 --mem-per-rank 80GiB
expect 0 "MODEL is a config.json: shard needs the checkpoint folder" -- "$HP" advise $MX --world 8 --mem-per-rank 80GiB
check "config.json: no shard command on the config, JSON note" bash -c "'$HP' advise $MX --world 8 --mem-per-rank 80GiB \
    --format json | python3 -c 'import json,sys; c=[x for x in json.load(sys.stdin)[\"candidates\"] if x[\"ok\"]]; \
    sys.exit(0 if c and all(\"shard CHECKPOINT\" in x[\"command\"] and \"shard $MX\" not in x[\"command\"] and \
    \"checkpoint\" in x[\"command_note\"] for x in c) else 1)'"
check "checkpoint: the shard command names it, no note" bash -c "out=\$('$HP' advise $F/llama --world 4 --mem-per-rank 1GB \
    --batch 4 --seq 16) && grep -q 'hyperpar shard $F/llama --plan' <<<\"\$out\" && ! grep -q CHECKPOINT <<<\"\$out\""
expect 0 "make the plan and the shards of #1" -- "$HP" advise $L3 --world 8 --mem-per-rank 80GB --seq 4096
expect 0 "num_experts (8) must be divisible" -- "$HP" advise data/configs/mixtral-8x7b.json --world 16 --mem-per-rank 80GB \
    --seq 4096 --top 3 --batch 1
# No mesh fits: the report (every reason) still printed, but exit 2 with the nearest miss on stderr.
expect 2 "no mesh of 2 ranks fits; the reasons follow" -- "$HP" advise $L3 --world 2 --mem-per-rank 1GB
expect 2 "hyperpar: error: no mesh of 2 ranks fits in 953.67 MiB per rank (all 4 rejected; the nearest: the most-loaded" \
    -- "$HP" advise $L3 --world 2 --mem-per-rank 1GB
expect 2 "no mesh of 4 ranks fits" -- "$HP" advise $L3 --world 4 --mem-per-rank 1GB --format json
check "no fit: the JSON report is still written whole" bash -c "! '$HP' advise $L3 --world 2 --mem-per-rank 1GB --format json \
    -o '$WORK/none.json' 2>/dev/null && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); \
    sys.exit(0 if d[\"candidates\"] and not any(c[\"ok\"] for c in d[\"candidates\"]) else 1)' '$WORK/none.json'"
expect 0 "accepted" -- "$HP" advise $L3 --world 2 --mem-per-rank 80GB
expect 0 "(ep axis)" -- "$HP" advise data/configs/qwen3-30b-a3b.json --world 8 --mem-per-rank 80GB --format json --batch 1
# The printed command makes that plan.
cmd=$("$HP" advise $F/llama --world 4 --mem-per-rank 1GB --batch 4 --seq 16 | grep -A1 "shards of #1" | tail -1 |
      sed "s# plan.json# $WORK/plan.json#g; s#--out shards#--out $WORK/shards#; s#hyperpar #$HP #g")
check "the printed command runs" bash -c "$cmd >/dev/null 2>&1 && test -f $WORK/plan.json && test -d $WORK/shards"
# DeepSeek-V3 at 256 ranks: every mesh, well under a second (the time is printed, not asserted here: benchmarks
# measure; bench advise prints it against one plan).
expect 0 "1485 considered" -- "$HP" advise data/configs/deepseek-v3.json --world 256 --mem-per-rank 80GB --seq 4096 \
    --batch 1
expect 0 "advise, per mesh" -- "$HP" bench advise data/configs/deepseek-v3.json --world 256 --seq 4096 --reps 1
out=$("$HP" bench advise data/configs/deepseek-v3.json --world 8 --seq 4096 --reps 3 2>&1)
check "bench advise: the load line" grep -q "^  load: 1-minute load average .* at start, .* at end (" <<<"$out"
check "bench advise: best <= median <= max" python3 -c '
import re, sys
found = re.findall(r"([0-9.]+) ms   \(.*best of 3; median ([0-9.]+), max ([0-9.]+)\)", sys.stdin.read())
assert len(found) == 2, found  # one plan, advise per mesh
for f in found:
    best, med, hi = map(float, f)
    assert best <= med <= hi, f' <<<"$out"
# Usage errors.
expect 2 "missing --world" -- "$HP" advise $L3 --mem-per-rank 80GB
expect 2 "missing --mem-per-rank" -- "$HP" advise $L3 --world 8
expect 2 "expects a size" -- "$HP" advise $L3 --world 8 --mem-per-rank lots
# A size needs its unit: a bare 80 is not taken as 80 bytes (that rejected every mesh, exit 0).
expect 2 "--mem-per-rank 80 has no unit; write 80GB" -- "$HP" advise $L3 --world 8 --mem-per-rank 80
expect 2 "has no unit" -- "$HP" advise $L3 --world 8 --mem-per-rank 0.5
expect 2 "has no unit" -- "$HP" cost $L3 --tp 2 --mem-per-rank 4096
expect 2 "expects a size" -- "$HP" advise $L3 --world 8 --mem-per-rank 0B
expect 2 "expects a size" -- "$HP" advise $L3 --world 8 --mem-per-rank -80GB
expect 2 "past what 64 bits" -- "$HP" advise $L3 --world 8 --mem-per-rank 1e10TB
expect 0 "80.00 GiB per rank" -- "$HP" advise $L3 --world 8 --mem-per-rank 80GiB --seq 4096
expect 0 "80.00 GiB per rank" -- "$HP" advise $L3 --world 8 --mem-per-rank 80G --seq 4096
expect 0 "74.51 GiB per rank" -- "$HP" advise $L3 --world 8 --mem-per-rank 80GB --seq 4096
expect 2 "the most-loaded rank needs" -- "$HP" advise $L3 --world 8 --mem-per-rank 4096B
# --ranks-per-node tiles the world in whole nodes (or holds it all).
expect 2 "--ranks-per-node 3 does not divide --world 8" -- "$HP" advise $L3 --world 8 --mem-per-rank 80GB \
    --ranks-per-node 3
expect 2 "--ranks-per-node 3 does not divide --world 8" -- "$HP" bench advise $L3 --world 8 --ranks-per-node 3
expect 2 "--ranks-per-node 4 does not divide the world of 6 ranks" -- "$HP" cost $L3 --dp 3 --tp 2 --ranks-per-node 4
expect 0 "16 ranks per node" -- "$HP" advise $L3 --world 8 --mem-per-rank 80GB --ranks-per-node 16 --seq 4096
expect 0 "2 ranks per node" -- "$HP" advise $L3 --world 8 --mem-per-rank 80GB --ranks-per-node 2 --seq 4096
expect 0 "most-loaded rank" -- "$HP" cost $L3 --dp 3 --tp 2 --ranks-per-node 3
expect 2 "" -- "$HP" advise $L3 --world 0 --mem-per-rank 80GB
expect 0 "usage: hyperpar advise" -- "$HP" advise --help
finish

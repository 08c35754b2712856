# hyperpar cost --mode decode (serving): one new token per sequence against a KV cache of --context positions.
# The KV cache per rank equals an independent recomputation from config.json (standard attention with GQA, MLA's
# latent cache, sliding-window layers capped at their window) at tp=1, tp=2 and cp=2; the sequences that fit grow
# with --mem-per-rank and follow their formula; a large model's step is memory-bound and t_step is
# max(compute, memory) + communication; the decode walk's collectives equal what `hyperpar run --stats-json`
# counts for B rows of one token; bad input exits 2.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
C=data/configs
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"

# kv_check CONFIG COST_JSON TP CP CONTEXT BATCH: every rank's kv_seq_bytes and kv_cache_bytes as recomputed here.
kv_check() {
    python3 - "$@" <<'PY'
import json, math, sys
cfg_path, cost_path, tp, cp, ctx, batch = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
c = json.load(open(cfg_path)); cost = json.load(open(cost_path))
L = c["num_hidden_layers"]
# the window of each layer, as transformers reads these configs: explicit layer_types; else Mistral's
# sliding_window on every layer; Qwen2's only with use_sliding_window (false in these configs)
types = c.get("layer_types")
W = c.get("sliding_window") or 0
if types:
    win = [W if t == "sliding_attention" else 0 for t in types]
elif c["model_type"] == "mistral":
    win = [W] * L
else:
    win = [0] * L
def positions(l):
    n = min(ctx, win[l]) if win[l] else ctx
    return -(-n // cp)
kvb = 2
if c.get("kv_lora_rank"):
    width = c["kv_lora_rank"] + c["qk_rope_head_dim"]  # the latent and the rope key, whole on every tp rank
else:
    nkv = c.get("num_key_value_heads") or c["num_attention_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    width = 2 * (nkv // tp) * hd
per_seq = sum(positions(l) * width for l in range(L)) * kvb
dp = cost["world"] // (tp * cp)
ok = cost["mode"] == "decode" and cost["context"] == ctx and cost["seq"] == 1
ok = ok and dp == 1  # the cases below: every rank holds all the batch's sequences
for r in cost["ranks"]:
    rows = batch
    if r["kv_seq_bytes"] != per_seq or r["kv_cache_bytes"] != rows * per_seq:
        ok = False
        print("rank", r["rank"], "kv_seq", r["kv_seq_bytes"], "expected", per_seq, "kv", r["kv_cache_bytes"],
              "expected", rows * per_seq)
sys.exit(0 if ok else 1)
PY
}
n=0
# config  mesh flags  (context, batch)
while read -r cfg ctx batch flags; do
    n=$((n + 1))
    tp=1; cp=1
    case "$flags" in *"--tp 2"*) tp=2 ;; esac
    case "$flags" in *"--cp 2"*) cp=2 ;; esac
    "$HP" cost $cfg $flags --mode decode --context $ctx --batch $batch --format json -o "$WORK/k$n.json" \
        2>"$WORK/k$n.err"
    check "decode KV = recomputed: $cfg $flags C=$ctx B=$batch" kv_check $cfg "$WORK/k$n.json" $tp $cp $ctx $batch
done <<'LIST'
data/forward/llama/config.json 100 3 --tp 1
data/forward/llama/config.json 100 3 --tp 2
data/forward/llama/config.json 101 2 --cp 2
data/configs/llama-3-8b.json 8192 4 --tp 1
data/configs/llama-3-8b.json 8192 4 --tp 2
data/configs/llama-3-8b.json 8191 4 --cp 2
data/configs/qwen2.5-7b.json 40000 2 --tp 2
data/configs/qwen2.5-7b.json 40000 2 --cp 2
data/configs/deepseek-v3.json 4096 1 --tp 1
data/configs/deepseek-v3.json 4096 1 --tp 2
data/configs/deepseek-v3.json 4097 1 --cp 2
data/forward/mistral/config.json 50 2 --tp 1
data/forward/mistral/config.json 5 2 --tp 2
data/forward/mistral/config.json 50 2 --cp 2
data/configs/gpt-oss-20b.json 4096 2 --tp 1
data/configs/gpt-oss-20b.json 100 2 --tp 2
data/configs/gpt-oss-20b.json 4096 2 --cp 2
LIST
# --context's default: the --seq given, else 4096; infer mode caps sliding layers at their window too
expect 0 '"context": 777' -- "$HP" cost $F/llama --mode decode --seq 777 --format json
expect 0 '"context": 4096' -- "$HP" cost $F/llama --mode decode --format json
"$HP" cost $F/mistral --batch 1 --seq 64 --format json -o "$WORK/inf.json"
check "infer: a sliding layer's cache is its window" python3 -c "
import json, sys; r = json.load(open('$WORK/inf.json'))['ranks'][0]
sys.exit(0 if r['kv_cache_bytes'] == 2 * 2 * 8 * 2 * 12 * 2 == r['kv_seq_bytes'] else 1)"

# The sequences that fit: floor((budget - weights - activations) / KV per sequence), times dp; monotone in the budget
for b in 20GB 40GB 80GB 160GB; do
    "$HP" cost $C/llama-3-8b.json --dp 2 --tp 2 --mode decode --context 8192 --mem-per-rank $b --format json \
        -o "$WORK/fit_$b.json"
done
check "sequences that fit follow the formula and grow with --mem-per-rank" python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]; prev = -1; ok = True
for b, v in (("20GB", 20e9), ("40GB", 40e9), ("80GB", 80e9), ("160GB", 160e9)):
    c = json.load(open(f"{w}/fit_{b}.json"))
    per = [max(0, (int(v) - r["weight_bytes"] - r["activation_bytes"]) // r["kv_seq_bytes"]) for r in c["ranks"]]
    for r, p in zip(c["ranks"], per):
        ok &= r["seqs_fit"] == p
    ok &= c["seqs_fit"] == min(per) * 2 and c["seqs_fit"] > prev
    prev = c["seqs_fit"]
print("seqs", prev) if not ok else None
sys.exit(0 if ok and prev > 0 else 1)
PY
expect 0 "needs --mem-per-rank" -- "$HP" cost $C/llama-3-8b.json --mode decode
expect 0 '"seqs_fit": null' -- "$HP" cost $C/llama-3-8b.json --mode decode --format json
expect 0 "sequences that fit in 74.51 GiB per rank:" -- "$HP" cost $C/llama-3-8b.json --mode decode --mem-per-rank 80GB
# a budget the weights alone pass: 0 sequences
expect 0 '"seqs_fit": 0' -- "$HP" cost $C/llama-3-8b.json --mode decode --mem-per-rank 10GB --format json

# The step: a large model's decode is memory-bound, positive, max(compute, memory) + communication, and the memory
# term is the reads over --mem-bw
"$HP" cost $C/llama-3-8b.json --tp 2 --mode decode --batch 1 --format json -o "$WORK/t1.json"
"$HP" cost $C/llama-3-8b.json --tp 2 --mode decode --batch 1 --mem-bw 40 --format json -o "$WORK/t2.json"
check "decode step: memory-bound, max(compute, memory) + comm" python3 - "$WORK" <<'PY'
import json, sys
a = json.load(open(sys.argv[1] + "/t1.json")); b = json.load(open(sys.argv[1] + "/t2.json"))
ok = a["model"]["mem_bw"] == 10e9 and b["model"]["mem_bw"] == 40e9
for r, q in zip(a["ranks"], b["ranks"]):
    ok &= r["t_step"] > 0 and r["t_memory"] > r["t_compute"] > 0
    ok &= r["t_step"] == max(r["t_compute"], r["t_memory"]) + r["t_comm"]
    ok &= r["t_memory"] == r["read_bytes"] / 10e9 and q["t_memory"] == q["read_bytes"] / 40e9
    # the weights without the embedding table (128256 x 4096 bf16, cut over tp), plus the whole KV cache
    ok &= r["read_bytes"] == r["weight_bytes"] - 128256 * 4096 * 2 // 2 + r["kv_cache_bytes"]
sys.exit(0 if ok else 1)
PY
# MoE: the experts no slot reaches are not read (DeepSeek-V3, 1 token: 8 of 256 experts)
"$HP" cost $C/deepseek-v3.json --tp 8 --ep 8 --ep-compute suggested --mode decode --batch 1 --format json \
    -o "$WORK/ds.json"
check "MoE decode reads a fraction of the experts" python3 -c "
import json, sys; r = json.load(open('$WORK/ds.json'))['ranks'][0]
sys.exit(0 if r['read_bytes'] < r['weight_bytes'] / 4 and r['t_memory'] > r['t_compute'] else 1)"

# The decode walk's collectives are what `hyperpar run` counts for B rows of one token
same_comm() {
    python3 - "$1" "$2" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); cost = json.load(open(sys.argv[2]))
ok = run["world"] == cost["world"] == len(cost["ranks"]) == len(run["ranks"]) and cost["mode"] == "decode"
for a, b in zip(run["ranks"], cost["ranks"]):
    if a["bytes"] != b["comm"]["bytes"] or a["calls"] != b["comm"]["calls"]:
        ok = False
        print("rank", a["rank"], "run", a["bytes"], a["calls"], "cost", b["comm"]["bytes"], b["comm"]["calls"])
sys.exit(0 if ok else 1)
PY
}
while read -r fam np B flags; do
    n=$((n + 1))
    G=$F/$fam
    ov=""
    router=""
    case "$flags" in *--ep*) ov="--overrides data/overrides/${fam}_ep.yaml"; router="--router balanced" ;; esac
    $MPI -np $np "$HP" run $G --random-input $B,1 $flags $ov $router --stats-json "$WORK/r$n.json" \
        >/dev/null 2>"$WORK/r$n.err" </dev/null
    "$HP" cost $G --mode decode --context 64 --batch $B $flags $ov --format json -o "$WORK/c$n.json" 2>"$WORK/c$n.err"
    check "decode comm = run comm (B=$B x 1 token): $fam $flags" same_comm "$WORK/r$n.json" "$WORK/c$n.json"
done <<'LIST'
llama 2 3 --tp 2
mistral 2 2 --cp 2
qwen2 2 4 --dp 2
qwen3_moe 2 3 --tp 2 --ep 2
mixtral 2 2 --tp 2
LIST

# Bad input: exit 2 with a message that says what to do
expect 2 "--context expects an integer" -- "$HP" cost $F/llama --mode decode --context 0
expect 2 "--mode decode serves" -- "$HP" cost $F/llama --mode decode --zero 1
expect 2 "--mode decode serves" -- "$HP" cost $F/llama --mode decode --grad-bytes 2
expect 2 "--context is the KV cache of --mode decode" -- "$HP" cost $F/llama --context 64
expect 2 "--mode expects infer, train or decode" -- "$HP" cost $F/llama --mode serve
expect 2 "--mem-bw" -- "$HP" cost $F/llama --mode decode --mem-bw 0
expect 2 "--mode decode serves" -- "$HP" advise $C/llama-3-8b.json --world 4 --mem-per-rank 80GB --mode decode --zero 1
expect 2 "belongs to --mode decode" -- "$HP" advise $C/llama-3-8b.json --world 4 --mem-per-rank 80GB --prefer headroom
expect 2 "--prefer expects time or headroom" -- "$HP" advise $C/llama-3-8b.json --world 4 --mem-per-rank 80GB \
    --mode decode --prefer space

# advise in decode: every accepted mesh has its sequences; --prefer headroom ranks by them, time by the step
"$HP" advise $C/llama-3-8b.json --world 8 --mem-per-rank 80GB --mode decode --batch 64 --context 8192 \
    --format json -o "$WORK/a_time.json"
"$HP" advise $C/llama-3-8b.json --world 8 --mem-per-rank 80GB --mode decode --batch 64 --context 8192 \
    --prefer headroom --format json -o "$WORK/a_room.json"
check "advise decode: ranked by time, or by headroom" python3 - "$WORK" <<'PY'
import json, sys
t = json.load(open(sys.argv[1] + "/a_time.json")); h = json.load(open(sys.argv[1] + "/a_room.json"))
ok = t["mode"] == h["mode"] == "decode" and t["context"] == 8192 and h["prefer"] == "headroom"
at = [c for c in t["candidates"] if c["ok"]]; ah = [c for c in h["candidates"] if c["ok"]]
ok &= len(at) == len(ah) > 2 and all(c["seqs_fit"] > 0 for c in at)
ok &= all(a["seqs_fit"] >= b["seqs_fit"] for a, b in zip(ah, ah[1:]))
ok &= all(a["t_step"] <= b["t_step"] * 1.01 for a, b in zip(at, at[1:]))
ok &= ah[0]["seqs_fit"] > at[0]["seqs_fit"]  # the fastest mesh is not the roomiest here
sys.exit(0 if ok else 1)
PY
# advise's cost command reproduces #1's sequences
cmd=$("$HP" advise $C/llama-3-8b.json --world 8 --mem-per-rank 80GB --mode decode --batch 64 --context 8192 \
    --prefer headroom | sed -n 's/^its own plan.s figures: hyperpar cost //p')
expect 0 "--mode decode --context 8192" -- echo "$cmd"
"$HP" cost $cmd --format json -o "$WORK/a1.json"
check "advise #1's sequences = cost's with its flags" python3 -c "
import json, sys
a = [c for c in json.load(open('$WORK/a_room.json'))['candidates'] if c['ok']][0]
c = json.load(open('$WORK/a1.json'))
sys.exit(0 if c['seqs_fit'] == a['seqs_fit'] else 1)"
# Under a GPU --hardware the memory term is its HBM's bandwidth (H100: 3.35 TB/s), --mem-bw given wins, the budget
# is its memory, and a training-only flag is refused in decode
"$HP" cost $C/llama-3-8b.json --tp 8 --mode decode --batch 64 --context 8192 --hardware H100 --format json \
    -o "$WORK/h1.json"
"$HP" cost $C/llama-3-8b.json --tp 8 --mode decode --batch 64 --context 8192 --hardware H100 --mem-bw 1000 \
    --format json -o "$WORK/h2.json"
check "decode on H100: HBM bandwidth, --mem-bw over it, the GPU's memory as budget" python3 - "$WORK" <<'PY'
import json, sys
a = json.load(open(sys.argv[1] + "/h1.json")); b = json.load(open(sys.argv[1] + "/h2.json"))
ok = a["engine"] == "estimate" and a["model"]["mem_bw"] == 3.35e12 and b["model"]["mem_bw"] == 1e12
r = a["ranks"][0]
ok &= r["t_memory"] == r["read_bytes"] / 3.35e12 and b["ranks"][0]["t_memory"] == r["read_bytes"] / 1e12
# 80 GiB budget less the 8 GiB reserve: floor((budget - weights - activations) / KV per sequence) on every rank
per = r["kv_seq_bytes"]
ok &= per == 32 * 8192 * 2 * 1 * 128 * 2  # 32 layers, 1 kv head per rank at tp=8, head_dim 128, bf16
ok &= a["mem_reserve"] == 8 * 2**30 and a["mem_usable"] == 72 * 2**30
ok &= a["seqs_fit"] == (72 * 2**30 - r["weight_bytes"] - r["activation_bytes"]) // per
ok &= r["seqs_fit"] == (72 * 2**30 - r["weight_bytes"] - r["activation_bytes"]) // per
sys.exit(0 if ok else 1)
PY
expect 2 "--recompute" -- "$HP" cost $C/llama-3-8b.json --mode decode --hardware H100 --recompute full
cmd=$("$HP" advise $C/llama-3-8b.json --world 8 --hardware H100 --mode decode --batch 64 --context 8192 \
    | sed -n 's/^its own plan.s figures: hyperpar cost //p')
expect 0 "--hardware H100" -- echo "$cmd"
finish

# hyperpar cost (first slice of issue 14): every rank's weights as stored (stored_bytes) equal the tensor bytes of its
# `hyperpar shard` file — dense and MoE, TP, EP (TP-extend and the explicit axis), packed fused weights, tied
# embeddings — in text and JSON; meta mode from config.json alone; bad input exits 2. (weight_bytes, the weights as
# the runtime holds them, is checked against run's resident_bytes by test_cost_exact.sh.)
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
# Sums of the tensor bytes in each rank file of a shard folder, as "rank bytes" lines.
shard_bytes() {
    python3 - "$1" <<'PY'
import glob, json, struct, sys
for path in sorted(glob.glob(sys.argv[1] + "/rank-*.safetensors")):
    raw = open(path, "rb").read(8)
    n = struct.unpack("<Q", raw)[0]
    hdr = json.loads(open(path, "rb").read(8 + n)[8:])
    total = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in hdr.items() if k != "__metadata__")
    print(int(path.split("rank-")[1].split(".")[0]), total)
PY
}
cost_bytes() {
    python3 -c 'import json,sys; d=json.load(sys.stdin); [print(r["rank"], r["stored_bytes"]) for r in d["ranks"]]'
}
n=0
while read -r model flags; do
    n=$((n + 1))
    "$HP" shard $model $flags --out "$WORK/s$n" --quiet >/dev/null 2>&1
    a=$(shard_bytes "$WORK/s$n")
    b=$("$HP" cost $model $flags --format json 2>/dev/null | cost_bytes)
    check "cost = shard file bytes: $model $flags" test -n "$a" -a "$a" = "$b"
done <<'LIST'
data/forward/llama --tp 2
data/forward/qwen2 --tp 2 --dp 2
data/forward/qwen3_moe --tp 2 --ep 2 --overrides data/overrides/qwen3_moe_ep.yaml
data/forward/deepseek_v3 --dp 2 --tp 2 --ep 4 --overrides data/overrides/deepseek_v3_forward_ep.yaml
data/forward/mixtral --mesh dp=1,ep=2 --ep-axis --overrides data/overrides/mixtral_ep.yaml
data/forward/gpt_oss --tp 2 --ep 2 --overrides data/overrides/gpt_oss_ep.yaml
data/forward/qwen3_moe --tp 2 --packed-fused
LIST
expect 0 "most-loaded rank" -- "$HP" cost $F/llama --tp 2
expect 0 "\"max_rank\"" -- "$HP" cost $F/mixtral/config.json --tp 2 --format json
expect 0 "world 256" -- "$HP" cost data/configs/deepseek-v3.json --dp 8 --tp 32 --ep 32
expect 2 "--format expects text, json or html" -- "$HP" cost $F/llama --format yaml
expect 2 "not both" -- "$HP" cost $F/llama --plan x.json --tp 2
expect 2 "" -- "$HP" cost $F/llama --tp 3
expect 0 "measured GEMM rate" -- "$HP" cost $F/llama --tp 2 --measure-gemm
# An architecture the runtime does not run: its weights are still costed, and the rest says why not.
mkdir -p "$WORK/gpt2"
python3 - "$WORK/gpt2" <<'PY'
import json, struct, sys
h = json.dumps({"transformer.h.0.attn.c_attn.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1] + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"\0" * 64)
json.dump({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 4, "n_layer": 1, "n_head": 1,
           "vocab_size": 10}, open(sys.argv[1] + "/config.json", "w"))
PY
expect 0 "gpt2 is not one of them" -- "$HP" cost "$WORK/gpt2" --allow-uncovered
expect 0 '"weight_bytes": 64' -- "$HP" cost "$WORK/gpt2" --allow-uncovered --format json
expect 0 "usage: hyperpar cost" -- "$HP" cost --help
# A plan 'hyperpar run' refuses: only the weights are derived; the rest says "not derived" (text, HTML) or is null
# (JSON), never 0 B / 0 ms.
RF="data/forward/llama --tp 2 --batch 2 --seq 16 --overrides data/overrides/attn_out_feature_shard.yaml"
expect 0 "177.25 KiB not derived" -- "$HP" cost $RF
expect 0 "activations, KV cache and the total not derived" -- "$HP" cost $RF --mem-per-rank 1GB
expect 0 "the weights alone need 69.2% of it" -- "$HP" cost $RF --mem-per-rank 256KiB
check "refused plan: no 0 B / 0 ms in the text" bash -c "out=\$('$HP' cost $RF --mem-per-rank 1GB) && \
    grep -q \"refuses this plan\" <<<\"\$out\" && ! grep -Eq ' 0 B|0 ms' <<<\"\$out\""
check "refused plan: JSON figures null, weights kept" bash -c "'$HP' cost $RF --format json | python3 -c 'import json,sys; \
    r=json.load(sys.stdin)[\"ranks\"]; sys.exit(0 if r and all(x[\"weight_bytes\"] > 0 and x[\"total_bytes\"] is None and \
    x[\"activation_bytes\"] is None and x[\"t_step\"] is None and x[\"comm\"] is None for x in r) else 1)'"
check "refused plan: HTML says not derived" bash -c "'$HP' cost $RF --format html | grep -q 'the total not derived'"
# "total" means one thing in cost (text, JSON, HTML) and advise: what counts against a budget, weights +
# activations + the KV cache of the batch (inference) or the training state (train); docs/cost.md "Total".
total_same() {
    python3 - "$HP" "$@" <<'PY'
import json, re, subprocess, sys
hp, model, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
run = lambda *a: subprocess.run([hp] + list(a), capture_output=True, text=True, check=True).stdout
k = json.loads(run("cost", model, "--tp", "2", "--format", "json", *extra))
train = k["mode"] == "train"
for r in k["ranks"]:
    st = r["grad_bytes"] + r["optim_bytes"] + r["master_bytes"] + r["saved_bytes"] if train else r["kv_cache_bytes"]
    if r["total_bytes"] != r["weight_bytes"] + r["activation_bytes"] + st:
        print("cost total", r["total_bytes"], "!= weights + activations + state", r); sys.exit(1)
mx = max(q["total_bytes"] for q in k["ranks"])
a = json.loads(run("advise", model, "--world", str(k["world"]), "--mem-per-rank", "1TB", "--format", "json", *extra))
c = [c for c in a["candidates"] if c["ok"] and c["tp"] == 2 and c["dp"] == 1 and c["cp"] == 1 and c["ep"] == 1]
if not c or c[0]["max_bytes"] != mx:
    print("advise memory", c and c[0]["max_bytes"], "!= cost's most-loaded total", mx); sys.exit(1)
html = run("cost", model, "--tp", "2", "--format", "html", *extra)
def mib(b): return "%.2f MiB" % (b / 2**20)
if "total " + mib(mx) not in html and "total " + ("%.2f KiB" % (mx / 1024)) not in html:
    print("HTML total missing", mib(mx)); sys.exit(1)
print("total", mx, "the same in cost, advise and the page;", "train" if train else "infer")
PY
}
check "total: the same in cost, advise, HTML (inference, with the KV cache)" total_same data/forward/llama --batch 2 --seq 16
check "total: the same in cost, advise, HTML (training)" total_same data/forward/llama --batch 2 --seq 16 --mode train
expect 0 "+ KV cache 4.00 KiB* of the 16 positions)" -- "$HP" cost data/forward/llama --tp 2 --batch 2 --seq 16
finish

# hyperpar cost and advise on batches whose sizes pass what 64 bits hold (issue 20, #9): refused with exit 2 and
# "is past what the cost model can hold", never wrapped figures (negative GFLOP, "16384.00 PiB") with exit 0; the
# largest batch accepted gives positive figures that scale exactly with the batch. The ASan/UBSan build runs this
# script too: a signed overflow in the size arithmetic is a test failure there.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
D=data/configs
PAST="is past what the cost model can hold"
# Refused: llama-3-8b's residual stream at every layer's input is 33 x B x S x 4096 floats (past 2^63 elements from
# B x S = 2^46; inference takes no logits, so they are one row chunk's, not B x S x 128256).
for bs in "16777216 4194304" "2147483647 2147483647" "2147483647 16777216" "16777216 2147483647"; do
    set -- $bs
    expect 2 "$PAST" -- "$HP" cost $D/llama-3-8b.json --batch $1 --seq $2
    expect 2 "$PAST" -- "$HP" cost $D/llama-3-8b.json --tp 4 --cp 2 --batch $1 --seq $2 --mode train
done
# Other families and meshes, MoE exchange and MLA included.
expect 2 "$PAST" -- "$HP" cost $D/deepseek-v3.json --dp 8 --tp 32 --ep 32 --batch 2147483647 --seq 2147483647
expect 2 "$PAST" -- "$HP" cost $D/mixtral-8x7b.json --mesh dp=1,ep=8 --ep-axis --batch 33554432 --seq 4194304
# (the ep axis splits the batch 8 ways, as dp does: 4194304 rows x 4194304 positions a rank)
expect 2 "$PAST" -- "$HP" cost $D/qwen3-30b-a3b.json --cp 4 --tp 2 --ep 2 --batch 16777216 --seq 4194304
expect 2 "$PAST" -- "$HP" cost $D/gpt-oss-20b.json --batch 2147483647 --seq 2147483647 --format json
# without pipelines every mesh's figures pass 64 bits; a pp=8 stage holds 4 of the 32 layers, whose figures fit
expect 2 "$PAST" -- "$HP" advise $D/llama-3-8b.json --world 8 --mem-per-rank 80GB --batch 4194304 --seq 4194304 --max-pp 1
expect 2 "no mesh of 8 ranks fits" -- "$HP" advise $D/llama-3-8b.json --world 8 --mem-per-rank 80GB --batch 4194304 --seq 4194304
expect 2 "$PAST" -- "$HP" advise $D/qwen3-30b-a3b.json --world 16 --mem-per-rank 80GB --batch 2147483647 \
    --seq 2147483647 --mode train
# Accepted, near the edge: every byte figure positive, and exactly 8x the figures of a batch 8x smaller (the
# activations less the runtime's constant scratch and a dense MLP's buffers, which hold one row chunk of 1024
# rows at these sizes: docs/run.md "Long prefill"; KV cache, communication), GFLOP positive. A MoE model's
# activations are affine instead (its EP runtime's chunk-sized buffers are a constant of their own): checked on a
# third batch, 64x smaller.
scale() {
    python3 - "$HP" "$@" <<'PY'
import json, subprocess, sys
hp, cfg, B, S = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
extra = sys.argv[5:]
def run(b):
    r = subprocess.run([hp, "cost", cfg, "--batch", str(b), "--seq", str(S), "--format", "json"] + extra,
                       capture_output=True, text=True)
    if r.returncode:
        print("exit", r.returncode, r.stderr.strip()[:300]); sys.exit(1)
    return json.loads(r.stdout)["ranks"]
big, small, tiny = run(B), run(B // 8), run(B // 64)
tp = int(extra[extra.index("--tp") + 1]) if "--tp" in extra else 1
conf = json.load(open(cfg))
dense = conf.get("num_local_experts", conf.get("num_experts", 0)) == 0
scr = (4 << 20) + (1024 * 3 * (conf["intermediate_size"] // tp) * 4 if dense else 0)
ok = True
for a, b, c in zip(big, small, tiny):
    keys = ["activation_bytes", "kv_cache_bytes", "total_bytes", "net_bytes", "flops"]
    if not all(a[k] > 0 for k in keys if not (k == "net_bytes" and b[k] == 0)):
        print("non-positive", a); ok = False
    # MoE: the EP runtime's chunk-sized buffers are a constant too (its routing and overlap output scale): affine
    aff = dense or a["activation_bytes"] - b["activation_bytes"] == 8 * (b["activation_bytes"] - c["activation_bytes"])
    # the shared windows' halves are whole MiB, their 64-byte headers a constant beside the GEMM scratch
    k = scr + a["window_bytes"] % (1 << 20)
    if (dense and a["activation_bytes"] - k != 8 * (b["activation_bytes"] - k)) or not aff or \
            a["kv_cache_bytes"] != 8 * b["kv_cache_bytes"]:
        print("not linear", a["rank"], a["activation_bytes"], b["activation_bytes"]); ok = False
    for k in a["comm"]["bytes"]:
        if a["comm"]["bytes"][k] != 8 * b["comm"]["bytes"][k]:
            print("comm not linear", k, a["comm"]["bytes"][k], b["comm"]["bytes"][k]); ok = False
    if a["total_bytes"] >= 2**64 or a["total_bytes"] + a["kv_cache_bytes"] >= 2**64:
        print("past 64 bits", a["total_bytes"]); ok = False
sys.exit(0 if ok else 1)
PY
}
check "llama-3-8b 2097152 x 4194304 is exact" scale $D/llama-3-8b.json 2097152 4194304
check "llama-3-8b tp=4 cp=2 2097152 x 4194304 is exact" scale $D/llama-3-8b.json 2097152 4194304 --tp 4 --cp 2
check "mixtral ep axis 1048576 x 1048576 is exact" scale $D/mixtral-8x7b.json 1048576 1048576 --mesh dp=1,ep=8 --ep-axis
expect 0 "most-loaded rank" -- "$HP" cost $D/llama-3-8b.json --batch 1 --seq 2147483647
expect 0 "most-loaded rank" -- "$HP" cost $D/deepseek-v3.json --dp 8 --tp 32 --ep 32 --batch 8 --seq 2147483647
# The flags' own limits.
expect 2 "--batch" -- "$HP" cost $D/llama-3-8b.json --batch 2147483648
expect 2 "--seq" -- "$HP" cost $D/llama-3-8b.json --seq 0
finish

# hyperpar run under mpirun: every dense golden at tp=2, cp=2, tp=2 x cp=2, dp=2 x tp=2, SP off, loss-parallel,
# against the golden (1e-4 * max|ref|, loss 1e-5) and against one process (1e-5); overrides that change a
# contract give the same logits; a generated model with uneven splits (odd S, vocab 132, bf16 weights) at tp=4
# and cp=2; a shard folder; failures end every rank with the cause. Each run is bounded by a timeout.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
for fam in llama mistral qwen2 qwen3; do
    G=$F/$fam
    "$HP" run $G --input $G/forward_io.safetensors --output "$WORK/$fam.one.st" 2>/dev/null </dev/null
    while read -r np flags; do
        expect 0 "OK" -- $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors $flags \
            --compare $G/forward_io.safetensors
        expect 0 "OK" -- $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors $flags \
            --compare "$WORK/$fam.one.st" --compare-rtol 1e-5
    done <<'LIST'
2 --tp 2
2 --tp 2 --no-sequence-parallel
2 --tp 2 --loss-parallel
2 --cp 2
4 --cp 2 --tp 2
4 --cp 2 --tp 2 --loss-parallel --no-sequence-parallel
4 --dp 2 --tp 2
LIST
done
# The executor follows the plan: contracts changed by overrides, same logits.
for ov in attn_out_replicate mlp_replicated; do
    expect 0 "OK" -- $MPI -np 2 "$HP" run $F/llama --input $F/llama/forward_io.safetensors --tp 2 \
        --overrides data/overrides/$ov.yaml --compare "$WORK/llama.one.st" --compare-rtol 1e-5
done
# ... and its communication changes with it: the replicated MLPs do no reduce-scatter of their own.
out=$($MPI -np 2 "$HP" run $F/llama --input $F/llama/forward_io.safetensors --tp 2 2>&1)
out2=$($MPI -np 2 "$HP" run $F/llama --input $F/llama/forward_io.safetensors --tp 2 \
    --overrides data/overrides/mlp_replicated.yaml 2>&1)
rs() { grep -o 'reduce-scatter [^,]* in [0-9]* calls' <<<"$1" | grep -o '[0-9]* calls'; }
check "default plan: 5 reduce-scatters (embed, 2 attn, 2 mlp)" test "$(rs "$out")" = "5 calls"
check "replicated MLPs: 3 reduce-scatters" test "$(rs "$out2")" = "3 calls"
# A transition the runtime does not lower is refused by name.
expect 2 "S(2)" -- $MPI -np 2 "$HP" run $F/llama --input $F/llama/forward_io.safetensors --tp 2 \
    --overrides data/overrides/attn_out_feature_shard.yaml

# validate: every boundary agrees at tp=2 x cp=2 and with overrides; a nudged boundary is named first (exit 3).
expect 0 "loss: distributed" -- $MPI -np 4 "$HP" validate $F/qwen3 --input $F/qwen3/forward_io.safetensors --cp 2 --tp 2
expect 0 "model.layers.1.mlp" -- $MPI -np 2 "$HP" validate $F/mistral --input $F/mistral/forward_io.safetensors --tp 2 \
    --overrides data/overrides/attn_out_replicate.yaml
expect 3 "first at model.layers.1.mlp (after reduce-scatter)" -- $MPI -np 2 -x HP_TEST_PERTURB_BOUNDARY=model.layers.1.mlp \
    "$HP" validate $F/llama --input $F/llama/forward_io.safetensors --tp 2
out=$($MPI -np 2 -x HP_TEST_PERTURB_BOUNDARY=model.layers.0.self_attn "$HP" validate $F/llama \
    --input $F/llama/forward_io.safetensors --tp 2 2>&1)
check "the table flags the first divergence" grep -q "model.layers.0.self_attn .*DIVERGES  <- first divergence" <<<"$out"
check "boundaries before it agree" grep -q "model.layers.0.input_layernorm .* ok" <<<"$out"

# A generated model with uneven splits: S = 15 (odd: SP blocks 8/7, cp pads to 16), vocab 132 over tp=4, kv heads 4, bf16 weights.
"$HP" gen --family llama --out "$WORK/gen" --heads 8 --kv-heads 4 --head-dim 8 --vocab 132 --dtype bf16 \
    --layers 2 --seed 7 >/dev/null 2>&1
python3 - "$WORK/ids.st" <<'PY'
import json, struct, sys
ids = [(i * 37 + 11) % 132 for i in range(3 * 15)]
raw = struct.pack("<%dq" % len(ids), *ids)
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [3, 15], "data_offsets": [0, len(raw)]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + raw)
PY
"$HP" run "$WORK/gen" --input "$WORK/ids.st" --output "$WORK/gen.one.st" 2>/dev/null </dev/null
while read -r np flags; do
    expect 0 "OK" -- $MPI -np $np "$HP" run "$WORK/gen" --input "$WORK/ids.st" $flags --compare "$WORK/gen.one.st" \
        --compare-rtol 1e-5
done <<'LIST'
4 --tp 4
4 --tp 4 --loss-parallel
2 --cp 2
4 --cp 2 --tp 2
3 --dp 3
4 --cp 4
LIST
# Biases on every projection (llama attention_bias + mlp_bias): o_proj's and down_proj's are row-parallel and
# deferred (D-22), added once after the exit reduction, so tp=2 equals one process.
python3 - $F/llama "$WORK/bias" <<'PY'
import json, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
cfg = json.load(open(src + "/config.json")); cfg["attention_bias"] = True; cfg["mlp_bias"] = True
json.dump(cfg, open(dst + "/config.json", "w"))
raw = open(src + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in hdr.items() if k != "__metadata__"}
H, hd, nh, nkv, I = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
seed = [12345]
def vec(n):
    out = []
    for _ in range(n):
        seed[0] = (seed[0] * 1103515245 + 12345) % (1 << 31)
        out.append((seed[0] / (1 << 31) - 0.5) * 0.2)
    return struct.pack("<%df" % n, *out)
for l in range(cfg["num_hidden_layers"]):
    p = "model.layers.%d." % l
    for name, n_ in (("self_attn.q_proj", nh * hd), ("self_attn.k_proj", nkv * hd), ("self_attn.v_proj", nkv * hd),
                     ("self_attn.o_proj", H), ("mlp.gate_proj", I), ("mlp.up_proj", I), ("mlp.down_proj", H)):
        tensors[p + name + ".bias"] = ("F32", [n_], vec(n_))
out, off, body = {}, 0, b""
for k in sorted(tensors):
    dt, shape, b = tensors[k]
    out[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}; off += len(b); body += b
h = json.dumps(out).encode()
open(dst + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + body)
PY
"$HP" run "$WORK/bias" --input $F/llama/forward_io.safetensors --output "$WORK/bias.one.st" 2>/dev/null </dev/null
check "the biases change the logits" test "$("$HP" run "$WORK/bias" --input $F/llama/forward_io.safetensors \
    --compare $F/llama/forward_io.safetensors 2>&1 </dev/null | grep -c MISMATCH)" -ge 1
while read -r np flags; do
    expect 0 "OK" -- $MPI -np $np "$HP" run "$WORK/bias" --input $F/llama/forward_io.safetensors $flags \
        --compare "$WORK/bias.one.st" --compare-rtol 1e-5
done <<'LIST'
2 --tp 2
2 --tp 2 --no-sequence-parallel
4 --cp 2 --tp 2
LIST
expect 0 "deferred" -- "$HP" plan "$WORK/bias" --tp 2 --format explain

# One row (B = 1, as in prefill): the collectives gather and scatter in place, without packing.
python3 - "$WORK/ids1.st" <<'PY'
import json, struct, sys
ids = [(i * 53 + 5) % 132 for i in range(16)]
raw = struct.pack("<%dq" % len(ids), *ids)
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [1, 16], "data_offsets": [0, len(raw)]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + raw)
PY
"$HP" run "$WORK/gen" --input "$WORK/ids1.st" --output "$WORK/gen1.one.st" 2>/dev/null </dev/null
while read -r np flags; do
    expect 0 "OK" -- $MPI -np $np "$HP" run "$WORK/gen" --input "$WORK/ids1.st" $flags --compare "$WORK/gen1.one.st" \
        --compare-rtol 1e-5
done <<'LIST'
2 --tp 2
4 --tp 4 --loss-parallel
4 --cp 2 --tp 2
LIST

# A fused gate_up_proj (llama's gate and up rows concatenated): packed S(0)x2 under tp=2 equals the golden.
python3 - $F/llama "$WORK/fused" <<'PY'
import json, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
open(dst + "/config.json", "w").write(open(src + "/config.json").read())
raw = open(src + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
t = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in hdr.items() if k != "__metadata__"}
for l in range(2):
    p = "model.layers.%d.mlp." % l
    g, u = t.pop(p + "gate_proj.weight"), t.pop(p + "up_proj.weight")
    t[p + "gate_up_proj.weight"] = (g[0], [2 * g[1][0], g[1][1]], g[2] + u[2])
out, off, body = {}, 0, b""
for k in sorted(t):
    dt, shape, b = t[k]
    out[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}; off += len(b); body += b
h = json.dumps(out).encode()
open(dst + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + body)
PY
expect 0 "OK" -- "$HP" run "$WORK/fused" --input $F/llama/forward_io.safetensors --compare $F/llama/forward_io.safetensors
expect 0 "OK" -- $MPI -np 2 "$HP" run "$WORK/fused" --input $F/llama/forward_io.safetensors --tp 2 --packed-fused \
    --compare $F/llama/forward_io.safetensors
expect 2 "--packed-fused" -- $MPI -np 2 "$HP" run "$WORK/fused" --input $F/llama/forward_io.safetensors --tp 2

# One position (S = 1): no position is scored, the loss is NaN on both sides and still compares equal; SP and
# CP blocks of zero tokens take part in every collective.
python3 - "$WORK/s1.st" <<'PY'
import json, struct, sys
raw = struct.pack("<q", 5)
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [1, 1], "data_offsets": [0, len(raw)]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + raw)
PY
"$HP" run $F/llama --input "$WORK/s1.st" --output "$WORK/s1.one.st" 2>/dev/null </dev/null
while read -r np flags; do
    expect 0 "OK" -- $MPI -np $np "$HP" run $F/llama --input "$WORK/s1.st" $flags --compare "$WORK/s1.one.st" \
        --compare-rtol 1e-5
done <<'LIST'
2 --tp 2
4 --cp 2 --tp 2 --loss-parallel
LIST

# From a shard folder of the same mesh: the same logits; of another mesh: refused.
"$HP" shard "$WORK/gen" --tp 2 --out "$WORK/shards" >/dev/null 2>&1
expect 0 "OK" -- $MPI -np 2 "$HP" run "$WORK/shards" --input "$WORK/ids.st" --tp 2 --compare "$WORK/gen.one.st" \
    --compare-rtol 1e-5
# The folder brings its mesh: no flags needed, and a flag that contradicts it is refused naming both values.
expect 0 "OK" -- $MPI -np 2 "$HP" run "$WORK/shards" --input "$WORK/ids.st" --compare "$WORK/gen.one.st" \
    --compare-rtol 1e-5
expect 2 "--cp 2 contradicts the shard folder's cp=1" -- $MPI -np 2 "$HP" run "$WORK/shards" --input "$WORK/ids.st" --cp 2
expect 2 "--tp 4 contradicts the shard folder's tp=2" -- $MPI -np 4 "$HP" run "$WORK/shards" --input "$WORK/ids.st" --tp 4
# A --plan of another mesh is held to the rank files.
"$HP" plan "$WORK/gen" --cp 2 -o "$WORK/cp2.plan.json" 2>/dev/null
expect 2 "another mesh" -- $MPI -np 2 "$HP" run "$WORK/shards" --input "$WORK/ids.st" --plan "$WORK/cp2.plan.json"
# A bad id ends every rank with the cause (exit 2, printed once).
python3 - "$WORK/bad.st" <<'PY'
import json, struct, sys
raw = struct.pack("<4q", 1, 2, 999, 3)
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [2, 2], "data_offsets": [0, len(raw)]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + raw)
PY
expect 2 "input_ids[1][0] = 999" -- $MPI -np 2 "$HP" run $F/llama --input "$WORK/bad.st" --tp 2
out=$($MPI -np 2 "$HP" run $F/llama --input "$WORK/bad.st" --tp 2 2>&1)
check "the error is printed once" test "$(grep -c 'error:' <<<"$out")" = 1
expect 2 "the batch has 2 rows for dp=3" -- $MPI -np 3 "$HP" run $F/llama --input $F/llama/forward_io.safetensors --dp 3
finish

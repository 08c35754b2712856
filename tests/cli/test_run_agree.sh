# Ranks that were given different things, and non-finite numbers (issue 20, docs/reliability.md):
# - ranks started with other mesh flags, SP or loss-parallel settings, plans, options, run vs validate, other
#   weights (same shapes, other values; another family), or a checkpoint vs a shard folder: every rank ends
#   with exit 2 and one message naming what differs, never a hang (each run is bounded by a timeout);
# - a NaN or Inf weight (checkpoint, shard rank file, a routed expert), or values past f32's range: run and
#   validate exit 3 naming the first non-finite boundary and the likely cause, print it once, write nothing.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
MPI="timeout 60 mpirun --allow-run-as-root --oversubscribe"
"$HP" gen --family llama --out gl >/dev/null 2>&1
"$HP" gen --family llama --out gl7 --seed 7 >/dev/null 2>&1
"$HP" gen --family mistral --out gm >/dev/null 2>&1
"$HP" gen --family qwen3_moe --out gq >/dev/null 2>&1
python3 - <<'PY'
import json, shutil, struct
def st_write(path, tensors):
    hdr, data = {}, b""
    for name, (dt, shape, raw) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
ids = [(i * 37 + 11) % 128 for i in range(32)]
st_write("ids.st", {"input_ids": ("I64", [2, 16], struct.pack("<32q", *ids))})
def poke(src, dst, names, value, idx=5, count=1):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    p = dst + "/model.safetensors"
    b = bytearray(open(p, "rb").read())
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    for name in names:
        lo, hi = h[name]["data_offsets"]
        count = count if count > 0 else (hi - lo) // 4
        off = 8 + n + lo + 4 * idx
        b[off:off + 4 * count] = struct.pack("<%df" % count, *([value] * count))
    open(p, "wb").write(b)
poke("gl", "gl_nan", ["model.layers.1.mlp.down_proj.weight"], float("nan"))
poke("gl", "gl_inf", ["model.layers.0.self_attn.q_proj.weight"], float("inf"))
poke("gl", "gl_big", ["model.layers.0.mlp.down_proj.weight"], 3.3e38, idx=0, count=0)
poke("gq", "gq_nan", ["model.layers.1.mlp.experts.%d.down_proj.weight" % e for e in range(8)], float("nan"), idx=0)
PY
# mixed CODE NEEDLE CMD0 CMD1: rank 0 runs `hyperpar CMD0`, rank 1 `hyperpar CMD1`; the exit code, the message
# and that it is printed once.
mixed() {
    local code="$1" needle="$2" cmd0="$3" cmd1="$4"
    local out rc
    out=$($MPI -np 1 "$HP" $cmd0 : -np 1 "$HP" $cmd1 2>&1 </dev/null)
    rc=$?
    if [ "$rc" -ne "$code" ] || ! grep -qF -- "$needle" <<<"$out"; then
        echo "FAIL: '$cmd0' : '$cmd1' exited $rc (expected $code with '$needle')"; echo "$out" | head -20
        FAILED=$((FAILED + 1)); return
    fi
    local n
    n=$(grep -c "hyperpar: error" <<<"$out")
    if [ "$n" -ne 1 ]; then echo "FAIL: '$cmd0' : '$cmd1' printed $n error lines"; echo "$out"; FAILED=$((FAILED + 1)); return; fi
    PASSED=$((PASSED + 1))
}
R="run gl --input ids.st"
V="validate gl --input ids.st"
"$HP" plan gl --tp 2 -o p_default.json 2>/dev/null
"$HP" plan gl --tp 2 --overrides "$TESTS/data/overrides/mlp_replicated.yaml" -o p_mlp.json 2>/dev/null
"$HP" shard gl --tp 2 --out gl_shards >/dev/null 2>&1
mixed 2 "rank 1 runs the mesh dp=1,cp=2,tp=1" "$R --tp 2" "$R --cp 2 --tp 1"
mixed 2 "rank 1 runs the mesh dp=2,cp=1,tp=1" "$R --tp 2" "$R --dp 2 --tp 1"
mixed 2 "sequence parallelism off, rank 0 on" "$R --tp 2" "$R --tp 2 --no-sequence-parallel"
mixed 2 "loss parallelism on, rank 0 off" "$R --tp 2" "$R --tp 2 --loss-parallel"
mixed 2 "loss parallelism on, rank 0 off" "$V --tp 2" "$V --tp 2 --loss-parallel"
mixed 2 "mesh" "$V --tp 2" "$V --cp 2 --tp 1"
mixed 2 "rank 1 loaded other weights than rank 0" "$R --tp 2" "run gl7 --input ids.st --tp 2"
mixed 2 "rank 1 loaded other weights than rank 0" "$V --tp 2" "validate gl7 --input ids.st --tp 2"
mixed 2 "rank 1 loaded other weights than rank 0: another model (mistral" "$R --tp 2" "run gm --input ids.st --tp 2"
mixed 2 "rank 1 was given other options than rank 0 (--compute bf16" "$R --tp 2" "$R --tp 2 --compute bf16"
mixed 2 "other options" "$R --tp 2" "$V --tp 2"
mixed 2 "other options" "$V --tp 2" "$R --tp 2"
mixed 2 "another plan" "$R --plan p_default.json" "$R --plan p_mlp.json"
mixed 2 "another plan" "$R --tp 2" "$R --tp 2 --overrides $TESTS/data/overrides/mlp_replicated.yaml"
mixed 2 "reads a shard folder, rank 0 a checkpoint" "$R --tp 2" "run gl_shards --input ids.st --tp 2"
mixed 2 "--router real; rank 0: --compute exact, --router balanced" "run gq --input ids.st --tp 1 --dp 2 --router balanced" \
    "run gq --input ids.st --tp 1 --dp 2"
# The same plan reached two ways agrees: derived from flags on one rank, read from its file on the other.
out=$($MPI -np 1 "$HP" $R --tp 2 : -np 1 "$HP" $R --plan p_default.json 2>&1)
check "one plan from flags and from its file runs" grep -q "run: loss" <<<"$out"
"$HP" plan gq --dp 2 --tp 1 -o pq.json 2>/dev/null
out=$($MPI -np 1 "$HP" run gq --input ids.st --dp 2 --tp 1 : -np 1 "$HP" run gq --input ids.st --plan pq.json 2>&1)
check "one MoE plan from flags and from its file runs" grep -q "run: loss" <<<"$out"
# Same model by another path agrees too.
ln -s gl gl_link
out=$($MPI -np 1 "$HP" $R --tp 2 : -np 1 "$HP" run gl_link --input ids.st --tp 2 2>&1)
check "the same checkpoint by another path runs" grep -q "run: loss" <<<"$out"

# ---- non-finite numbers ----
expect 3 "model.layers.1.mlp is the first boundary whose output holds NaN" -- \
    "$HP" run gl_nan --input ids.st --output o1.st
check "no output from a non-finite run" test ! -e o1.st
expect 3 "the weight 'model.layers.1.mlp.down_proj.weight' holds NaN" -- "$HP" run gl_nan --input ids.st
expect 3 "model.layers.0.self_attn is the first boundary" -- $MPI -np 2 "$HP" run gl_inf --input ids.st --tp 2 \
    --output o2.st
check "no output from a non-finite run under mpirun" test ! -e o2.st
n=$($MPI -np 2 "$HP" run gl_inf --input ids.st --tp 2 2>&1 | grep -c "hyperpar: error")
check "the non-finite verdict is printed once" test "$n" = 1
expect 3 "holds +Inf at [0, 5]" -- $MPI -np 4 "$HP" run gl_inf --input ids.st --dp 2 --tp 2
expect 3 "overflowed f32" -- "$HP" run gl_big --input ids.st
expect 3 "not finite" -- $MPI -np 2 "$HP" run gl_big --input ids.st --cp 2 --tp 1
# validate: non-finite is its own diagnosis, never "placements", and never a NaN compared "ok"
out=$("$HP" validate gl_nan --input ids.st 2>&1); rc=$?
check "validate of a non-finite model exits 3" test "$rc" = 3
check "validate names non-finite, not placements" sh -c "grep -q 'not finite' <<'X'
$out
X
! grep -q 'placements and overrides' <<'X'
$out
X"
expect 3 "not finite" -- $MPI -np 2 "$HP" validate gl_nan --input ids.st --tp 2
# a shard rank file with a NaN
"$HP" shard gl_nan --tp 2 --out nan_shards >/dev/null 2>&1
expect 3 "model.layers.1.mlp is the first boundary" -- $MPI -np 2 "$HP" run nan_shards --input ids.st --tp 2
# a routed expert with NaN (every expert of layer 1): the sparse block is named, under EP too
expect 3 "model.layers.1.mlp is the first boundary" -- "$HP" run gq_nan --input ids.st
expect 3 "experts" -- "$HP" run gq_nan --input ids.st
expect 3 "model.layers.1.mlp is the first boundary" -- $MPI -np 2 "$HP" run gq_nan --input ids.st --dp 2 --tp 1
# --compare never passes a NaN loss
"$HP" run gl --input ids.st --output ref.st 2>/dev/null
python3 - <<'PY'
import json, struct
b = bytearray(open("ref.st", "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
off = 8 + n + h["loss"]["data_offsets"][0]
b[off:off + 4] = struct.pack("<f", float("nan"))
open("ref_nan.st", "wb").write(b)
PY
expect 3 "differs from ref_nan.st in its loss" -- "$HP" run gl --input ids.st --compare ref_nan.st
expect 0 "OK" -- "$HP" run gl --input ids.st --compare ref.st
finish

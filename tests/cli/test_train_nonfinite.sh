# hyperpar train with a non-finite gradient (HP_TEST_NAN_GRAD makes one parameter's gradient NaN after its sums):
# exit 3 naming the first such parameter and the step, nothing updated, at 1 process and under mpirun (dense and an
# MoE block's router); --skip-nonfinite skips the step (no update: the next step's loss is the same) and goes on.
# An AdamW update that would store inf/NaN (--lr or --weight-decay far too large) ends the run with exit 3 naming the
# step, the parameter and the cause, before anything of that step is saved (also at dp=2 with ZeRO-1);
# --skip-nonfinite leaves the parameters and the moments exactly as they were; a state file with a NaN, an inf or a
# negative second moment is refused naming the file and the tensor.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
G=$F/llama
I=$G/forward_io.safetensors
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
expect 3 "step 1: the gradient of model.layers.1.mlp.up_proj.weight is not finite" -- \
    env HP_TEST_NAN_GRAD=model.layers.1.mlp.up_proj.weight "$HP" train $G --input $I --steps 2 --out "$WORK/nan"
check "nothing written after a non-finite gradient" test ! -e "$WORK/nan"
expect 3 "the gradient of model.layers.0.self_attn.o_proj.weight is not finite" -- \
    $MPI -np 2 -x HP_TEST_NAN_GRAD=model.layers.0.self_attn.o_proj.weight "$HP" train $G --input $I --tp 2
expect 3 "the gradient of model.layers.0.block_sparse_moe (router) is not finite" -- \
    $MPI -np 2 -x "HP_TEST_NAN_GRAD=model.layers.0.block_sparse_moe (router)" "$HP" train $F/mixtral \
    --input $F/mixtral/forward_io.safetensors --tp 2
out=$(HP_TEST_NAN_GRAD=model.norm.weight "$HP" train $G --input $I --steps 2 --skip-nonfinite 2>&1)
check "--skip-nonfinite: exit 0, both steps skipped" test "$(grep -c "step skipped" <<<"$out")" = 2
l1=$(grep "step 1/2" <<<"$out" | awk '{print $5}')
l2=$(grep "step 2/2" <<<"$out" | awk '{print $5}')
check "--skip-nonfinite: nothing updated (the same loss $l1 = $l2)" test -n "$l1" -a "$l1" = "$l2"

# ---- an update that is not finite (finite gradients, AdamW storing inf): a tiny generated llama ----
cd "$WORK"
"$HP" gen --family llama --out M >/dev/null 2>&1
small_train_inputs # tok.bin, ids.safetensors (lib.sh)
D="--data tok.bin --seq 16 --global-batch 4"
T="timeout 120 $HP train"
expect 3 "step 1: the AdamW update of model.embed_tokens.weight is not finite" -- \
    $T M --input ids.safetensors --steps 1 --lr 1e300 --out o
check "a non-finite update writes no --out" test ! -e o
expect 3 "the learning rate or the weight decay is too large (--lr 1e+300" -- \
    $T M --input ids.safetensors --steps 1 --lr 1e300 --out o
expect 3 "is too large (--lr 0.001 x --weight-decay 1e+300" -- \
    $T M --input ids.safetensors --steps 1 --weight-decay 1e300 --out o
expect 3 "the learning rate is likely too large (--lr 1e+300); lower --lr" -- \
    $T M --input ids.safetensors --steps 1 --lr 1e300 --weight-decay 0 --out o
expect 3 "step 1: the AdamW update of" -- $T M --input ids.safetensors --steps 2 --lr 1e300 --save-every 1 --out r0
check "no checkpoint of the poisoned step" test -z "$(ls r0 2>/dev/null)"
expect 3 "the AdamW update of model.embed_tokens.weight is not finite" -- \
    $MPI -np 2 "$HP" train M --input ids.safetensors --steps 1 --lr 1e300 --dp 2 --zero 1
# --skip-nonfinite: both steps skipped, the checkpoint is the model as it began with moments exactly zero
expect 0 "step skipped" -- $T M --input ids.safetensors --steps 2 --lr 1e300 --skip-nonfinite --save-every 2 --out sk
check "--skip-nonfinite: parameters and moments exactly as before the skipped steps" python3 - <<'PY'
import json, struct, sys
def load(p):
    raw = open(p, "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
a, b, st = load("M/model.safetensors"), load("sk/step-2/model.safetensors"), load("sk/step-2/rank-0.safetensors")
assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), "parameters changed"
assert all(set(v) <= {0} for k, v in st.items() if k.startswith("adam_")), "moments changed"
PY
# a state file whose moments are not finite, or whose second moment is negative: refused naming the file and tensor
"$HP" train M $D --steps 4 --save-every 2 --out a >/dev/null 2>&1
poke() { # FILE TENSOR VALUE: element 0 of TENSOR in safetensors FILE set to VALUE (f32)
    python3 - "$@" <<'PY'
import json, struct, sys
p, name, val = sys.argv[1], sys.argv[2], float(sys.argv[3])
raw = bytearray(open(p, "rb").read()); (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n])
o = 8 + n + h[name]["data_offsets"][0]
raw[o:o + 4] = struct.pack("<f", val)
open(p, "wb").write(raw)
PY
}
cp -r a/step-2 nanm && poke nanm/rank-0.safetensors adam_m.3 nan
expect 2 "nanm/rank-0.safetensors: adam_m.3 of 'model.layers.0.self_attn.k_proj.weight' holds nan" -- \
    $T M $D --steps 4 --save-every 2 --resume nanm --out a
cp -r a/step-2 negv && poke negv/rank-0.safetensors adam_v.1 -1
expect 2 "negv/rank-0.safetensors: adam_v.1 of" -- $T M $D --steps 4 --save-every 2 --resume negv --out a
expect 2 "second moment is finite and >= 0" -- $T M $D --steps 4 --save-every 2 --resume negv --out a
cp -r a/step-2 infp && poke infp/rank-0.safetensors param.0 inf
expect 2 "infp/rank-0.safetensors: param.0 of 'model.embed_tokens.weight' holds inf" -- \
    $T M $D --steps 4 --save-every 2 --resume infp --out a
# A step skipped after real steps (moments not zero): step-2 with one master and its first moment poked so that step
# 3's update overflows (state.json's hashes rewritten, tests/cli/resum.py); --skip-nonfinite skips step 3 and its
# checkpoint holds every master and moment of step-2 bit for bit, and AdamW's step count 2.
cp -r a/step-2 big && poke big/rank-0.safetensors param.0 -3e38 && poke big/rank-0.safetensors adam_m.0 3e38 &&
    python3 "$TESTS/cli/resum.py" big
expect 3 "step 3: the AdamW update of model.embed_tokens.weight is not finite (element 0: -3e+38 would become -inf)" -- \
    $T M $D --steps 4 --save-every 1 --resume big --out bigx
check "no checkpoint of the poisoned step 3" test ! -e bigx/step-3
expect 0 "(not finite: step skipped)" -- $T M $D --steps 4 --save-every 1 --stop-after 3 --skip-nonfinite --resume big --out bigs
check "--skip-nonfinite after real steps: every master and moment exactly as before, AdamW at step 2" python3 - <<'PY'
import json, struct
def load(p):
    raw = open(p, "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n])
    t = {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
    return t, h["__metadata__"]
(a, ma), (b, mb) = load("big/rank-0.safetensors"), load("bigs/step-3/rank-0.safetensors")
assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), "a master or moment changed"
assert ma["step"] == mb["step"] == "2", (ma["step"], mb["step"])
PY
finish

# hyperpar merge of a training checkpoint (RUN/step-<t>, or RUN: its last complete one): a Hugging Face folder
# (config.json + model.safetensors) with the parameters as trained, f32 (the masters, default) or bf16 rounded
# to nearest even, torch_dtype saying which; the same bytes from two bit-identical runs and from two merges;
# it loads in run and inspect; incomplete, foreign and half-written checkpoints and wrong flags are refused
# (exit 2) by name; a shard folder still merges as before.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
G=data/forward/llama
I=$G/forward_io.safetensors
A="--input $I --steps 4 --lr 1e-2 --save-every 2"
"$HP" train $G $A --out "$WORK/a" >/dev/null 2>&1
"$HP" train $G $A --out "$WORK/b" >/dev/null 2>&1

expect 0 "merged the checkpoint of step 4 into $WORK/ma (float32)" -- "$HP" merge "$WORK/a" --out "$WORK/ma"
expect 0 "merged the checkpoint of step 4" -- "$HP" merge "$WORK/b/step-4" --out "$WORK/mb"
check "two bit-identical runs merge to the same bytes" cmp -s "$WORK/ma/model.safetensors" "$WORK/mb/model.safetensors"
check "and the same config.json" cmp -s "$WORK/ma/config.json" "$WORK/mb/config.json"
check "the folder holds config.json and model.safetensors (and the marker)" \
    test "$(ls -A "$WORK/ma" | tr '\n' ' ')" = ".hyperpar-output config.json model.safetensors "
check "f32: the parameters as trained (the checkpoint's model file)" \
    cmp -s "$WORK/ma/model.safetensors" "$WORK/a/step-4/model.safetensors"
expect 0 "step 2" -- "$HP" merge "$WORK/a/step-2" --out "$WORK/m2"
check "step-2 and step-4 differ (training moved the weights)" bash -c "! cmp -s '$WORK/m2/model.safetensors' '$WORK/ma/model.safetensors'"
expect 0 "(bfloat16)" -- "$HP" merge "$WORK/a" --out "$WORK/mbf" --dtype bf16
expect 0 "(bfloat16)" -- "$HP" merge "$WORK/a" --out "$WORK/mbf2" --dtype bf16
check "bf16: the same bytes from two merges" cmp -s "$WORK/mbf/model.safetensors" "$WORK/mbf2/model.safetensors"
check "config.json says float32 for f32" grep -q '"torch_dtype": "float32"' "$WORK/ma/config.json"
check "config.json says bfloat16 for bf16" grep -q '"torch_dtype": "bfloat16"' "$WORK/mbf/config.json"
check "bf16: every tensor is the f32 master rounded to nearest even, names and shapes kept" \
    python3 - "$WORK/ma/model.safetensors" "$WORK/mbf/model.safetensors" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return h, b[8 + n:]
hf, df = load(sys.argv[1]); hb, db = load(sys.argv[2])
assert list(hf) == list(hb), "tensor order"
ties = 0
for k, t in hf.items():
    u = hb[k]
    assert t["dtype"] == "F32" and u["dtype"] == "BF16" and t["shape"] == u["shape"], k
    s, e = t["data_offsets"]; f = struct.unpack("<%dI" % ((e - s) // 4), df[s:e])
    s, e = u["data_offsets"]; g = struct.unpack("<%dH" % ((e - s) // 2), db[s:e])
    for x, y in zip(f, g):
        r = (x + 0x7FFF + ((x >> 16) & 1)) >> 16  # round to nearest, ties to even (finite values)
        assert y == r, (k, hex(x), hex(y), hex(r))
        ties += (x & 0xFFFF) == 0x8000
print("bf16 checked:", sum(len(t["shape"]) and 1 for t in hf.values()), "tensors;", ties, "exact ties")
PY
expect 0 "run: loss" -- "$HP" run "$WORK/ma" --input $I
expect 0 "run: loss" -- "$HP" run "$WORK/mbf" --input $I
expect 0 "LlamaForCausalLM" -- "$HP" inspect "$WORK/mbf"

# Refused by name, nothing written.
cp -r "$WORK/a/step-4" "$WORK/inc" && rm "$WORK/inc/rank-0.safetensors"
expect 2 "rank-0.safetensors, which state.json names, is missing; the checkpoint is incomplete" -- \
    "$HP" merge "$WORK/inc" --out "$WORK/x"
mkdir -p "$WORK/run2" && cp -r "$WORK/a/step-2" "$WORK/run2/step-2" && cp -r "$WORK/inc" "$WORK/run2/step-4"
expect 0 "merged the checkpoint of step 2" -- "$HP" merge "$WORK/run2" --out "$WORK/x2"
cp -r "$WORK/a/step-4" "$WORK/foreign" && echo '{"step": 4, "flags": {}}' >"$WORK/foreign/state.json"
expect 2 "it is not a checkpoint 'hyperpar train --save-every' wrote" -- "$HP" merge "$WORK/foreign" --out "$WORK/x"
edit_state() { # PYTHON-STATEMENT on s, the state.json of $WORK/a/step-4, written to $WORK/foreign
    python3 - "$WORK/a/step-4/state.json" "$WORK/foreign/state.json" "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); exec(sys.argv[3]); json.dump(s, open(sys.argv[2], "w"))
PY
}
edit_state 's["step"] = 0'
expect 2 "state.json lacks a step >= 1, a world >= 1 or the list of files" -- "$HP" merge "$WORK/foreign" --out "$WORK/x"
edit_state 's["files"].append("../config.json")'
expect 2 "state.json's files[3] is not a file name" -- "$HP" merge "$WORK/foreign" --out "$WORK/x"
edit_state 's["files"].remove("rank-0.safetensors")'
expect 2 "rank-0.safetensors is not listed in state.json" -- "$HP" merge "$WORK/foreign" --out "$WORK/x"
edit_state 's["world"] = 2'
expect 2 "rank-1.safetensors is not listed in state.json" -- "$HP" merge "$WORK/foreign" --out "$WORK/x"
echo '{"step": ' >"$WORK/foreign/state.json"
expect 2 "state.json does not read as JSON" -- "$HP" merge "$WORK/foreign" --out "$WORK/x"
mkdir -p "$WORK/empty-run/step-3"
expect 2 "holds no complete checkpoint" -- "$HP" merge "$WORK/empty-run" --out "$WORK/x"
check "nothing was written for the refused merges" test ! -e "$WORK/x"
expect 2 "--dtype expects f32 or bf16, got 'f16'" -- "$HP" merge "$WORK/a" --out "$WORK/x" --dtype f16
expect 2 "--max-shard-size and --verify go with a shard folder" -- "$HP" merge "$WORK/a" --out "$WORK/x" --verify
expect 2 "is not empty" -- "$HP" merge "$WORK/a" --out "$WORK/ma"
expect 0 "merged" -- "$HP" merge "$WORK/a/step-2" --out "$WORK/ma" --force
check "--force replaced the earlier merge" cmp -s "$WORK/ma/model.safetensors" "$WORK/m2/model.safetensors"
expect 2 "" -- "$HP" merge "$WORK/a" --out "$WORK/a/step-4/sub"

# A shard folder merges as before; --dtype is not for it.
expect 0 "" -- "$HP" shard $G --tp 2 --out "$WORK/sh" --quiet
expect 2 "--dtype goes with a training checkpoint" -- "$HP" merge "$WORK/sh" --out "$WORK/x" --dtype bf16
expect 0 "merged into" -- "$HP" merge "$WORK/sh" --out "$WORK/shm" --quiet
expect 0 "" -- "$HP" shard "$WORK/shm" --tp 2 --out "$WORK/sh2" --quiet
check "the shard folder merges back (re-sharding gives the same rank files)" \
    cmp -s "$WORK/sh/rank-00001.safetensors" "$WORK/sh2/rank-00001.safetensors"
expect 0 "training checkpoint" -- "$HP" merge --help
finish

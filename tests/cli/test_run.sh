# hyperpar run, one process: every dense golden (logits 1e-4 * max|ref|, loss 1e-5 relative), the output
# file, --plan, --compute bf16, and bad input (exit 2 with the cause, no output file).
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
for fam in llama mistral qwen2 qwen3; do
    expect 0 "logits max diff" -- "$HP" run $F/$fam --input $F/$fam/forward_io.safetensors \
        --compare $F/$fam/forward_io.safetensors
done
# The output holds logits [B,S,V] and loss, and compares equal to the golden.
expect 0 "tokens/s" -- "$HP" run $F/llama --input $F/llama/forward_io.safetensors --output "$WORK/out.st"
expect 0 "logits max diff 0 " -- "$HP" run $F/llama --input $F/llama/forward_io.safetensors --compare "$WORK/out.st"
# A plan file gives the same result.
"$HP" plan $F/qwen2 -o "$WORK/plan.json" 2>/dev/null
expect 0 "OK" -- "$HP" run $F/qwen2 --input $F/qwen2/forward_io.safetensors --plan "$WORK/plan.json" \
    --compare $F/qwen2/forward_io.safetensors
# bf16 activations: within 2e-2 of the f32 golden on these tiny models (docs/run.md).
expect 0 "OK" -- "$HP" run $F/qwen3 --input $F/qwen3/forward_io.safetensors --compute bf16 \
    --compare $F/qwen3/forward_io.safetensors --compare-rtol 2e-2
# A mismatch exits 3: compare llama's logits against mistral's golden of the same [B,S,V].
expect 3 "MISMATCH" -- "$HP" run $F/llama --input $F/llama/forward_io.safetensors --compare $F/qwen3/forward_io.safetensors

# ---- bad input ----
python3 - "$WORK" <<'PY'
import json, struct, sys
w = sys.argv[1]
def st(path, tensors):
    hdr, data, off = {}, b"", 0
    for name, (dt, shape, raw) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw; off += len(raw)
    h = json.dumps(hdr).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
ids = lambda v: struct.pack("<%dq" % len(v), *v)
st(w + "/big.st", {"input_ids": ("I64", [2, 4], ids([1, 2, 3, 4, 5, 6, 128, 7]))})
st(w + "/neg.st", {"input_ids": ("I64", [1, 3], ids([1, -1, 2]))})
st(w + "/f32.st", {"input_ids": ("F32", [1, 2], struct.pack("<2f", 1, 2))})
st(w + "/noids.st", {"tokens": ("I64", [1, 2], ids([1, 2]))})
st(w + "/i32.st", {"input_ids": ("I32", [1, 3], struct.pack("<3i", 1, 2, 3))})
PY
expect 2 "input_ids[1][2] = 128 is outside the vocabulary [0, 128)" -- "$HP" run $F/llama --input "$WORK/big.st" --output "$WORK/o1.st"
check "no output after a bad id" test ! -e "$WORK/o1.st"
expect 2 "input_ids[0][1] = -1" -- "$HP" run $F/llama --input "$WORK/neg.st"
expect 2 "expected I64 (or I32)" -- "$HP" run $F/llama --input "$WORK/f32.st"
expect 2 "no tensor 'input_ids'" -- "$HP" run $F/llama --input "$WORK/noids.st"
expect 0 "tokens/s" -- "$HP" run $F/llama --input "$WORK/i32.st"
printf 'garbage' > "$WORK/trunc.st"
expect 2 "" -- "$HP" run $F/llama --input "$WORK/trunc.st"
expect 2 "the plan's mesh has 2 ranks but 1 processes run it" -- "$HP" run $F/llama --input "$WORK/i32.st" --tp 2
expect 2 "missing the input: --input IDS.safetensors, --input TOKENS.bin --seq S" -- "$HP" run $F/llama
expect 2 "--compute expects exact or bf16" -- "$HP" run $F/llama --input "$WORK/i32.st" --compute fp8
expect 2 "not both" -- "$HP" run $F/llama --input "$WORK/i32.st" --plan "$WORK/plan.json" --tp 1
# --output never over an input.
expect 2 "--output" -- "$HP" run $F/llama --input "$WORK/i32.st" --output "$WORK/i32.st"
check "input kept" test -s "$WORK/i32.st"
# An architecture the runtime does not know is refused by name.
mkdir -p "$WORK/foo" && cp $F/llama/model.safetensors "$WORK/foo/" &&
    sed -e 's/"llama"/"foo"/' -e 's/LlamaForCausalLM/FooForCausalLM/' $F/llama/config.json > "$WORK/foo/config.json"
expect 2 "is not one of them" -- "$HP" run "$WORK/foo" --input "$WORK/i32.st"
# Meta mode (config.json alone) has no weights.
expect 2 "holds no weights" -- "$HP" run $F/llama/config.json --input "$WORK/i32.st"
expect 0 "usage: [mpirun -np N] hyperpar run" -- "$HP" run --help
expect 0 "usage: [mpirun -np N] hyperpar validate" -- "$HP" validate --help
# validate in one process: trivially equal, still a full table.
expect 0 "lm_head" -- "$HP" validate $F/qwen2 --input $F/qwen2/forward_io.safetensors
expect 2 "belong to 'hyperpar run'" -- "$HP" validate $F/qwen2 --input $F/qwen2/forward_io.safetensors --output "$WORK/x.st"
finish

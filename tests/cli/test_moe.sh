# moe: every golden folder and sparse layer through the CLI with --compare, output file contents, capacity
# variants, the suggested-archetype note, and bad input (exit 2) / verification failure (exit 3).
source "$(dirname "$0")/lib.sh"
G="$TESTS/data/golden"
while read -r dir layers; do
    for L in $layers; do
        expect 0 "topk_w max diff" -- "$HP" moe "$G/$dir" --layer "$L" --input "$G/$dir/moe_io.safetensors" \
            --output "$WORK/y_${dir}_$L.safetensors" --compare "$G/$dir/moe_io.safetensors"
        check "$dir layer $L wrote y/topk_idx/topk_w" \
            bash -c "\"$HP\" inspect \"$WORK/y_${dir}_$L.safetensors\" --tensors | grep -q 'topk_idx I32'"
    done
done <<'LIST'
deepseek_v3_per_expert_f32 1 2
glm4_moe_batched_bf16 1
gpt_oss_batched_f32 0
mixtral_batched_bf16 0 1
mixtral_per_expert_f32 0 1
qwen2_moe_per_expert_f32 0 1
qwen3_moe_batched_bf16 0 1
LIST
Q="$G/qwen3_moe_batched_bf16"
expect 0 "archetype qwen3moe_topk_router (suggested for family qwen3_moe" -- "$HP" moe "$Q" --layer 1 --input "$Q/moe_io.safetensors" --compare "$Q/moe_io.safetensors"
expect 0 "tokens per expert:" -- "$HP" moe "$Q" --layer 1 --input "$Q/moe_io.safetensors" --compare "$Q/moe_io.safetensors" --threads 1
for cf in 0.5 1.0; do
    expect 0 "capacity factor $cf (score)" -- "$HP" moe "$Q" --layer 0 --input "$Q/moe_io.safetensors" --capacity-factor $cf --compare "$Q/moe_io.safetensors"
done
expect 0 "dropped" -- "$HP" moe "$G/deepseek_v3_per_expert_f32" --layer 2 --input "$G/deepseek_v3_per_expert_f32/moe_io.safetensors" --capacity-factor 1.0 --compare "$G/deepseek_v3_per_expert_f32/moe_io.safetensors"
# Weights resident in the checkpoint's dtype, and --compute: exact by default; bf16 rounds the activations of
# the expert products (within 1e-2 * max|ref| of the goldens, but not within the exact mode's 1e-4).
expect 0 "resident bf16 (288.00 KiB, mapped), compute exact" -- "$HP" moe "$Q" --layer 1 --input "$Q/moe_io.safetensors" --compare "$Q/moe_io.safetensors"
expect 0 "resident f32" -- "$HP" moe "$G/mixtral_per_expert_f32" --layer 1 --input "$G/mixtral_per_expert_f32/moe_io.safetensors" --compare "$G/mixtral_per_expert_f32/moe_io.safetensors"
expect 0 "compute bf16" -- "$HP" moe "$Q" --layer 1 --compute bf16 --input "$Q/moe_io.safetensors" --compare "$Q/moe_io.safetensors" --compare-rtol 1e-2
expect 3 "MISMATCH" -- "$HP" moe "$Q" --layer 1 --compute bf16 --input "$Q/moe_io.safetensors" --compare "$Q/moe_io.safetensors"
expect 2 "--compute expects exact or bf16, got 'f16'" -- "$HP" moe "$Q" --layer 1 --compute f16 --input "$Q/moe_io.safetensors" --compare "$Q/moe_io.safetensors"
# Verification failures exit 3: another layer's reference, or the first-come policy against score output.
expect 3 "differs from" -- "$HP" moe "$Q" --layer 1 --input "$Q/moe_io.safetensors" --compare "$Q/moe_io.safetensors" --ref-prefix layers.0.
expect 3 "MISMATCH" -- "$HP" moe "$Q" --layer 0 --input "$Q/moe_io.safetensors" --capacity-factor 0.5 --capacity-policy first --compare "$Q/moe_io.safetensors"
# Bad input: exit 2 with the reason.
expect 2 "layer 0 of" -- "$HP" moe "$G/deepseek_v3_per_expert_f32" --layer 0 --input "$Q/moe_io.safetensors" --output "$WORK/o.safetensors"
# x with a NaN at row 1, column 3 (a hand-written safetensors file: 8-byte header length, JSON, data).
hdr='{"x":{"dtype":"F32","shape":[2,64],"data_offsets":[0,512]}}'
{ printf "\x$(printf %02x ${#hdr})\x00\x00\x00\x00\x00\x00\x00%s" "$hdr"; head -c 268 /dev/zero
  printf '\x00\x00\xc0\x7f'; head -c 240 /dev/zero; } > "$WORK/nan.safetensors"
expect 2 "input x row 1 column 3 holds NaN" -- "$HP" moe "$Q" --layer 1 --input "$WORK/nan.safetensors" --output "$WORK/o.safetensors"
M="$G/mixtral_per_expert_f32"
printf '%s' "$("$HP" gen --family mixtral --out "$WORK/wide" --hidden 48 2>&1)" > /dev/null
expect 2 "but layer 1 has hidden size 48; expected [T, 48]" -- "$HP" moe "$WORK/wide" --layer 1 --input "$M/moe_io.safetensors" --output "$WORK/o.safetensors"
expect 2 "lacks shared_experts, which archetype deepseekv3_sigmoid_group_shared needs" -- "$HP" moe "$Q" --layer 1 --input "$Q/moe_io.safetensors" --output "$WORK/o.safetensors" --archetype deepseekv3_sigmoid_group_shared
expect 2 "unknown archetype 'qwen'" -- "$HP" moe "$Q" --layer 1 --input "$Q/moe_io.safetensors" --output "$WORK/o.safetensors" --archetype qwen
expect 2 "--capacity-policy expects score or first" -- "$HP" moe "$Q" --layer 1 --input "$Q/moe_io.safetensors" --output "$WORK/o.safetensors" --capacity-policy last
expect 2 "missing --layer" -- "$HP" moe "$Q" --input "$Q/moe_io.safetensors" --output "$WORK/o.safetensors"
expect 2 "no tensor 'x'" -- "$HP" moe "$Q" --layer 1 --input "$Q/model.safetensors" --output "$WORK/o.safetensors"
check "no output left behind on failure" test ! -e "$WORK/o.safetensors"
expect 0 "usage: hyperpar moe MODEL" -- "$HP" moe --help
expect 0 "usage: hyperpar bench moe" -- "$HP" bench moe --help
expect 2 "unknown preset 'llama'" -- "$HP" bench moe --preset llama --tokens 4
expect 2 "unknown benchmark 'mpi'" -- "$HP" bench mpi
# bench moe: the compute mode, and bf16 experts resident as exactly their bf16 bytes (exact mode never hands
# bf16 weights to oneDNN, so nothing is packed or widened into an owned copy).
expect 0 "compute  : bf16 (activations rounded to bf16" -- "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --dtype bf16 --compute bf16 --ep 64 --reps 1
expect 0 '"compute": "bf16", "reps": 1' -- "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --dtype bf16 --compute bf16 --ep 64 --reps 1 --json
expect 0 '"resident_ratio": 1.0000, "linear_owned_bytes": 0' -- "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --dtype bf16 --ep 64 --reps 1 --json
# Issue 40: the layer's median with its min and max over the reps, and the host's load at the start and the end.
"$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --dtype bf16 --ep 64 --reps 3 --json >"$WORK/bm3.json" 2>/dev/null </dev/null
check "bench moe: the layer's spread and the load" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["reps"] == 3 and 0 < d["min_s"] <= d["median_s"] <= d["max_s"], d
assert all(d[k] >= 0 or d[k] == -1 for k in ("load_start", "load_end")), d' "$WORK/bm3.json"
out=$("$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --dtype bf16 --ep 64 --reps 3 2>&1 </dev/null)
check "bench moe: the layer line has its spread" grep -q "layer    : [0-9.]* ms median of 3 (min [0-9.]*, max [0-9.]*) -> " <<<"$out"
check "bench moe: the load line" grep -q "^  load     : 1-minute load average .* at start, .* at end (" <<<"$out"
# bench moe times PyTorch eager's block on the same shapes when python imports torch. A fake python checks that it
# gets the embedded scripts (torch_model.py, then torch_moe.py) and the preset's dimensions, and prints a fixed
# 0.5 s forward: the ratio is hyperpar's tokens/s over 4 / 0.5 = 8. A simulated EP rank is not compared.
cat >"$WORK/fakepy" <<'EOF'
#!/bin/bash
[[ $1 == -c ]] && exit 0 # the probe: python3 -c 'import torch'
[[ $1 == -B && $2 == -c && $3 == *"sys.modules['torch_model'] = m"* ]] || exit 9
[[ $4 == *"def read_safetensors"* && $5 == *"Qwen3MoeSparseMoeBlock"* ]] && src=yes || src=no
[[ -n ${FAKE_ERROR:-} ]] && { echo "{\"error\": \"$FAKE_ERROR\"}"; exit 0; }
shift 5
echo "{\"median_s\": 0.5, \"tokens_per_s\": 8, \"threads\": 2, \"model\": \"src=$src $*\", \"torch\": \"9.9\"}"
EOF
chmod +x "$WORK/fakepy"
HP_BENCH_PYTHON="$WORK/fakepy" "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --dtype bf16 --reps 1 --threads 2 --json \
    >"$WORK/bm.json" 2>/dev/null </dev/null
check "bench moe: PyTorch's figures, the ratio, the shapes it ran" python3 - "$WORK/bm.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
pt = d["pytorch_eager"]
assert pt["median_s"] == 0.5 and pt["tokens_per_s"] == 8 and pt["dtype"] == "bf16", pt
assert pt["min_s"] is None and pt["max_s"] is None, pt  # this stand-in prints no spread: null, never made up
assert pt["model"] == ("src=yes --family qwen3_moe --hidden 2048 --experts 128 --top-k 8 --intermediate 768 "
                       "--shared 0 --groups 1 --topk-group 1 --tokens 4 --threads 2 --reps 1 --dtype bf16"), pt
assert abs(d["ratio_over_pytorch"] - d["tokens_per_s"] / 8) <= 1e-5 * d["ratio_over_pytorch"], d
EOF
expect 0 "PyTorch eager: not measured (the layer runs as one rank of a simulated expert-parallel group" -- \
    env HP_BENCH_PYTHON="$WORK/fakepy" "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --dtype bf16 --ep 64 --reps 1
expect 0 "fakepy failed: no module named transformers" -- env FAKE_ERROR="no module named transformers" \
    HP_BENCH_PYTHON="$WORK/fakepy" "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --dtype bf16 --reps 1 --threads 2
finish

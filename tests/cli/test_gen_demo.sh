# gen for every family and layout, inspect of the result, demo end to end.
source "$(dirname "$0")/lib.sh"
for fam in llama mistral qwen2 qwen3 mixtral qwen2_moe qwen3_moe deepseek_v3 glm4_moe gpt_oss; do
    expect 0 "wrote" -- "$HP" gen --family "$fam" --out "$WORK/$fam" --layers 3 --seed 3
    expect 0 "family $fam" -- "$HP" inspect "$WORK/$fam"
    expect 0 "family $fam" -- "$HP" inspect "$WORK/$fam/config.json"
done
# MLA has no head_dim: transformers 5.x keeps a written one and its rope tables then miss q's rope part
check "deepseek_v3's config has no head_dim (qk_rope_head_dim is it)" \
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); sys.exit("head_dim" in c or "qk_rope_head_dim" not in c)' \
    "$WORK/deepseek_v3/config.json"
check "llama's config keeps its head_dim" grep -q '"head_dim"' "$WORK/llama/config.json"
expect 0 "layout batched" -- "$HP" gen --family mixtral --out "$WORK/mb" --expert-layout batched --dtype bf16
expect 0 "layout batched" -- "$HP" inspect "$WORK/mb"
expect 0 "BF16" -- "$HP" inspect "$WORK/mb"
expect 2 "is not empty" -- "$HP" gen --family mixtral --out "$WORK/mb"
expect 0 "wrote" -- "$HP" gen --family mixtral --out "$WORK/mb" --force
expect 0 "meta mode reproduces all" -- "$HP" demo
expect 0 "files kept in $WORK/demo" -- "$HP" demo --out "$WORK/demo"
check "demo leaves its model" test -f "$WORK/demo/model/model.safetensors"
out=$("$HP" demo --out "$WORK/demo" 2>&1)
check "demo runs the dense forward pass on 2 ranks" grep -q "2 MPI ranks (tp=2, sequence-parallel) give the one-process logits" <<<"$out"
check "demo validates every boundary" grep -q "loss: distributed .*: ok" <<<"$out"
check "demo's validate table has no divergence" test "$(grep -c DIVERGES <<<"$out")" = 0
check "demo runs the MoE model on tp=2 x ep=2" grep -q "2 MPI ranks (tp=2 x ep=2" <<<"$out"
check "demo validates the MoE model" test "$(grep -c "loss: distributed .*: ok" <<<"$out")" = 2
check "demo trains the dense model 3 steps on tp=2, loss falling" grep -q "3 AdamW steps over 2 ranks (tp=2) on the same batch: loss .*, falling" <<<"$out"
check "demo trains on a token file, resumes bit for bit" grep -q "8 steps on a token file over 2 ranks: loss .*; stopped after step 4 and resumed, the final checkpoint is the same bytes" <<<"$out"
check "demo trains the MoE model 3 steps on tp=2 x ep=2, loss falling" grep -q "3 AdamW steps over 2 ranks (tp=2 x ep=2) on the same batch: loss .*, falling" <<<"$out"

# --seed takes every uint64 value; above INT64_MAX it is a distinct seed, never clamped.
expect 0 "seed 18446744073709551615" -- "$HP" gen --family llama --out "$WORK/s1" --seed 18446744073709551615
expect 0 "seed 9223372036854775807" -- "$HP" gen --family llama --out "$WORK/s2" --seed 9223372036854775807
expect 0 "seed 9223372036854775808" -- "$HP" gen --family llama --out "$WORK/s3" --seed 9223372036854775808
differ() { ! cmp -s "$1" "$2"; }
check "seeds above INT64_MAX are not clamped" differ "$WORK/s2/model.safetensors" "$WORK/s3/model.safetensors"
check "seeds above INT64_MAX differ from each other" differ "$WORK/s1/model.safetensors" "$WORK/s3/model.safetensors"
for bad in 18446744073709551616 -1 +5 " 5" 1e3 0x10 ""; do
    expect 2 "--seed expects an integer in [0, 18446744073709551615]" -- "$HP" gen --family llama --out "$WORK/sb" --seed "$bad"
done
# gpt-oss has only the batched layout: gen says so instead of echoing the request.
expect 0 "layout batched: the family has no other" -- "$HP" gen --family gpt_oss --out "$WORK/go" --expert-layout per-expert
expect 0 "layout batched" -- "$HP" gen --family gpt_oss --out "$WORK/go2"
expect 0 "layout batched" -- "$HP" inspect "$WORK/go"
# --help and the checks agree on every range: each documented maximum is accepted by the parser, one above
# is a usage error naming the same range.
"$HP" gen --help > "$WORK/help.txt"
while read -r opt max; do
    check "gen --help documents $opt as 1..$max" grep -q -- "$opt .*1\.\.$max" "$WORK/help.txt"
    expect 2 "$opt expects an integer in [1, $max]" -- "$HP" gen --family llama --out "$WORK/r" "$opt" $((max + 1))
done <<'LIST'
--experts 4096
--top-k 4096
--layers 65536
--hidden 65536
--vocab 65536
--kv-heads 65536
LIST
expect 2 "--experts 8 and --top-k 9: need 1 <= top-k <= experts <= 4096" -- "$HP" gen --family qwen3_moe --out "$WORK/r" --experts 8 --top-k 9
# --out must name a folder of its own: a usage error (exit 2), not ENOENT/EBUSY (exit 1).
expect 2 "--out is empty" -- "$HP" gen --family llama --out ""
for out in . .. / "$WORK/x/." "$WORK/x/.."; do
    expect 2 "does not name a folder of its own" -- "$HP" gen --family llama --out "$out" --force
done
finish

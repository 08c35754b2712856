# gen for every family and layout, inspect of the result, demo end to end.
source "$(dirname "$0")/lib.sh"
for fam in llama mistral qwen2 qwen3 mixtral qwen2_moe qwen3_moe deepseek_v3 glm4_moe gpt_oss; do
    expect 0 "wrote" -- "$HP" gen --family "$fam" --out "$WORK/$fam" --layers 3 --seed 3
    expect 0 "family $fam" -- "$HP" inspect "$WORK/$fam"
    expect 0 "family $fam" -- "$HP" inspect "$WORK/$fam/config.json"
done
expect 0 "layout batched" -- "$HP" gen --family mixtral --out "$WORK/mb" --expert-layout batched --dtype bf16
expect 0 "layout batched" -- "$HP" inspect "$WORK/mb"
expect 0 "BF16" -- "$HP" inspect "$WORK/mb"
expect 2 "is not empty" -- "$HP" gen --family mixtral --out "$WORK/mb"
expect 0 "wrote" -- "$HP" gen --family mixtral --out "$WORK/mb" --force
expect 0 "meta mode reproduces all" -- "$HP" demo
expect 0 "files kept in $WORK/demo" -- "$HP" demo --out "$WORK/demo"
check "demo leaves its model" test -f "$WORK/demo/model/model.safetensors"
finish

# inspect: the eight real configs (meta mode), golden checkpoints, JSON keys, corrupt inputs.
source "$(dirname "$0")/lib.sh"
D="$TESTS/data"
while read -r file total; do
    for layout in per-expert batched; do
        expect 0 "\"num_params\": $total," -- "$HP" inspect "$D/configs/$file" --json --expert-layout "$layout"
    done
done <<'LIST'
mixtral-8x7b.json 46702792704
qwen1.5-moe-a2.7b.json 14315784192
qwen3-30b-a3b.json 30532122624
deepseek-v3.json 671026419200
glm-4.5-air.json 106852251264
llama-3-8b.json 8030261248
qwen2.5-7b.json 7615616512
gpt-oss-20b.json 20914757184
LIST

# Golden checkpoints: tensor counts and a few exact lines of --tensors.
while read -r dir count; do
    expect 0 "\"num_tensors\": $count," -- "$HP" inspect "$D/golden/$dir" --json
    n=$("$HP" inspect "$D/golden/$dir" --tensors | grep -c '^model\.\|^lm_head')
    check "$dir lists $count tensors (got $n)" test "$n" -eq "$count"
done <<'LIST'
deepseek_v3_per_expert_f32 139
glm4_moe_batched_bf16 31
gpt_oss_batched_f32 20
mixtral_batched_bf16 21
mixtral_per_expert_f32 65
qwen2_moe_per_expert_f32 79
qwen3_moe_batched_bf16 25
LIST
expect 0 "model.layers.1.mlp.experts.gate_up_proj BF16 [16, 96, 64]" -- "$HP" inspect "$D/golden/qwen3_moe_batched_bf16" --tensors
expect 0 "model.layers.1.mlp.gate.e_score_correction_bias F32 [8]" -- "$HP" inspect "$D/golden/glm4_moe_batched_bf16" --tensors
expect 0 "model.layers.0.mlp.experts.gate_up_proj F32 [8, 64, 96]" -- "$HP" inspect "$D/golden/gpt_oss_batched_f32" --tensors
expect 0 "model.layers.1.block_sparse_moe.experts.7.w2.weight F32 [64, 96]" -- "$HP" inspect "$D/golden/mixtral_per_expert_f32" --tensors
expect 0 "\"BF16\": " -- "$HP" inspect "$D/golden/glm4_moe_batched_bf16" --json
expect 0 "\"total_bytes\": " -- "$HP" inspect "$D/golden/glm4_moe_batched_bf16/model.safetensors" --json
expect 0 "shared_expert_gate.weight" -- "$HP" inspect "$D/golden/qwen2_moe_per_expert_f32" --tree
expect 0 "experts       16 routed, top-4" -- "$HP" inspect "$D/golden/qwen3_moe_batched_bf16"

# Bad input: exit 2 with a message naming the problem.
expect 2 "no such file or folder" -- "$HP" inspect "$WORK/nothing"
printf 'PK\003\004 this is a zip' > "$WORK/zip.safetensors"
expect 2 "zip" -- "$HP" inspect "$WORK/zip.safetensors"
printf '\200\002ctorch' > "$WORK/pickle.safetensors"
expect 2 "pickle" -- "$HP" inspect "$WORK/pickle.safetensors"
head -c 100 "$D/golden/qwen3_moe_batched_bf16/model.safetensors" > "$WORK/trunc.safetensors"
expect 2 "trunc.safetensors" -- "$HP" inspect "$WORK/trunc.safetensors"
printf '{\n  "model_type": "llama",\n  "hidden_size": [64]\n}\n' > "$WORK/config.json"
expect 2 "config.json:3:18: field \"hidden_size\" must be a non-negative integer no larger than 2^40, found an array" -- "$HP" inspect "$WORK/config.json"
printf '{"model_type": "gpt2", "n_embd": 64}' > "$WORK/gpt2.json"
expect 2 "known families: llama" -- "$HP" inspect "$WORK/gpt2.json"
mkdir "$WORK/empty"
expect 2 "neither *.safetensors files nor a config.json" -- "$HP" inspect "$WORK/empty"
# A real checkpoint with a broken config.json beside it is refused too.
mkdir "$WORK/ck" && cp "$D/golden/mixtral_batched_bf16/model.safetensors" "$WORK/ck/" && printf '{"model_type": 3}' > "$WORK/ck/config.json"
expect 2 "\"model_type\" must be a string" -- "$HP" inspect "$WORK/ck"
finish

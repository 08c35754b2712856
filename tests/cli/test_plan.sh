# plan: formats, determinism, mesh errors with the spec's teaching messages, exit codes.
source "$(dirname "$0")/lib.sh"
D="$TESTS/data"
expect 0 '"format": "hyperpar-plan"' -- "$HP" plan "$D/golden/qwen3_moe_batched_bf16" --tp 2 --ep 2
expect 0 '"version": 1' -- "$HP" plan "$D/configs/llama-3-8b.json" --mesh dp=2,cp=1,tp=4
expect 0 '"mesh_dim_names"' -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 4
expect 0 '"ep_size": 4' -- "$HP" plan "$D/golden/qwen2_moe_per_expert_f32" --dp 2 --tp 2 --ep 4
expect 0 '"experts.gate_proj"' -- "$HP" plan "$D/golden/qwen2_moe_per_expert_f32" --dp 2 --tp 2 --ep 4
expect 0 '=== ShardingPlan introspection report ===' -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --format explain
expect 0 'all_gather' -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --format explain --fqn model.layers.0.self_attn
expect 0 'colwise' -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --format hf
expect 0 '"S(1)x2"' -- "$HP" plan "$D/golden/mixtral_batched_bf16" --tp 2 --packed-fused

# Same input => byte-identical output; -o writes the same bytes atomically.
"$HP" plan "$D/configs/deepseek-v3.json" --tp 8 --dp 2 --ep 16 > "$WORK/a.json"
"$HP" plan "$D/configs/deepseek-v3.json" --tp 8 --dp 2 --ep 16 -o "$WORK/b.json"
check "plan output is deterministic" cmp -s "$WORK/a.json" "$WORK/b.json"
check "no temporary file left" test -z "$(ls "$WORK" | grep tmp)"

# Impossible requests: exit 2 with the teaching message.
expect 2 "num_attention_heads (32) is not divisible by tp (3)" -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 3
expect 2 "num_key_value_heads (4) is not divisible by tp (8)" -- "$HP" plan "$D/configs/qwen3-30b-a3b.json" --tp 8
expect 2 "must divide the dense region" -- "$HP" plan "$D/configs/qwen3-30b-a3b.json" --tp 2 --ep 4
expect 2 "num_experts (8) must be divisible by" -- "$HP" plan "$D/configs/mixtral-8x7b.json" --dp 3 --tp 2 --ep 6
expect 2 "EP>1 requires MoE model" -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --ep 2
expect 2 "has 8 ranks but the world size is 6" -- "$HP" plan "$D/configs/llama-3-8b.json" --mesh dp=2,tp=4 --world 6
expect 2 "unknown axis 'tq'" -- "$HP" plan "$D/configs/llama-3-8b.json" --mesh tq=2
expect 2 "pipeline parallelism" -- "$HP" plan "$D/configs/llama-3-8b.json" --mesh pp=2,tp=2
expect 2 "fused gate/up" -- "$HP" plan "$D/golden/mixtral_batched_bf16" --tp 2
expect 2 "sequence length 10 is not divisible by 2*cp" -- "$HP" plan "$D/configs/llama-3-8b.json" --cp 2 --seq-len 10
expect 2 "either --mesh or --dp" -- "$HP" plan "$D/configs/llama-3-8b.json" --mesh tp=2 --tp 2
expect 2 "--ep-axis needs an ep axis" -- "$HP" plan "$D/configs/llama-3-8b.json" --mesh tp=2 --ep-axis
expect 2 "--format must be" -- "$HP" plan "$D/configs/llama-3-8b.json" --format yaml
expect 0 "usage: hyperpar plan" -- "$HP" plan --help
# --freeze exempts parameters from coverage; an unmatched pattern warns.
expect 0 "matched no parameter" -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --freeze 'nothing.*'
finish

# plan: formats, determinism, mesh errors with the spec's teaching messages, exit codes.
source "$(dirname "$0")/lib.sh"
D="$TESTS/data"
G="$D/golden"
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
expect 2 "pp must be the mesh's first (outermost) axis" -- "$HP" plan "$D/configs/llama-3-8b.json" --mesh tp=2,pp=2
expect 2 "fused gate/up" -- "$HP" plan "$D/golden/mixtral_batched_bf16" --tp 2
expect 2 "sequence length 10 is not divisible by 2*cp" -- "$HP" plan "$D/configs/llama-3-8b.json" --cp 2 --seq-len 10
expect 2 "either --mesh or --dp" -- "$HP" plan "$D/configs/llama-3-8b.json" --mesh tp=2 --tp 2
expect 2 "--ep-axis needs an ep axis" -- "$HP" plan "$D/configs/llama-3-8b.json" --mesh tp=2 --ep-axis
expect 2 "--format must be" -- "$HP" plan "$D/configs/llama-3-8b.json" --format yaml
expect 0 "usage: hyperpar plan" -- "$HP" plan --help
# --freeze exempts parameters from coverage; an unmatched pattern warns.
expect 0 "matched no parameter" -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --freeze 'nothing.*'
# Issue 10, item 16: --mesh items are NAME=SIZE, each axis once, sizes plain digits; nonsense is exit 2.
L="$D/configs/llama-3-8b.json"
expect 2 "item 2 is empty (a trailing comma)" -- "$HP" plan "$L" --mesh tp=2,
expect 2 "item 1 is empty (a leading comma)" -- "$HP" plan "$L" --mesh ,tp=2
expect 2 "item 2 is empty (a doubled comma)" -- "$HP" plan "$L" --mesh dp=2,,tp=2
expect 2 "a space or control character at position 4" -- "$HP" plan "$L" --mesh "tp= 2"
expect 2 "written as plain digits, got '+2'" -- "$HP" plan "$L" --mesh tp=+2
expect 2 "written as plain digits, got '0'" -- "$HP" plan "$L" --mesh tp=0
expect 2 "written as plain digits, got '-2'" -- "$HP" plan "$L" --mesh tp=-2
expect 2 "must be an integer in [1, 1048576]" -- "$HP" plan "$L" --mesh tp=99999999999999999999
expect 2 "axis 'tp' appears twice" -- "$HP" plan "$L" --mesh tp=2,tp=2
expect 2 "has more than 1073741824 ranks" -- "$HP" plan "$L" --mesh dp=1048576,cp=1048576
expect 2 "has more than 1073741824 ranks" -- "$HP" plan "$L" --dp 1048576 --cp 1048576 --tp 1048576 --ep 1048576 --ep-axis
expect 2 "--tp expects an integer in [1, 1048576] written as plain digits, got ' 2'" -- "$HP" plan "$L" --tp " 2"
expect 2 "--world expects an integer" -- "$HP" plan "$L" --world 8x
expect 2 "--tp is given twice" -- "$HP" plan "$L" --tp 2 --tp 4
expect 2 "--mesh is given twice" -- "$HP" plan "$L" --mesh tp=2 --mesh tp=4
expect 2 "--format is given twice" -- "$HP" plan "$L" --format json --format hf
expect 2 "expected exactly one MODEL" -- "$HP" plan "$L" "$L"
# --fqn: a boundary, a parameter or module inside one (its boundary is explained), else exit 2 with close names.
expect 2 "--fqn 'nothing.here' names no boundary, module or parameter" -- "$HP" plan "$L" --tp 2 --format explain --fqn nothing.here
expect 2 "close names: 'model.layers.0.self_attn'" -- "$HP" plan "$L" --tp 2 --format explain --fqn model.layers.0.self_atn
expect 0 "explaining the boundary 'model.layers.0.self_attn'" -- "$HP" plan "$L" --tp 2 --format explain --fqn model.layers.0.self_attn.q_proj.weight
expect 0 "[model.layers.0.self_attn]" -- "$HP" plan "$L" --tp 2 --format explain --fqn model.layers.0.self_attn.q_proj
expect 2 "--fqn selects the boundary that --format explain reports" -- "$HP" plan "$L" --tp 2 --fqn model.layers.0.self_attn
expect 2 "--suggest-overrides prints YAML overrides; it does not combine with --format" -- "$HP" plan "$G/qwen3_moe_batched_bf16" --tp 2 --ep 2 --suggest-overrides --format json
expect 2 "--freeze '[abc' is not a valid glob" -- "$HP" plan "$L" --tp 2 --freeze '[abc'
# --no-derive alone would give a plan that covers nothing.
expect 2 "--no-derive makes a plan of the overrides only, and none were given" -- "$HP" plan "$L" --tp 2 --no-derive
# -o: a file, not one of the inputs; written atomically.
mkdir -p "$WORK/m" && cp "$L" "$WORK/m/config.json"
expect 2 "-o '$WORK' is a folder" -- "$HP" plan "$L" --tp 2 -o "$WORK"
expect 2 "-o needs a file name" -- "$HP" plan "$L" --tp 2 -o ""
expect 2 "does not exist; create it first" -- "$HP" plan "$L" --tp 2 -o "$WORK/none/p.json"
expect 2 "is one of the inputs" -- "$HP" plan "$WORK/m" --tp 2 -o "$WORK/m/config.json"
expect 2 "is one of the inputs" -- "$HP" plan "$WORK/m/config.json" --tp 2 -o "$WORK/m/config.json"
expect 2 "is one of the inputs" -- "$HP" plan "$WORK/m" --tp 2 -o "$WORK/m/model-00001-of-00002.safetensors"
check "the model's config.json is untouched" cmp -s "$L" "$WORK/m/config.json"
expect 0 "" -- "$HP" plan "$WORK/m" --tp 2 -o "$WORK/m/plan.json"
check "a plan beside the model is fine" grep -q '"hyperpar-plan"' "$WORK/m/plan.json"
if [ -e /dev/full ]; then
    ln -sf /dev/full "$WORK/full.json"
    expect 2 "is a device, FIFO or socket, not a regular file" -- "$HP" plan "$L" --tp 2 -o "$WORK/full.json"
fi
check "no temporary file left by the refused runs" test -z "$(ls "$WORK" "$WORK/m" | grep '\.tmp\.')"
finish

# MoE layers run from a shard folder: `hyperpar shard --dp 2 --ep 2` then `mpirun -np 2 hyperpar moe DIR --ep 2`
# matches the golden reference and the full-checkpoint run; a TP-sliced shared expert, an ep mismatch, a
# missing rank file and a one-process run from an ep=2 folder are refused on every rank with the cause.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
# (a list, not `while read`: mpirun would swallow the loop's stdin)
for entry in "qwen2_moe_per_expert_f32 0 qwen2moe_shared_expert_gate" \
    "qwen2_moe_per_expert_f32 1 qwen2moe_shared_expert_gate" \
    "qwen3_moe_batched_bf16 0 qwen3moe_topk_router" "qwen3_moe_batched_bf16 1 qwen3moe_topk_router" \
    "deepseek_v3_per_expert_f32 1 deepseekv3_sigmoid_group_shared" \
    "deepseek_v3_per_expert_f32 2 deepseekv3_sigmoid_group_shared"; do
    read -r dir layer arch <<<"$entry"
    G=data/golden/$dir
    S="$WORK/$dir.ep2"
    [ -d "$S" ] || "$HP" shard "$G" --dp 2 --ep 2 --out "$S" >/dev/null 2>&1
    check "$dir: shard folder written" test -f "$S/manifest.json" -a -f "$S/rank-00001.safetensors"
    expect 0 "OK" -- $MPI -np 2 "$HP" moe "$S" --layer "$layer" --ep 2 --archetype "$arch" \
        --input "$G/moe_io.safetensors" --compare "$G/moe_io.safetensors"
    # Identical to the run from the full checkpoint (same experts, same exchange).
    $MPI -np 2 "$HP" moe "$G" --layer "$layer" --ep 2 --archetype "$arch" --input "$G/moe_io.safetensors" \
        --output "$WORK/full.st" 2>/dev/null
    expect 0 "OK" -- $MPI -np 2 "$HP" moe "$S" --layer "$layer" --ep 2 --archetype "$arch" \
        --input "$G/moe_io.safetensors" --compare "$WORK/full.st" --ref-prefix "" --compare-rtol 1e-30
done

# One process from an ep=1 folder (rank 0 holds every expert) matches the golden.
G=data/golden/qwen2_moe_per_expert_f32
"$HP" shard "$G" --dp 2 --out "$WORK/qwen2.ep1" >/dev/null 2>&1
expect 0 "OK" -- "$HP" moe "$WORK/qwen2.ep1" --layer 1 --archetype qwen2moe_shared_expert_gate \
    --input "$G/moe_io.safetensors" --compare "$G/moe_io.safetensors"
# ... but not from an ep=2 folder.
expect 2 "a run without mpirun needs every expert" -- "$HP" moe "$WORK/qwen2_moe_per_expert_f32.ep2" --layer 1 \
    --archetype qwen2moe_shared_expert_gate --input "$G/moe_io.safetensors" --output "$WORK/y.st"
# tp=2 slices the shared expert: refused, naming the tensor and its slice.
"$HP" shard "$G" --tp 2 --ep 2 --out "$WORK/qwen2.tp2" >/dev/null 2>&1
expect 2 "shared_expert.gate_proj.weight' is held only as the slice dim 0" -- $MPI -np 2 "$HP" moe "$WORK/qwen2.tp2" \
    --layer 1 --ep 2 --archetype qwen2moe_shared_expert_gate --input "$G/moe_io.safetensors" --output "$WORK/y.st"
expect 2 "shard with --tp 1 for MoE runs" -- $MPI -np 2 "$HP" moe "$WORK/qwen2.tp2" \
    --layer 1 --ep 2 --archetype qwen2moe_shared_expert_gate --input "$G/moe_io.safetensors" --output "$WORK/y.st"
# Sharded for ep=4, run with ep=2: both ranges named.
"$HP" shard "$G" --dp 4 --ep 4 --out "$WORK/qwen2.ep4" >/dev/null 2>&1
RANGES="holds experts [0, 2) of layer 1's 8 ('model.layers.1.mlp.experts.gate_proj'), but this process needs experts [0, 4)"
expect 2 "$RANGES" -- $MPI -np 2 "$HP" moe "$WORK/qwen2.ep4" --layer 1 --ep 2 --archetype qwen2moe_shared_expert_gate \
    --input "$G/moe_io.safetensors" --output "$WORK/y.st"
# A missing rank file ends every rank with the cause.
cp -r "$WORK/qwen2_moe_per_expert_f32.ep2" "$WORK/broken"
rm "$WORK/broken/rank-00001.safetensors"
expect 2 "rank 1: $WORK/broken/rank-00001.safetensors is missing" -- $MPI -np 2 "$HP" moe "$WORK/broken" --layer 1 \
    --ep 2 --archetype qwen2moe_shared_expert_gate --input "$G/moe_io.safetensors" --output "$WORK/y.st"
check "no output left behind by failed runs" test ! -e "$WORK/y.st"
finish

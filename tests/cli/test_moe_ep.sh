# Expert parallelism over MPI: every golden folder and sparse layer at np = 2 and 4 (and tp=2 x ep=2 on 4
# ranks) against the golden reference and the one-process output; overlap identical; failures end all ranks.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
while read -r dir layer arch; do
    G=data/golden/$dir
    "$HP" moe "$G" --layer "$layer" --archetype "$arch" --input "$G/moe_io.safetensors" --output "$WORK/one.st" 2>/dev/null </dev/null
    for np in 2 4; do
        expect 0 "OK" -- $MPI -np $np "$HP" moe "$G" --layer "$layer" --ep $np --archetype "$arch" \
            --input "$G/moe_io.safetensors" --compare "$G/moe_io.safetensors"
        expect 0 "OK" -- $MPI -np $np "$HP" moe "$G" --layer "$layer" --ep $np --archetype "$arch" \
            --input "$G/moe_io.safetensors" --compare "$WORK/one.st" --ref-prefix "" --compare-rtol 1e-5
    done
    expect 0 "OK" -- $MPI -np 4 "$HP" moe "$G" --layer "$layer" --mesh dp=2,tp=2 --ep 2 --archetype "$arch" \
        --input "$G/moe_io.safetensors" --compare "$G/moe_io.safetensors"
    # --overlap gives the same numbers as without it.
    $MPI -np 2 "$HP" moe "$G" --layer "$layer" --ep 2 --archetype "$arch" --input "$G/moe_io.safetensors" \
        --output "$WORK/plain.st" 2>/dev/null </dev/null
    expect 0 "OK" -- $MPI -np 2 "$HP" moe "$G" --layer "$layer" --ep 2 --archetype "$arch" --overlap \
        --input "$G/moe_io.safetensors" --compare "$WORK/plain.st" --ref-prefix "" --compare-rtol 1e-30
done <<'LIST'
deepseek_v3_per_expert_f32 1 deepseekv3_sigmoid_group_shared
deepseek_v3_per_expert_f32 2 deepseekv3_sigmoid_group_shared
glm4_moe_batched_bf16 1 deepseekv3_sigmoid_group_shared
gpt_oss_batched_f32 0 gptoss_topk_router
mixtral_batched_bf16 0 mixtral_topk_router
mixtral_batched_bf16 1 mixtral_topk_router
mixtral_per_expert_f32 1 mixtral_topk_router
qwen2_moe_per_expert_f32 0 qwen2moe_shared_expert_gate
qwen2_moe_per_expert_f32 1 qwen2moe_shared_expert_gate
qwen3_moe_batched_bf16 0 qwen3moe_topk_router
qwen3_moe_batched_bf16 1 qwen3moe_topk_router
LIST

G=data/golden/qwen3_moe_batched_bf16
# The EP compute is chosen explicitly: without --archetype or --overrides, preflight prints the YAML.
expect 2 "_target_: qwen3moe_topk_router" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --ep 2 --input "$G/moe_io.safetensors" --output "$WORK/y.st"
expect 0 "OK" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --ep 2 --overrides data/overrides/qwen3_moe_ep.yaml \
    --input "$G/moe_io.safetensors" --compare "$G/moe_io.safetensors"
# Failures: every rank exits non-zero with the cause, quickly.
expect 2 "num_experts (8) must be divisible by ep_size (3)" -- $MPI -np 3 "$HP" moe data/golden/mixtral_batched_bf16 \
    --layer 0 --ep 3 --archetype mixtral_topk_router --input data/golden/mixtral_batched_bf16/moe_io.safetensors --output "$WORK/y.st"
expect 2 "has 4 ranks but mpirun started 2" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --mesh dp=4 --ep 2 \
    --archetype qwen3moe_topk_router --input "$G/moe_io.safetensors" --output "$WORK/y.st"
expect 2 "rank 1: $WORK/nothing: no such file or folder" -- $MPI \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --input "$G/moe_io.safetensors" --output "$WORK/y.st" : \
    -np 1 "$HP" moe "$WORK/nothing" --layer 1 --ep 2 --archetype qwen3moe_topk_router --input "$G/moe_io.safetensors" --output "$WORK/y.st"
expect 2 "disagrees with rank 0" -- $MPI \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --input "$G/moe_io.safetensors" --output "$WORK/y.st" : \
    -np 1 "$HP" moe "$G" --layer 0 --ep 2 --archetype qwen3moe_topk_router --input "$G/moe_io.safetensors" --output "$WORK/y.st"
expect 2 "pipeline parallelism (pp=2) is not supported" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --mesh pp=2 --ep 1 \
    --archetype qwen3moe_topk_router --input "$G/moe_io.safetensors" --output "$WORK/y.st"
check "no output left behind by failed runs" test ! -e "$WORK/y.st"
finish

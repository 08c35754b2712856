# hyperpar train with a non-finite gradient (HP_TEST_NAN_GRAD makes one parameter's gradient NaN after its sums):
# exit 3 naming the first such parameter and the step, nothing updated, at 1 process and under mpirun (dense and an
# MoE block's router); --skip-nonfinite skips the step (no update: the next step's loss is the same) and goes on.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
G=$F/llama
I=$G/forward_io.safetensors
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
expect 3 "step 1: the gradient of model.layers.1.mlp.up_proj.weight is not finite" -- \
    env HP_TEST_NAN_GRAD=model.layers.1.mlp.up_proj.weight "$HP" train $G --input $I --steps 2 --out "$WORK/nan"
check "nothing written after a non-finite gradient" test ! -e "$WORK/nan"
expect 3 "the gradient of model.layers.0.self_attn.o_proj.weight is not finite" -- \
    $MPI -np 2 -x HP_TEST_NAN_GRAD=model.layers.0.self_attn.o_proj.weight "$HP" train $G --input $I --tp 2
expect 3 "the gradient of model.layers.0.block_sparse_moe (router) is not finite" -- \
    $MPI -np 2 -x "HP_TEST_NAN_GRAD=model.layers.0.block_sparse_moe (router)" "$HP" train $F/mixtral \
    --input $F/mixtral/forward_io.safetensors --tp 2
out=$(HP_TEST_NAN_GRAD=model.norm.weight "$HP" train $G --input $I --steps 2 --skip-nonfinite 2>&1)
check "--skip-nonfinite: exit 0, both steps skipped" test "$(grep -c "step skipped" <<<"$out")" = 2
l1=$(grep "step 1/2" <<<"$out" | awk '{print $5}')
l2=$(grep "step 2/2" <<<"$out" | awk '{print $5}')
check "--skip-nonfinite: nothing updated (the same loss $l1 = $l2)" test -n "$l1" -a "$l1" = "$l2"
finish

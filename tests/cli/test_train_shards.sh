# hyperpar train from a shard folder (TP-extend-EP, the shared expert cut over tp by shard and gathered at load):
# qwen2_moe (gated shared expert) and deepseek_v3 (MLA, a sigmoid router whose e_score_correction_bias is not
# trained) against PyTorch's first step; the --out folder holds every tensor (the correction bias as held) and runs.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
OPT="--steps 1 --lr 1e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0.1"
for fam in qwen2_moe deepseek_v3; do
    OV=data/overrides/${fam}_ep.yaml
    [ $fam = deepseek_v3 ] && OV=data/overrides/deepseek_v3_forward_ep.yaml
    "$HP" shard $F/$fam --tp 2 --ep 2 --overrides $OV --out "$WORK/$fam.sh" --quiet >/dev/null 2>&1
    expect 0 "train: step 1/1 loss" -- $MPI -np 2 "$HP" train "$WORK/$fam.sh" --input $F/$fam/forward_io.safetensors \
        $OPT --tp 2 --ep 2 --overrides $OV --grad-out "$WORK/$fam.g.st" --out "$WORK/$fam.out"
    check "$fam from a shard folder: gradients and the AdamW step equal PyTorch's" \
        python3 cli/train_check.py $F/$fam/train_io.safetensors $F/$fam "$WORK/$fam.g.st" "$WORK/$fam.out"
    expect 0 "run: loss" -- "$HP" run "$WORK/$fam.out" --input $F/$fam/forward_io.safetensors
done
finish

# hyperpar inspect SHARDS: what each rank of a shard folder holds (a dense tp=2 folder, a MoE dp=2 x tp=2 with
# TP-extend-EP ep=2, per-expert weights stacked at tp=2 ep=2), checked against each rank file's own header and the
# manifest (inspect_shards_check.py) and against the slices the mesh implies; one rank file inside the folder is
# that rank's view; bad uses exit 2.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
"$HP" shard $F/llama --tp 2 --out "$WORK/dense" >/dev/null 2>&1
"$HP" shard $F/qwen3_moe --dp 2 --tp 2 --ep 2 --out "$WORK/moe" >/dev/null 2>&1
"$HP" shard $F/mixtral --tp 2 --ep 2 --out "$WORK/stacked" >/dev/null 2>&1 # per-expert weights: stacks
for d in dense moe stacked; do
    "$HP" inspect "$WORK/$d" --json >"$WORK/$d.json" 2>"$WORK/$d.err"
    check "$d: every rank's tensors agree with its file and the manifest" \
        python3 cli/inspect_shards_check.py "$WORK/$d.json" "$WORK/$d"
done
check "dense: two ranks listed" grep -q '"world": 2' "$WORK/dense.json"
check "moe: four ranks listed" grep -q '"world": 4' "$WORK/moe.json"
# What the mesh implies, spelled out: tp=2 cuts q_proj [64, 64] on dim 0; rank 1 keeps rows [32, 64).
expect 0 "model.layers.0.self_attn.q_proj.weight               F32  [32, 64]         of [64, 64]: dim 0 [32, 64)" \
    -- "$HP" inspect "$WORK/dense" --rank 1
expect 0 "model.layers.0.self_attn.o_proj.weight               F32  [64, 32]         of [64, 64]: dim 1 [0, 32)" \
    -- "$HP" inspect "$WORK/dense" --rank 0
# MoE: 8 experts over ep=2 riding on tp; rank 3 (dp=1, tp=1) holds experts 4-7 in rank 1's (linked) file.
"$HP" inspect "$WORK/moe" --rank 3 >"$WORK/r3.txt"
check "rank 3: its coordinates and the file it shares" grep -qF "rank 3  dp=1,cp=0,tp=1  rank-00003.safetensors (rank 1's file, linked)" "$WORK/r3.txt"
check "rank 3: experts 4-7 of each batched expert tensor" \
    test "$(grep -c 'BF16 \[4, [0-9]*, [0-9]*\] *of \[8, [0-9]*, [0-9]*\]: dim 0 \[4, 8) experts 4-7' "$WORK/r3.txt")" -eq 4
check "rank 3: only rank 3 listed" test "$(grep -c '^rank ' "$WORK/r3.txt")" -eq 1
check "stacked: rank 1's w1 stack holds experts 4-7" grep -q "experts.w1  *F32  \[4, 96, 64\]  *of \[8, 96, 64\]: dim 0 \[4, 8) experts 4-7" \
    <("$HP" inspect "$WORK/stacked" --rank 1)
check "rank 0: experts 0-3" grep -q "gate_up_proj .* experts 0-3" <("$HP" inspect "$WORK/moe" --rank 0)
# One rank file inside the folder (config.json beside it describes the whole model): that rank's view.
"$HP" inspect "$WORK/moe/rank-00003.safetensors" >"$WORK/f3.txt" 2>&1
check "a rank file is shown as its rank" cmp -s "$WORK/r3.txt" "$WORK/f3.txt"
expect 0 '"rank": 1' -- "$HP" inspect "$WORK/dense/rank-00001.safetensors" --json
# Bad uses: exit 2 with the cause.
expect 2 "rank 9 has no file: the folder was sharded for a world of 4 ranks" -- "$HP" inspect "$WORK/moe" --rank 9
expect 2 "--rank picks a rank of a shard folder" -- "$HP" inspect $F/llama --rank 0
expect 2 "lists each rank's tensors itself" -- "$HP" inspect "$WORK/moe" --tensors
expect 2 "but $WORK/moe/rank-00003.safetensors is rank 3's file" -- "$HP" inspect "$WORK/moe/rank-00003.safetensors" --rank 1
# A checkpoint is still summarised as before.
expect 0 "architecture" -- "$HP" inspect $F/llama
finish

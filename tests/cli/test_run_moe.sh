# hyperpar run on MoE models (mixtral, qwen2_moe, qwen3_moe, glm4_moe with partial rotary, gpt_oss with sinks and
# yarn, deepseek_v3 with MLA, interleaved rope and yarn's mscale): the sparse blocks run the EP runtime inside the
# layer loop on each rank's SP/CP-local rows. Every golden at 1 process and under mpirun with TP-extend-EP
# (tp=2 x ep=2, and ep=4 over dp=2 x tp=2), dp=2 x ep=2, SP off, cp=2 with EP and the explicit ep axis (ep 2; ep 4
# on a random batch of 4, as dp x ep splits the rows): logits 1e-4 * max|ref|, loss 1e-5, moe.<l>.topk_idx exact;
# the distributed runs equal one process within 1e-5; from a shard folder; validate; an EP compute that is not declared is refused with the YAML to add.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
for fam in mixtral qwen2_moe qwen3_moe glm4_moe gpt_oss deepseek_v3; do
    G=$F/$fam
    OV=data/overrides/${fam}_ep.yaml
    [ $fam = deepseek_v3 ] && OV=data/overrides/deepseek_v3_forward_ep.yaml # deepseek_v3_ep.yaml sets a capacity
    expect 0 "topk_idx 0 of" -- "$HP" run $G --input $G/forward_io.safetensors --compare $G/forward_io.safetensors
    "$HP" run $G --input $G/forward_io.safetensors --output "$WORK/$fam.one.st" 2>/dev/null </dev/null
    while read -r np flags; do
        expect 0 "topk_idx 0 of" -- $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors $flags --overrides $OV \
            --compare $G/forward_io.safetensors
        expect 0 "OK" -- $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors $flags --overrides $OV \
            --compare "$WORK/$fam.one.st" --compare-rtol 1e-5
    done <<'LIST'
2 --tp 2 --ep 2
4 --tp 2 --ep 2 --dp 2
2 --tp 2 --ep 2 --no-sequence-parallel
4 --cp 2 --tp 2 --ep 2 --loss-parallel
2 --mesh dp=1,ep=2 --ep-axis
4 --dp 2 --tp 2 --ep 4
LIST
    # An explicit ep axis splits the batch with dp (the dense region is data parallel over dp x ep), so ep=4
    # needs 4 rows where the golden has 2: a random batch of 4 against one process.
    "$HP" run $G --random-input 4,16 --output "$WORK/$fam.one4.st" 2>/dev/null </dev/null
    expect 0 "OK" -- $MPI -np 4 "$HP" run $G --random-input 4,16 --mesh dp=1,ep=4 --ep-axis --overrides $OV \
        --compare "$WORK/$fam.one4.st" --compare-rtol 1e-5
done
# --overlap hides the shared expert behind the exchange: the same numbers (qwen2_moe's gated shared expert,
# deepseek_v3's plain one).
for fam in qwen2_moe deepseek_v3; do
    OV=data/overrides/${fam}_ep.yaml
    [ $fam = deepseek_v3 ] && OV=data/overrides/deepseek_v3_forward_ep.yaml
    expect 0 "OK" -- $MPI -np 2 "$HP" run $F/$fam --input $F/$fam/forward_io.safetensors --tp 2 --ep 2 --overrides $OV \
        --overlap --compare "$WORK/$fam.one.st" --compare-rtol 1e-5
done

# The output file holds moe.<l>.topk_idx I32 [B*S, K] as forward_io does.
expect 0 "moe.0.topk_idx" -- "$HP" inspect "$WORK/qwen3_moe.one.st" --tensors
# From a shard folder of the same mesh.
"$HP" shard $F/qwen3_moe --dp 2 --ep 2 --overrides data/overrides/qwen3_moe_ep.yaml --out "$WORK/shards" --quiet \
    >/dev/null 2>&1
expect 0 "topk_idx 0 of" -- $MPI -np 2 "$HP" run "$WORK/shards" --input $F/qwen3_moe/forward_io.safetensors --dp 2 --ep 2 \
    --overrides data/overrides/qwen3_moe_ep.yaml --compare $F/qwen3_moe/forward_io.safetensors
# TP-extend-EP from a shard folder whose plan cuts the shared expert over tp (gate/up S(0), down S(1)): each rank
# reads its block and the tp group gathers the rest at load, so the goldens pass and equal one process.
for fam in qwen2_moe deepseek_v3 glm4_moe; do
    OV=data/overrides/${fam}_ep.yaml
    [ $fam = deepseek_v3 ] && OV=data/overrides/deepseek_v3_forward_ep.yaml
    while read -r np flags; do
        rm -rf "$WORK/$fam.tpep"
        "$HP" shard $F/$fam $flags --overrides $OV --out "$WORK/$fam.tpep" --quiet >/dev/null 2>&1
        check "$fam: the shard folder ($flags) cuts the shared expert over tp" \
            bash -c 'tr -d " \n" <"$1" | grep -Eq "\"global\":\"model\.layers\.[0-9]+\.mlp\.shared_experts?\.gate_proj\.weight\",[^}]*\"slices\":\[\{\"dim\":0,\"offset\":0,"' _ "$WORK/$fam.tpep/manifest.json"
        expect 0 "topk_idx 0 of" -- $MPI -np $np "$HP" run "$WORK/$fam.tpep" --input $F/$fam/forward_io.safetensors \
            $flags --overrides $OV --compare $F/$fam/forward_io.safetensors
        expect 0 "OK" -- $MPI -np $np "$HP" run "$WORK/$fam.tpep" --input $F/$fam/forward_io.safetensors $flags \
            --overrides $OV --compare "$WORK/$fam.one.st" --compare-rtol 1e-5
    done <<'LIST'
2 --tp 2 --ep 2
4 --dp 2 --tp 2 --ep 2
LIST
done
# validate names no divergence.
out=$($MPI -np 2 "$HP" validate $F/qwen2_moe --input $F/qwen2_moe/forward_io.safetensors --tp 2 --ep 2 \
    --overrides data/overrides/qwen2_moe_ep.yaml 2>&1 </dev/null)
check "validate passes on qwen2_moe tp=2 x ep=2" grep -q "loss: distributed .*: ok" <<<"$out"
check "validate lists the MoE block" grep -q "model.layers.0.mlp " <<<"$out"
# With EP the compute is never chosen silently: the error carries the YAML to declare it.
expect 2 "local_compute_fn" -- $MPI -np 2 "$HP" run $F/qwen3_moe --input $F/qwen3_moe/forward_io.safetensors --tp 2 --ep 2
# The refusal says where to pass the file (the command that ran) and names the family's own recipe, printed once.
for fam_recipe in qwen3_moe:qwen3moe_ep_compute_fn mixtral:recipes.mixtral_ep_compute_fn; do
    fam=${fam_recipe%%:*}
    out=$($MPI -np 2 "$HP" run $F/$fam --input $F/$fam/forward_io.safetensors --tp 2 --ep 2 2>&1 </dev/null)
    check "$fam: EP refusal names 'hyperpar run ... --overrides FILE'" \
        grep -qF "pass it with: hyperpar run ... --overrides FILE" <<<"$out"
    check "$fam: EP refusal's YAML comment names run" grep -qF "# Review, then pass with: hyperpar run ..." <<<"$out"
    check "$fam: EP refusal printed once" test "$(grep -c "EP-marked" <<<"$out")" -eq 1
    check "$fam: EP refusal does not name another family's recipe" \
        bash -c '! grep -q "qwen2moe_ep_compute_fn" <<<"$1"' _ "$out"
    check "$fam: EP refusal names its recipe" grep -qE "\(the family's recipe: hyper_parallel\.[a-z0-9_.]*${fam_recipe#*:}\):" <<<"$out"
done
# Experts cut over tp (the plan without EP, and the explicit ep axis with tp: gate/up column-parallel, down
# row-parallel, the shared expert likewise, the block's output a partial sum reduced at its exit): every family
# at --tp 2 with and without SP and at dp=1 x tp=2 x ep=2 (explicit ep axis), from the checkpoint and from a
# shard folder of the same plan; the batched families' fused gate/up are packed (--packed-fused) as the planner
# asks. A folder cut for another plan is refused naming the slice.
for fam in mixtral qwen2_moe qwen3_moe glm4_moe gpt_oss deepseek_v3; do
    G=$F/$fam
    OV=data/overrides/${fam}_ep.yaml
    [ $fam = deepseek_v3 ] && OV=data/overrides/deepseek_v3_forward_ep.yaml
    "$HP" shard $G --tp 2 --packed-fused --out "$WORK/$fam.tp2" --quiet >/dev/null 2>&1
    while read -r np src flags; do
        [ "$src" = shard ] && src="$WORK/$fam.tp2" || src=$G
        case "$flags" in *ep-axis*) flags="$flags --overrides $OV" ;; esac
        expect 0 "topk_idx 0 of" -- $MPI -np $np "$HP" run "$src" --input $G/forward_io.safetensors --packed-fused \
            $flags --compare $G/forward_io.safetensors
    done <<'LIST'
2 ckpt --tp 2
2 ckpt --tp 2 --no-sequence-parallel
4 ckpt --mesh dp=1,tp=2,ep=2 --ep-axis
2 shard --tp 2
LIST
done
# The explicit ep axis with tp from its own shard folder, and dp=2 x ep=2 x tp=2 on 8 ranks (4 rows: dp x ep
# split the batch).
"$HP" shard $F/qwen2_moe --mesh dp=1,ep=2,tp=2 --ep-axis --overrides data/overrides/qwen2_moe_ep.yaml \
    --out "$WORK/qwen2_moe.ept" --quiet >/dev/null 2>&1
expect 0 "topk_idx 0 of" -- $MPI -np 4 "$HP" run "$WORK/qwen2_moe.ept" --input $F/qwen2_moe/forward_io.safetensors \
    --mesh dp=1,ep=2,tp=2 --ep-axis --overrides data/overrides/qwen2_moe_ep.yaml \
    --compare $F/qwen2_moe/forward_io.safetensors
expect 0 "OK" -- $MPI -np 8 "$HP" run $F/gpt_oss --random-input 4,16 \
    --mesh dp=2,ep=2,tp=2 --ep-axis --overrides data/overrides/gpt_oss_ep.yaml \
    --compare "$WORK/gpt_oss.one4.st" --compare-rtol 1e-5
# Equal to one process within 1e-5 (the reduction order is the only difference).
expect 0 "OK" -- $MPI -np 2 "$HP" run $F/deepseek_v3 --input $F/deepseek_v3/forward_io.safetensors --tp 2 \
    --compare "$WORK/deepseek_v3.one.st" --compare-rtol 1e-5
# A folder cut over tp: --ep contradicts its mesh (named at once); read by a --plan that needs whole experts
# (TP-extend-EP), it is refused naming the slice.
expect 2 "--ep 2 contradicts the shard folder's ep=1" -- $MPI -np 2 "$HP" run "$WORK/mixtral.tp2" \
    --input $F/mixtral/forward_io.safetensors --tp 2 --ep 2 --overrides data/overrides/mixtral_ep.yaml
"$HP" plan $F/mixtral --tp 2 --ep 2 --overrides data/overrides/mixtral_ep.yaml -o "$WORK/mixtral.tpep.plan.json" 2>/dev/null
expect 2 "is held only as the slice dim 0 [0, 48)" -- $MPI -np 2 "$HP" run "$WORK/mixtral.tp2" \
    --input $F/mixtral/forward_io.safetensors --plan "$WORK/mixtral.tpep.plan.json"
# The router must stay whole on tp: an override that cuts it is refused by run and by cost, by name.
printf -- '- match: "model.layers.*.block_sparse_moe"\n  params: {gate.weight: {tp: shard(0)}}\n' >"$WORK/rtp.yaml"
expect 2 "the router must be replicated" -- $MPI -np 2 "$HP" run $F/mixtral --input $F/mixtral/forward_io.safetensors \
    --tp 2 --overrides "$WORK/rtp.yaml" --allow-uncovered
expect 0 "the router must be replicated" -- "$HP" cost $F/mixtral --input $F/mixtral/forward_io.safetensors --tp 2 \
    --overrides "$WORK/rtp.yaml" --allow-uncovered
# TP splits MLA by heads (q_b_proj, kv_b_proj S(0), o_proj S(1)) and gpt-oss's sinks with them: tp=4 x ep=4.
expect 0 "topk_idx 0 of" -- $MPI -np 4 "$HP" run $F/deepseek_v3 --input $F/deepseek_v3/forward_io.safetensors --tp 4 \
    --ep 4 --overrides data/overrides/deepseek_v3_forward_ep.yaml --compare $F/deepseek_v3/forward_io.safetensors
# A capacity factor in the declared compute applies per rank block: with 1.25 some slots drop and the logits move.
expect 3 "MISMATCH" -- $MPI -np 2 "$HP" run $F/deepseek_v3 --input $F/deepseek_v3/forward_io.safetensors --tp 2 \
    --ep 2 --overrides data/overrides/deepseek_v3_ep.yaml --compare $F/deepseek_v3/forward_io.safetensors
finish

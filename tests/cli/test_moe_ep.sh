# Expert parallelism over MPI: every golden folder and sparse layer at np = 2 and 4 (and tp=2 x ep=2 on 4
# ranks) against the golden reference and the one-process output; overlap identical; dispatch chunks within
# 1e-6 of one chunk (docs/moe.md: OpenBLAS rounds rows differently for other row counts, so not bitwise);
# failures end all ranks.
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
    # --dispatch-chunks 3: the same routing (topk_idx, topk_w exact), y within 1e-6 * max|y| of one chunk.
    expect 0 "OK" -- $MPI -np 2 "$HP" moe "$G" --layer "$layer" --ep 2 --archetype "$arch" --dispatch-chunks 3 \
        --input "$G/moe_io.safetensors" --compare "$WORK/plain.st" --ref-prefix "" --compare-rtol 1e-6
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
# Dispatch chunks: with overlap bitwise equal to the same chunks without; with a capacity factor and a
# tp=2 x ep=2 mesh still equal to the golden; the option's range; it is part of what ranks agree on.
$MPI -np 2 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --dispatch-chunks 3 \
    --input "$G/moe_io.safetensors" --output "$WORK/c3.st" 2>/dev/null </dev/null
expect 0 "3 dispatch chunks" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router \
    --dispatch-chunks 3 --overlap --input "$G/moe_io.safetensors" --compare "$WORK/c3.st" --ref-prefix "" --compare-rtol 1e-30
$MPI -np 2 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --capacity-factor 1.0 \
    --input "$G/moe_io.safetensors" --output "$WORK/cf.st" 2>/dev/null </dev/null
expect 0 "OK" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --capacity-factor 1.0 \
    --dispatch-chunks 4 --input "$G/moe_io.safetensors" --compare "$WORK/cf.st" --ref-prefix "" --compare-rtol 1e-6
expect 0 "OK" -- $MPI -np 4 "$HP" moe "$G" --layer 1 --mesh dp=2,tp=2 --ep 2 --archetype qwen3moe_topk_router \
    --dispatch-chunks 2 --overlap --input "$G/moe_io.safetensors" --compare "$G/moe_io.safetensors"
expect 2 "--dispatch-chunks expects an integer in [1, 64], got '0'" -- "$HP" moe "$G" --layer 1 --dispatch-chunks 0 \
    --input "$G/moe_io.safetensors" --output "$WORK/y.st"
expect 2 "--dispatch-chunks expects an integer in [1, 64], got '65'" -- "$HP" moe "$G" --layer 1 --dispatch-chunks 65 \
    --input "$G/moe_io.safetensors" --output "$WORK/y.st"
expect 2 "rank 1 disagrees with rank 0" -- $MPI \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --input "$G/moe_io.safetensors" --output "$WORK/y.st" : \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --dispatch-chunks 2 --input "$G/moe_io.safetensors" --output "$WORK/y.st"
# bench ep --dispatch-chunks: the chunked forward timed next to one chunk.
expect 0 '"chunks": {"n": 3, "overlap": true' -- $MPI -np 2 "$HP" bench ep --preset qwen3-30b-a3b --tokens 16 \
    --local-experts 4 --reps 1 --overlap --dispatch-chunks 3 --json
# Issue 40: every median with its min and max over the reps, and the host's load at the start and the end.
$MPI -np 2 "$HP" bench ep --preset qwen3-30b-a3b --tokens 16 --local-experts 4 --reps 3 --overlap --dispatch-chunks 2 \
    --json >"$WORK/ep3.json" 2>/dev/null </dev/null
check "bench ep: spreads and the load" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("route", "dispatch", "experts", "return", "combine", "shared", "wait", "comm", "total", "comm_last", "bare",
          "bare_last"):
    assert 0 <= d[k + "_min_s"] <= d[k + "_s"] <= d[k + "_max_s"], (k, d)
o, c = d["overlap"], d["chunks"]
assert 0 < o["total_overlap_min_s"] <= o["total_overlap_s"] <= o["total_overlap_max_s"], o
assert 0 < c["total_min_s"] <= c["total_s"] <= c["total_max_s"], c
assert all(d[k] >= 0 or d[k] == -1 for k in ("load_start", "load_end")), d' "$WORK/ep3.json"
expect 0 "load     : 1-minute load average" -- "$HP" bench ep --preset qwen3-30b-a3b --tokens 8 --local-experts 8 --reps 2
expect 0 "chunks   : 2 dispatch chunks: forward" -- $MPI -np 2 "$HP" bench ep --preset gpt-oss-20b --tokens 8 \
    --local-experts 2 --reps 1 --dispatch-chunks 2
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
expect 2 "pipeline parallelism (pp=2): plan, explain, shard, merge, run, validate, train, cost and advise take it, but moe does not" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --mesh pp=2 --ep 1 \
    --archetype qwen3moe_topk_router --input "$G/moe_io.safetensors" --output "$WORK/y.st"
check "no output left behind by failed runs" test ! -e "$WORK/y.st"
# --compute bf16 under EP: equal to the one-process bf16 run, within its bound of the golden, and agreed on.
"$HP" moe "$G" --layer 1 --compute bf16 --input "$G/moe_io.safetensors" --output "$WORK/b16.st" 2>/dev/null </dev/null
expect 0 "OK" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --compute bf16 \
    --input "$G/moe_io.safetensors" --compare "$WORK/b16.st" --ref-prefix "" --compare-rtol 1e-5
expect 0 "OK" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --compute bf16 \
    --input "$G/moe_io.safetensors" --compare "$G/moe_io.safetensors" --compare-rtol 1e-2
expect 2 "rank 1 disagrees with rank 0" -- $MPI \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --input "$G/moe_io.safetensors" --output "$WORK/y.st" : \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype qwen3moe_topk_router --compute bf16 --input "$G/moe_io.safetensors" --output "$WORK/y.st"
finish

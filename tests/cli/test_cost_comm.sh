# hyperpar cost's communication is exact: for every family and several meshes, each rank's bytes and calls per
# collective kind equal what `hyperpar run` counts on the same batch (--stats-json). MoE families with the
# balanced router (run --router balanced) and with a given routing (the routed experts run --output wrote),
# with a capacity factor (the drops change the exchange); CP padding; loss-parallel; SP off; the explicit ep axis;
# MoE experts cut over tp (--tp 2 without EP, and the explicit ep axis with tp: the block's exit reduces).
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
# same_comm RUN_STATS COST_JSON: every rank's bytes and calls per kind agree (and the file lists every rank).
same_comm() {
    python3 - "$1" "$2" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); cost = json.load(open(sys.argv[2]))
ok = run["world"] == cost["world"] == len(cost["ranks"]) == len(run["ranks"])
for a, b in zip(run["ranks"], cost["ranks"]):
    if a["bytes"] != b["comm"]["bytes"] or a["calls"] != b["comm"]["calls"]:
        ok = False
        print("rank", a["rank"], "run", a["bytes"], a["calls"], "cost", b["comm"]["bytes"], b["comm"]["calls"])
sys.exit(0 if ok else 1)
PY
}
n=0
# family np flags...  (MoE families: the EP override is added below)
while read -r fam np flags; do
    n=$((n + 1))
    G=$F/$fam
    ov=""
    [ -f data/overrides/${fam}_ep.yaml ] && ov="--overrides data/overrides/${fam}_ep.yaml"
    [ "$fam" = deepseek_v3 ] && ov="--overrides data/overrides/deepseek_v3_forward_ep.yaml"
    case "$flags" in *--ep*) ;; *) ov="" ;; esac
    router=""
    [ -n "$ov" ] && router="--router balanced"
    $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors $flags $ov $router \
        --stats-json "$WORK/r$n.json" >/dev/null 2>"$WORK/r$n.err" </dev/null
    "$HP" cost $G --input $G/forward_io.safetensors $flags $ov --format json -o "$WORK/c$n.json" 2>"$WORK/c$n.err"
    check "cost comm = run comm: $fam $flags $router" same_comm "$WORK/r$n.json" "$WORK/c$n.json"
done <<'LIST'
llama 2 --tp 2
llama 4 --cp 2 --tp 2 --loss-parallel
mistral 2 --cp 2
qwen2 4 --dp 2 --tp 2
qwen3 2 --tp 2 --no-sequence-parallel
qwen3 4 --cp 4
mixtral 2 --tp 2 --ep 2
mixtral 2 --mesh dp=1,ep=2 --ep-axis
qwen2_moe 4 --dp 2 --tp 2 --ep 4
qwen3_moe 2 --tp 2 --ep 2
qwen3_moe 4 --cp 2 --tp 2 --ep 2 --loss-parallel
glm4_moe 2 --tp 2 --ep 2
gpt_oss 2 --tp 2 --ep 2
deepseek_v3 4 --dp 2 --tp 2 --ep 4
mixtral 2 --tp 2
qwen3_moe 2 --tp 2 --packed-fused --no-sequence-parallel
gpt_oss 2 --tp 2
deepseek_v3 4 --dp 2 --tp 2
qwen2_moe 4 --mesh dp=1,tp=2,ep=2 --ep-axis
glm4_moe 4 --mesh dp=1,ep=2,tp=2 --ep-axis --packed-fused
LIST
# A given routing: the routed experts of a real run, read back by cost (exact, not an estimate).
while read -r fam np flags; do
    n=$((n + 1))
    G=$F/$fam
    ov="--overrides data/overrides/${fam}_ep.yaml"
    [ "$fam" = deepseek_v3 ] && ov="--overrides data/overrides/$flags"
    [ "$fam" = deepseek_v3 ] && flags="--tp 2 --ep 2"
    # the routing from a run that takes the logits (--output); cost counts the run that takes none
    $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors $flags $ov --output "$WORK/o$n.st" \
        >/dev/null 2>"$WORK/o$n.err" </dev/null
    $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors $flags $ov \
        --stats-json "$WORK/r$n.json" >/dev/null 2>"$WORK/r$n.err" </dev/null
    "$HP" cost $G --input $G/forward_io.safetensors $flags $ov --routing "$WORK/o$n.st" --format json \
        -o "$WORK/c$n.json" 2>"$WORK/c$n.err"
    check "cost comm = run comm, given routing: $fam $flags" same_comm "$WORK/r$n.json" "$WORK/c$n.json"
    check "given routing is not an estimate: $fam" grep -q '"ep_estimated": false' "$WORK/c$n.json"
done <<'LIST'
qwen3_moe 2 --tp 2 --ep 2
mixtral 4 --dp 2 --tp 2 --ep 2
gpt_oss 2 --mesh dp=1,ep=2 --ep-axis
deepseek_v3 2 deepseek_v3_ep.yaml
LIST
# A plan file (hyperpar plan -o) carries everything the runtime and cost execute: contracts, deferred biases,
# TP-local attributes, the EP compute and its capacity factor, loss-parallel. run --plan and cost --plan agree.
while read -r fam np flags; do
    n=$((n + 1))
    G=$F/$fam
    "$HP" plan $G $flags -o "$WORK/p$n.json" 2>/dev/null
    $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors --plan "$WORK/p$n.json" --router balanced \
        --stats-json "$WORK/r$n.json" >/dev/null 2>"$WORK/r$n.err" </dev/null
    "$HP" cost $G --input $G/forward_io.safetensors --plan "$WORK/p$n.json" --format json -o "$WORK/c$n.json"
    check "cost --plan = run --plan: $fam $flags" same_comm "$WORK/r$n.json" "$WORK/c$n.json"
    # the same numbers as the plan derived from the flags (DeepSeek's capacity factor 1.25 included)
    $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors $flags --output "$WORK/f$n.st" >/dev/null 2>&1 </dev/null
    expect 0 "OK" -- $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors --plan "$WORK/p$n.json" \
        --compare "$WORK/f$n.st" --compare-rtol 1e-6
done <<'LIST'
llama 4 --cp 2 --tp 2 --loss-parallel
gpt_oss 2 --tp 2 --ep 2 --overrides data/overrides/gpt_oss_ep.yaml
deepseek_v3 2 --tp 2 --ep 2 --overrides data/overrides/deepseek_v3_ep.yaml
LIST
# The golden's own routing file gives the same exchange as the run's (the run reproduces it exactly).
expect 0 "the given routing (exact)" -- "$HP" cost $F/qwen3_moe --tp 2 --ep 2 \
    --overrides data/overrides/qwen3_moe_ep.yaml --routing $F/qwen3_moe/forward_io.safetensors
expect 0 "balanced router's (estimate*)" -- "$HP" cost $F/qwen3_moe --tp 2 --ep 2 \
    --overrides data/overrides/qwen3_moe_ep.yaml --batch 2 --seq 16
# A plan the runtime refuses: cost gives its weights and the runtime's reason (the one run exits 2 with).
expect 0 "is not one the runtime lowers (a shard-to-shard move is an all-to-all)" -- "$HP" cost $F/llama --tp 2 \
    --overrides data/overrides/attn_out_feature_shard.yaml
expect 2 "is not one the runtime lowers (a shard-to-shard move is an all-to-all)" -- $MPI -np 2 "$HP" run $F/llama \
    --input $F/llama/forward_io.safetensors --tp 2 --overrides data/overrides/attn_out_feature_shard.yaml
expect 0 '"refused": null' -- "$HP" cost $F/mixtral --tp 2 --format json
expect 0 '"refused": null' -- "$HP" cost $F/mixtral --tp 2 --ep 2 --format json
# Bad input: exit 2, no output file left behind.
expect 2 "dense model" -- "$HP" cost $F/llama --routing $F/qwen3_moe/forward_io.safetensors
expect 2 "expected I32" -- "$HP" cost $F/qwen3_moe --batch 3 --seq 16 --routing $F/qwen3_moe/forward_io.safetensors
expect 2 "not both" -- "$HP" cost $F/llama --input $F/llama/forward_io.safetensors --batch 2
expect 2 "--mode expects" -- "$HP" cost $F/llama --mode fast
expect 2 "every replica" -- "$HP" cost $F/llama --dp 2 --batch 1
expect 2 "--router expects" -- "$HP" run $F/llama --input $F/llama/forward_io.safetensors --router fast
expect 2 "" -- "$HP" cost $F/llama --tp 2 --format json -o "$WORK/nodir/x.json"
check "no partial output" test ! -e "$WORK/nodir"
finish

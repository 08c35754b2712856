# Memory is exact: `hyperpar cost --format json`'s workspace_bytes of every rank equals the high-water mark of the
# buffers `hyperpar run` counted in its forward (--stats-json workspace_bytes), to the byte, for every family at
# 1, 2 and 4 ranks: tp, cp (with padding), dp x tp, SP off, loss-parallel, MoE with EP (balanced router), the
# explicit ep axis, experts cut over tp.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
# same_ws RUN_STATS COST_JSON: every rank's workspace_bytes agree, and are positive.
same_ws() {
    python3 - "$1" "$2" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); cost = json.load(open(sys.argv[2]))
ok = run["world"] == cost["world"] == len(cost["ranks"]) == len(run["ranks"])
for a, b in zip(run["ranks"], cost["ranks"]):
    if a["workspace_bytes"] != b["workspace_bytes"] or a["workspace_bytes"] <= 0:
        ok = False
        print("rank", a["rank"], "run", a["workspace_bytes"], "cost", b["workspace_bytes"])
sys.exit(0 if ok else 1)
PY
}
n=0
while read -r fam np flags; do
    n=$((n + 1))
    G=$F/$fam
    ov=""
    case "$flags" in
    *--ep\ *)
        [ -f data/overrides/${fam}_ep.yaml ] && ov="--overrides data/overrides/${fam}_ep.yaml"
        [ "$fam" = deepseek_v3 ] && ov="--overrides data/overrides/deepseek_v3_forward_ep.yaml" ;;
    esac
    router=""
    [ -f $G/config.json ] && grep -q '"num_local_experts"\|"num_experts"\|"n_routed_experts"' $G/config.json && router="--router balanced"
    if [ "$np" = 1 ]; then
        "$HP" run $G --input $G/forward_io.safetensors $flags $ov $router --stats-json "$WORK/r$n.json" \
            >/dev/null 2>"$WORK/r$n.err" </dev/null
    else
        $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors $flags $ov $router \
            --stats-json "$WORK/r$n.json" >/dev/null 2>"$WORK/r$n.err" </dev/null
    fi
    "$HP" cost $G --input $G/forward_io.safetensors $flags $ov --format json -o "$WORK/c$n.json" 2>"$WORK/c$n.err"
    check "cost workspace = run workspace: $fam np=$np $flags $router" same_ws "$WORK/r$n.json" "$WORK/c$n.json"
done <<'LIST'
llama 1 --tp 1
mistral 1 --tp 1
qwen2 1 --tp 1
qwen3 1 --tp 1
mixtral 1 --tp 1
qwen2_moe 1 --tp 1
qwen3_moe 1 --tp 1
glm4_moe 1 --tp 1
gpt_oss 1 --tp 1
deepseek_v3 1 --tp 1
llama 2 --tp 2
llama 4 --cp 2 --tp 2 --loss-parallel
llama 4 --dp 2 --tp 2
mistral 2 --cp 2
mistral 4 --dp 2 --cp 2
qwen2 4 --dp 2 --tp 2
qwen2 2 --tp 2 --loss-parallel
qwen3 2 --tp 2 --no-sequence-parallel
qwen3 4 --cp 4
mixtral 2 --tp 2 --ep 2
mixtral 2 --mesh dp=1,ep=2 --ep-axis
mixtral 2 --tp 2
qwen2_moe 4 --dp 2 --tp 2 --ep 4
qwen2_moe 4 --mesh dp=1,tp=2,ep=2 --ep-axis
qwen3_moe 2 --tp 2 --ep 2
qwen3_moe 4 --cp 2 --tp 2 --ep 2 --loss-parallel
qwen3_moe 2 --tp 2 --packed-fused --no-sequence-parallel
glm4_moe 2 --tp 2 --ep 2
glm4_moe 4 --mesh dp=1,ep=2,tp=2 --ep-axis --packed-fused
gpt_oss 2 --tp 2 --ep 2
gpt_oss 2 --tp 2
deepseek_v3 4 --dp 2 --tp 2 --ep 4
deepseek_v3 2 --tp 2
deepseek_v3 4 --cp 2 --tp 2 --ep 2
LIST
# One EP runtime for all sparse layers in inference: Qwen3-30B-A3B's shapes with 1, 2 and 3 layers (config only),
# 4096 tokens. A layer adds its routing record (moe.<l>.topk_idx: tokens x K int32s as floats), not the runtime's
# 1+ GiB; training (one runtime per layer, each backward reads its own) adds more than a runtime per layer.
ws_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ranks'][0]['workspace_bytes'])" "$1"; }
for n in 1 2 3; do
    python3 -c "import json,sys; d = json.load(open('data/configs/qwen3-30b-a3b.json')); d['num_hidden_layers'] = $n
json.dump(d, open(sys.argv[1], 'w'))" "$WORK/q$n.json"
    for mode in infer train; do
        "$HP" cost "$WORK/q$n.json" --batch 1 --seq 4096 --mode $mode --format json -o "$WORK/q$n-$mode.json" \
            2>"$WORK/q$n.err"
    done
done
i1=$(ws_of "$WORK/q1-infer.json"); i2=$(ws_of "$WORK/q2-infer.json"); i3=$(ws_of "$WORK/q3-infer.json")
t1=$(ws_of "$WORK/q1-train.json"); t2=$(ws_of "$WORK/q2-train.json")
check "inference: a sparse layer adds its routing record only ($i1 $i2 $i3)" \
    test $((i2 - i1)) -eq $((4096 * 8 * 4)) -a $((i3 - i2)) -eq $((4096 * 8 * 4)) -a "$i1" -gt $((1 << 30))
check "training: a sparse layer adds its own EP runtime ($t1 $t2)" test $((t2 - t1)) -gt $((1 << 30))
# The figure is in the text report too.
"$HP" cost $F/llama --input $F/llama/forward_io.safetensors --tp 2 >"$WORK/text.out" 2>&1
check "cost's text names the workspace" grep -q "workspace (run's activation, scratch and communication buffers at their peak, exact)" "$WORK/text.out"
finish

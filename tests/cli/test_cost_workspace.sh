# Memory is exact: `hyperpar cost --format json`'s workspace_bytes of every rank equals the high-water mark of the
# buffers `hyperpar run` counted in its forward (--stats-json workspace_bytes), to the byte, for every family at
# 1, 2 and 4 ranks: tp, cp (with padding), dp x tp, SP off, loss-parallel, MoE with EP (balanced router), the
# explicit ep axis, experts cut over tp. The tp and cp groups' shared windows (window_bytes: beside the workspace)
# agree to the byte too, and are there exactly when a group of two or more on one node has a collective; with
# --ranks-per-node 1 cost counts no window but scratch 1, which is what run reserves when MPI's own collectives
# carry them (HP_MPI_FORCE_PIECES=1).
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
# same_ws RUN_STATS COST_JSON WINDOW: every rank's workspace_bytes agree, and are positive; so do their window_bytes,
# positive when WINDOW is 1, 0 when it is 0.
same_ws() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); cost = json.load(open(sys.argv[2])); win = sys.argv[3] == "1"
ok = run["world"] == cost["world"] == len(cost["ranks"]) == len(run["ranks"])
for a, b in zip(run["ranks"], cost["ranks"]):
    if a["workspace_bytes"] != b["workspace_bytes"] or a["workspace_bytes"] <= 0:
        ok = False
        print("rank", a["rank"], "run", a["workspace_bytes"], "cost", b["workspace_bytes"])
    if a["window_bytes"] != b["window_bytes"] or (a["window_bytes"] > 0) != win:
        ok = False
        print("rank", a["rank"], "window: run", a["window_bytes"], "cost", b["window_bytes"], "expected", win)
sys.exit(0 if ok else 1)
PY
}
# has_window NP FLAGS: 1 when a tp or cp group has two ranks or more (all ranks on one node here)
has_window() {
    [ "$1" -gt 1 ] || { echo 0; return; }
    case " $2 " in
    *" --tp "[2-9]*|*" --cp "[2-9]*|*tp=[2-9]*|*cp=[2-9]*) echo 1 ;;
    *) echo 0 ;;
    esac
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
    check "cost workspace = run workspace: $fam np=$np $flags $router" same_ws "$WORK/r$n.json" "$WORK/c$n.json" \
        "$(has_window "$np" "$flags")"
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
# Every rank its own node (cost --ranks-per-node 1): no window, scratch 1 counted instead; run without the window
# (MPI's collectives forced) reserves it, to the byte.
while read -r fam np flags; do
    n=$((n + 1))
    G=$F/$fam
    $MPI -np $np -x HP_MPI_FORCE_PIECES=1 "$HP" run $G --input $G/forward_io.safetensors $flags \
        --stats-json "$WORK/r$n.json" >/dev/null 2>"$WORK/r$n.err" </dev/null
    "$HP" cost $G --input $G/forward_io.safetensors $flags --ranks-per-node 1 --format json -o "$WORK/c$n.json" \
        2>"$WORK/c$n.err"
    check "cost --ranks-per-node 1 = run on MPI's collectives: $fam np=$np $flags" same_ws "$WORK/r$n.json" \
        "$WORK/c$n.json" 0
    "$HP" cost $G --input $G/forward_io.safetensors $flags --format json -o "$WORK/o$n.json" 2>"$WORK/o$n.err"
    check "one node counts the window in scratch 1's place: $fam np=$np $flags" python3 -c "
import json, sys
one = json.load(open(sys.argv[1]))['ranks']; own = json.load(open(sys.argv[2]))['ranks']
sys.exit(0 if all(a['window_bytes'] > 0 and b['window_bytes'] == 0 and a['workspace_bytes'] < b['workspace_bytes']
                  for a, b in zip(one, own)) else 1)" "$WORK/o$n.json" "$WORK/c$n.json"
done <<'LIST'
llama 2 --tp 2
llama 4 --dp 2 --tp 2
llama 4 --cp 2 --tp 2 --loss-parallel
qwen3 4 --cp 4
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
check "cost's text names the shared windows" grep -q "shared windows (the tp and cp groups' collectives on one node, shared memory, exact)" "$WORK/text.out"
"$HP" cost $F/llama --input $F/llama/forward_io.safetensors --tp 2 --ranks-per-node 1 >"$WORK/text1.out" 2>&1
check "no shared window when every rank is its own node" test "$(grep -c "shared windows" "$WORK/text1.out")" = 0 -a \
    -s "$WORK/text1.out"
finish

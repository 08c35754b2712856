# Weights are exact as the runtime holds them, for each of the ten golden families at 1 process, tp=2, cp=2 and (MoE)
# tp=2 x ep=2: `hyperpar cost`'s weight_bytes of every rank equals the resident_bytes that `hyperpar run
# --stats-json` counted, and `hyperpar cost --mode train`'s equals `hyperpar train --stats-json`'s, to the byte. The
# MoE blocks hold their router in f64, their shared expert in f32 (whole under TP-extend-EP, where the layout cuts
# it), and training widens bf16 weights to f32 (qwen3_moe is the bf16 golden). Under the sanitizers (HP_SANITIZED=1)
# every third case runs.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
same() { # RUN_STATS COST_JSON
    python3 - "$@" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); cost = json.load(open(sys.argv[2]))
ok = run["world"] == cost["world"] == len(cost["ranks"]) == len(run["ranks"])
for a, b in zip(run["ranks"], cost["ranks"]):
    if a["resident_bytes"] != b["weight_bytes"]:
        ok = False
        print("rank", a["rank"], "resident_bytes", a["resident_bytes"], "cost's weight_bytes", b["weight_bytes"])
    if a["resident_bytes"] <= 0:
        ok = False
        print("rank", a["rank"], "resident_bytes is", a["resident_bytes"])
sys.exit(0 if ok else 1)
PY
}
launch() { # NP: the launcher prefix
    if [ "$1" = 1 ]; then echo ""; else echo "$MPI -np $1"; fi
}
n=0
for fam in llama mistral qwen2 qwen3 mixtral qwen2_moe qwen3_moe glm4_moe gpt_oss deepseek_v3; do
    G=$F/$fam
    I=$G/forward_io.safetensors
    moe=0
    grep -q '"num_local_experts"\|"num_experts"\|"n_routed_experts"' $G/config.json && moe=1
    # a batched gate|up of experts is cut over tp packed (--packed-fused); EP declares its compute
    pf=""
    "$HP" plan $G --tp 2 >/dev/null 2>&1 || pf="--packed-fused"
    meshes="1:|2:--tp 2 $pf|2:--cp 2"
    [ $moe = 1 ] && meshes="$meshes|2:--tp 2 --ep 2 --ep-compute suggested"
    IFS='|'
    for m in $meshes; do
        IFS=' '
        np=${m%%:*}
        flags=${m#*:}
        n=$((n + 1))
        if [ "${HP_SANITIZED:-0}" = 1 ] && [ $((n % 3)) != 1 ]; then IFS='|'; continue; fi
        router=""
        [ $moe = 1 ] && router="--router balanced"
        $(launch $np) "$HP" run $G --input $I $flags $router --stats-json "$WORK/r$n.json" >/dev/null \
            2>"$WORK/r$n.err" </dev/null
        "$HP" cost $G --input $I $flags --format json -o "$WORK/c$n.json" >/dev/null 2>"$WORK/c$n.err" </dev/null
        check "$fam np=$np $flags: cost's weights = run's resident" same "$WORK/r$n.json" "$WORK/c$n.json"
        # train runs the --input as one micro-batch of each replica's rows: cost is given the same
        rows=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["micro_batch"] * d["micro_batches"])' \
            "$WORK/c$n.json" 2>/dev/null)
        $(launch $np) "$HP" train $G --input $I $flags --stats-json "$WORK/t$n.json" >/dev/null 2>"$WORK/t$n.err" \
            </dev/null
        "$HP" cost $G --input $I --mode train --micro-batch ${rows:-1} $flags --format json -o "$WORK/ct$n.json" \
            >/dev/null 2>"$WORK/ct$n.err" </dev/null
        check "$fam np=$np $flags: cost --mode train's weights = train's resident" same "$WORK/t$n.json" \
            "$WORK/ct$n.json"
        IFS='|'
    done
    IFS=' '
done
check "every family and mesh ran ($n cases)" test $n -ge 36
finish

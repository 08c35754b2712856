# Memory is exact on the meshes issue 38 names, for each of the ten golden families: at 1 process, tp=2, cp=2,
# dp=2 with ZeRO-1, and (MoE) tp=2 x ep=2, `hyperpar cost`'s workspace_bytes and window_bytes of every rank equal
# what `hyperpar run --stats-json` allocated in its forward, and `hyperpar cost --mode train`'s workspace_bytes
# (the forward, the backward and the optimizer step), window_bytes, grad_bytes, optim_bytes, master_bytes and
# saved_bytes equal what `hyperpar train --stats-json` allocated, to the byte; so do two steps of two accumulated
# micro-batches from a token file. cost's weight_bytes equals the resident_bytes run and train count: the weights as
# the runtime holds them (the MoE blocks' routers in f64, their shared expert in f32 and whole under TP-extend-EP
# where the layout cuts it, training's bf16 weights widened to f32; qwen3_moe is the bf16 golden). Under the
# sanitizers (HP_SANITIZED=1) every third case runs.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
same() { # RUN_STATS COST_JSON KEYS... (a key K, or RUN_KEY=COST_KEY)
    python3 - "$@" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); cost = json.load(open(sys.argv[2]))
keys = [k.split("=") if "=" in k else (k, k) for k in sys.argv[3:]]
ok = run["world"] == cost["world"] == len(cost["ranks"]) == len(run["ranks"])
for a, b in zip(run["ranks"], cost["ranks"]):
    for k, c in keys:
        if a[k] != b[c]:
            ok = False
            print("rank", a["rank"], k, "counted", a[k], "cost's", c, b[c])
    if a[keys[0][0]] <= 0:
        ok = False
        print("rank", a["rank"], keys[0][0], "is", a[keys[0][0]])
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
    meshes="1:|2:--tp 2 $pf|2:--cp 2|2:--dp 2 --zero 1"
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
        rflags=${flags/--zero 1/} # ZeRO is the optimizer's: run and inference cost take no --zero
        $(launch $np) "$HP" run $G --input $I $rflags $router --stats-json "$WORK/r$n.json" >/dev/null \
            2>"$WORK/r$n.err" </dev/null
        "$HP" cost $G --input $I $rflags --format json -o "$WORK/c$n.json" >/dev/null 2>"$WORK/c$n.err" </dev/null
        check "$fam np=$np $rflags: cost's workspace and weights = run's" same "$WORK/r$n.json" "$WORK/c$n.json" \
            workspace_bytes window_bytes resident_bytes=weight_bytes
        # train runs the --input as one micro-batch of each replica's rows: cost is given the same
        rows=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["micro_batch"] * d["micro_batches"])' \
            "$WORK/c$n.json" 2>/dev/null)
        $(launch $np) "$HP" train $G --input $I $flags --stats-json "$WORK/t$n.json" >/dev/null 2>"$WORK/t$n.err" \
            </dev/null
        "$HP" cost $G --input $I --mode train --micro-batch ${rows:-1} $flags --format json -o "$WORK/ct$n.json" \
            >/dev/null 2>"$WORK/ct$n.err" </dev/null
        check "$fam np=$np $flags: cost's training memory = train's" same "$WORK/t$n.json" "$WORK/ct$n.json" \
            workspace_bytes window_bytes grad_bytes optim_bytes master_bytes saved_bytes resident_bytes=weight_bytes
        IFS='|'
    done
    IFS=' '
done
check "every family and mesh ran ($n cases)" test $n -ge 46

# Two steps of two micro-batches each (gradient accumulation) from a token file: every micro-batch starts from no
# buffer, so the run's high-water mark is one micro-batch's, what cost walks. A window is --seq + 1 tokens.
python3 -c 'import struct, sys; open(sys.argv[1], "wb").write(struct.pack("<4000H", *((i * 37 + 11) % 97 for i in range(4000))))' \
    "$WORK/tok.bin"
for c in "llama:1:" "qwen3_moe:1:" "deepseek_v3:2:--tp 2" "mixtral:2:--tp 2 --ep 2 --ep-compute suggested" "qwen2:2:--dp 2 --zero 1"; do
    fam=${c%%:*}; rest=${c#*:}; np=${rest%%:*}; flags=${rest#*:}
    G=$F/$fam
    n=$((n + 1))
    if [ "${HP_SANITIZED:-0}" = 1 ] && [ $((n % 3)) != 1 ]; then continue; fi
    dp=1
    [[ "$flags" == *"--dp 2"* ]] && dp=2
    $(launch $np) "$HP" train $G --data "$WORK/tok.bin" --seq 16 --global-batch $((4 * dp)) --micro-batch 2 --steps 2 \
        $flags --stats-json "$WORK/ga$n.json" >/dev/null 2>"$WORK/ga$n.err" </dev/null
    "$HP" cost $G --batch $((4 * dp)) --seq 17 --mode train --micro-batch 2 $flags --format json -o "$WORK/cga$n.json" \
        >/dev/null 2>"$WORK/cga$n.err" </dev/null
    check "$fam np=$np $flags, 2 steps of 2 micro-batches: cost's training memory = train's" same "$WORK/ga$n.json" \
        "$WORK/cga$n.json" workspace_bytes window_bytes grad_bytes optim_bytes saved_bytes
done
finish

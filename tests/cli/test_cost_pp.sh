# cost and advise with a pipeline (docs/cost.md "Pipeline parallelism", docs/pipeline.md "cost and advise"):
#   - each rank's point-to-point bytes and calls equal what `hyperpar run` counts (--stats-json p2p_bytes), and so do
#     its collectives and its workspace, for pp=2, pp=2 x tp=2 (SP and not), pp=2 x cp=2, pp=2 x dp=2, pp=3, pp=4,
#     virtual stages, a tied head, a stage of no layer and pp=2 x tp=2 x ep=2;
#   - training keeps each chunk's activations for the micro-batches the schedule has in flight (1f1b: min(pp - s, m);
#     gpipe: m; interleaved: Megatron's warm-up + 1), and sends the stream's gradient back (p2p twice the forward's);
#   - the bubble of even stages is (p - 1) / (v m) of the ideal step (simulated);
#   - Llama 3 405B at TP8 x PP16 x DP128 on 16,384 H100: MFU within 1.25x of the reported 41% and a fit in 80 GB,
#     in one configuration;
#   - advise searches pp and says why a pp is rejected; Llama 3 405B on 16,384 H100 gets pp=16 meshes, DeepSeek-V3 on
#     2,048 ranks pp x ep meshes;
#   - bad schedules are refused (exit 2) with the schedule's own reason.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"

# same_run FAMILY NP FLAGS...: run and cost on the family's input agree per rank on p2p bytes and calls, the
# collectives' bytes and calls, and the workspace
same_run() {
    local fam=$1 np=$2 G=$F/$1 router=""
    shift 2
    grep -q '"num_local_experts"\|"num_experts"\|"n_routed_experts"' $G/config.json && router="--router balanced"
    $MPI -np $np "$HP" run $G --input $G/forward_io.safetensors "$@" $router --stats-json "$WORK/r.json" \
        >/dev/null 2>"$WORK/r.err" </dev/null || { tail -3 "$WORK/r.err"; return 1; }
    "$HP" cost $G --input $G/forward_io.safetensors "$@" --format json -o "$WORK/c.json" 2>"$WORK/c.err" ||
        { cat "$WORK/c.err"; return 1; }
    python3 - "$WORK/r.json" "$WORK/c.json" <<'PY'
import json, sys
r, c = json.load(open(sys.argv[1]))["ranks"], json.load(open(sys.argv[2]))["ranks"]
ok = len(r) == len(c)
for a, b in zip(r, c):
    got = (b["p2p_bytes"], b["p2p_calls"], b["comm"]["bytes"], b["comm"]["calls"], b["workspace_bytes"])
    want = (a["p2p_bytes"], a["p2p_calls"], a["bytes"], a["calls"], a["workspace_bytes"])
    if got != want or a["p2p_bytes"] == 0:
        ok = False
        print("rank", a["rank"], "run", want, "cost", got)
sys.exit(0 if ok else 1)
PY
}
check "p2p = run's: llama pp=2" same_run llama 2 --pp 2
check "p2p = run's: qwen2 (tied head) pp=2" same_run qwen2 2 --pp 2
check "p2p = run's: llama pp=2 x tp=2 (SP: the stream's block is 1/tp of the sequence)" same_run llama 4 --pp 2 --tp 2
check "p2p = run's: llama pp=2 x tp=2 without SP" same_run llama 4 --pp 2 --tp 2 --no-sequence-parallel
check "p2p = run's: mistral pp=2 x cp=2" same_run mistral 4 --pp 2 --cp 2
check "p2p = run's: qwen3 pp=2 x dp=2" same_run qwen3 4 --pp 2 --dp 2
check "p2p = run's: deepseek_v3 pp=3" same_run deepseek_v3 3 --pp 3
check "p2p = run's: qwen3 pp=4" same_run qwen3 4 --pp 4
check "p2p = run's: qwen2_moe pp=2 x 2 virtual stages" same_run qwen2_moe 2 --pp 2 --pp-virtual 2
check "p2p = run's: gpt_oss pp=2, a stage of no layer" same_run gpt_oss 2 --pp 2 --pp-layers 2,0
check "p2p = run's: mixtral pp=2 x tp=2 x ep=2" same_run mixtral 4 --pp 2 --tp 2 --ep 2 --ep-compute suggested

# fld JSON EXPR: a Python expression over the cost JSON d
fld() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }
G=$F/llama # 2 layers, H = 64: a stage's stream block of one row of 16 positions is 16 x 64 x 4 = 4096 bytes
"$HP" cost $G --pp 2 --mode train --batch 4 --seq 16 --format json -o "$WORK/t1.json"
"$HP" cost $G --pp 2 --mode train --batch 4 --seq 16 --pp-schedule gpipe --format json -o "$WORK/t2.json"
check "1f1b: stage 0 keeps 2 micro-batches in flight, stage 1 one" \
    test "$(fld "$WORK/t1.json" '[r["in_flight"] for r in d["ranks"]]')" = "[2, 1]"
# stage 0 keeps its layer's input (4096 bytes a micro-batch), stage 1 its layer's and the final norm's (8192)
check "1f1b: saved activations = in flight x each chunk's" \
    test "$(fld "$WORK/t1.json" '[r["saved_bytes"] for r in d["ranks"]]')" = "[8192, 8192]"
check "gpipe: every micro-batch in flight" \
    test "$(fld "$WORK/t2.json" '[(r["in_flight"], r["saved_bytes"]) for r in d["ranks"]]')" = "[(4, 16384), (4, 32768)]"
check "train p2p: the stream and its gradient, per micro-batch (2 x 4 x 4096)" \
    test "$(fld "$WORK/t1.json" '[(r["p2p_bytes"], r["p2p_calls"]) for r in d["ranks"]]')" = "[(32768, 8), (32768, 8)]"
check "the step includes the bubble: t_step = t_compute + t_exposed + t_bubble, the same on both stages" \
    fld "$WORK/t1.json" 'exit(0 if all(r["t_bubble"] > 0 and r["t_step"] == r["t_compute"] + r["t_exposed"] + r["t_bubble"]
                       and r["t_step"] == d["ranks"][0]["t_step"] for r in d["ranks"]) else 1)'
check "the JSON lists the stages" \
    test "$(fld "$WORK/t1.json" '[(s["stage"], s["ranks"], s["layers"], s["embedding"], s["head"]) for s in d["pipeline"]["stages"]]')" \
    = "[(0, [0, 1], 1, True, False), (1, [1, 2], 1, False, True)]"
# interleaved, pp=2 x 2 virtual, 4 micro-batches: Megatron's warm-up (pp - s - 1)·2 + (v - 1)·pp, + 1
"$HP" cost $F/qwen2_moe --pp 2 --pp-virtual 2 --mode train --batch 4 --seq 16 --format json -o "$WORK/t3.json"
check "interleaved: 5 and 3 chunk-micro-batches in flight" \
    test "$(fld "$WORK/t3.json" '[r["in_flight"] for r in d["ranks"]] + [d["pipeline"]["schedule"]]')" = "[5, 3, 'interleaved']"
expect 0 "pipeline pp=2 x 1 virtual, schedule 1f1b, 4 micro-batches" -- "$HP" cost $G --pp 2 --mode train --batch 4 --seq 16

# Llama 3 405B (tests/data/configs/llama-3.1-405b.json) at TP8 x PP16 x DP128 on 16,384 H100s, 16M-token batches of
# 8,192-token sequences (2,048 rows: 16 micro-batches of 1 row per replica), ZeRO-1, interleaved. One configuration
# meets both figures (docs/cost.md "Published check": the assumptions, full recompute and 4 virtual stages, which
# the paper's table does not give)
L405="data/configs/llama-3.1-405b.json --mesh pp=16,dp=128,tp=8 --mode train --hardware H100 --seq 8192
      --batch 2048 --zero 1 --mem-per-rank 80GB --format json"
"$HP" cost $L405 --pp-virtual 4 --recompute full -o "$WORK/l2.json"
check "Llama 3 405B: MFU within 1.25x of the reported 41%" \
    fld "$WORK/l2.json" 'exit(0 if 0.41 / 1.25 <= d["mfu"] <= 0.41 * 1.25 else 1)'
check "Llama 3 405B: the same configuration fits 80 GB per GPU (the budget less the reserve)" \
    fld "$WORK/l2.json" 'exit(0 if max(r["total_bytes"] for r in d["ranks"]) <= d["mem_usable"] and d["fit"] is None else 1)'
"$HP" cost $L405 --pp-virtual 2 --recompute selective -o "$WORK/l1.json"
# the bubble of even stages: the busiest stage's bubble is (p - 1) / (v m) of its own work (1f1b 15/16,
# interleaved 15/32; the first and last stages, one layer lighter, do not set the pace)
"$HP" cost data/configs/llama-3.1-405b.json --mesh pp=16,dp=128,tp=8 --mode train --hardware H100 --seq 8192 \
    --batch 2048 --zero 1 --format json -o "$WORK/l3.json"
bubble() { fld "$1" 'max((r["t_busy"], r["t_bubble"]) for r in d["ranks"])[1] / max(r["t_busy"] for r in d["ranks"])'; }
check "bubble, 1f1b: (p - 1) / m = 15/16 of the ideal step, within 1%" \
    python3 -c "import sys; b = float(sys.argv[1]); sys.exit(0 if abs(b - 15 / 16) < 0.01 * 15 / 16 else 1)" "$(bubble "$WORK/l3.json")"
check "bubble, interleaved v=2: (p - 1) / (v m) = 15/32 of the ideal step, within 1%" \
    python3 -c "import sys; b = float(sys.argv[1]); sys.exit(0 if abs(b - 15 / 32) < 0.01 * 15 / 32 else 1)" "$(bubble "$WORK/l1.json")"

# advise: pp searched; why a pp is rejected
"$HP" advise data/configs/llama-3-8b.json --world 8 --mode train --hardware H100 --zero 1 --seq 4096 --all \
    --format json -o "$WORK/a1.json"
check "advise: pp meshes accepted, with their plan command" \
    fld "$WORK/a1.json" 'exit(0 if any(c["ok"] and c["pp"] > 1 and "--pp " in c["command"] for c in d["candidates"]) else 1)'
# 2 rows: at pp=4 the busiest stage idles (p - 1) / m = 1.5 times its own work
"$HP" advise data/configs/llama-3-8b.json --world 8 --mode train --hardware H100 --zero 1 --seq 4096 --batch 2 --all \
    --format json -o "$WORK/a3.json"
check "advise: a pp rejected for its bubble" \
    fld "$WORK/a3.json" 'exit(0 if any(not c["ok"] and c["pp"] > 1 and "pipeline bubble" in c["reason"] for c in d["candidates"]) else 1)'
expect 0 "makes 8 chunks, but the model has only 2 decoder layers" -- "$HP" advise $G --world 8 --mem-per-rank 1TB --all
# advise for Llama 3 405B on 16,384 H100-80GB at sequence 8192 (16M-token batches) accepts pp=16 meshes
"$HP" advise data/configs/llama-3.1-405b.json --world 16384 --mode train --hardware H100 --seq 8192 --batch 2048 \
    --zero 1 --format json -o "$WORK/a405.json"
check "advise Llama 3 405B on 16,384 H100: a pp=16 mesh accepted" \
    fld "$WORK/a405.json" 'exit(0 if any(c["ok"] and c["pp"] == 16 for c in d["candidates"]) else 1)'
# DeepSeek-V3 on 2,048 GPUs (trained at PP16 x EP64, ZeRO-1, on 2,048 H800): advise evaluates and accepts pp x ep
"$HP" advise data/configs/deepseek-v3.json --world 2048 --mode train --hardware H100 --zero 1 --seq 4096 --batch 2048 \
    --format json -o "$WORK/a2.json"
check "advise DeepSeek-V3 on 2,048: pp x ep meshes accepted" \
    fld "$WORK/a2.json" 'exit(0 if sum(c["ok"] and c["pp"] > 1 and c["ep"] > 1 for c in d["candidates"]) > 0 else 1)'

# refusals
expect 2 "--pp-schedule expects 1f1b, gpipe or interleaved, got 'zb'" -- "$HP" cost $G --pp 2 --mode train --pp-schedule zb
expect 2 "--pp-schedule interleaved runs virtual stages" -- "$HP" cost $G --pp 2 --mode train --batch 2 --pp-schedule interleaved
expect 2 "3 micro-batches is not a multiple of it" -- "$HP" cost $F/qwen2_moe --pp 2 --pp-virtual 2 --mode train --batch 3 --seq 16
expect 2 "runs one chunk per stage" -- "$HP" cost $F/qwen2_moe --pp 2 --pp-virtual 2 --mode train --batch 2 --pp-schedule 1f1b
expect 2 "the mesh has no pp axis" -- "$HP" cost $G --mode train --pp-schedule gpipe
expect 2 "give --mode train or drop --pp-schedule" -- "$HP" cost $G --pp 2 --pp-schedule gpipe
expect 2 "does not model a pipeline (pp=2) yet" -- "$HP" cost $G --pp 2 --mode decode
finish

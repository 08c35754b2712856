# Long prefill (docs/run.md "Long prefill"): the dense MLP's forward runs in row chunks of 1024 rows (the last
# one taking the rest when fewer than 1024 + 256 remain), so its buffers hold a chunk, not the sequence.
# - The chunked logits equal the unchunked ones (HP_TEST_MLP_WHOLE=1: the MLP on all rows at once, as a training
#   runner runs it) within 1e-6 of max|logits| (bit-identical on the machines measured), for f32 and bf16 weights,
#   exact and bf16 compute, sequences of 3 chunks, 2 chunks with a long tail, batches, tp, cp and dp.
# - Chunking shrinks run's workspace, and cost's workspace equals run's to the byte at these lengths.
# - cost's workspace grows with the sequence by less than the MLP's width per row (it grew by 3·I floats per row
#   unchunked), while --mode train (whose backward reads every row's intermediates) still grows by them.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
I=2048
"$HP" gen --family llama --out l32 --layers 2 --hidden 64 --intermediate $I --vocab 128 >/dev/null 2>&1
"$HP" gen --family qwen2 --out q16 --layers 2 --hidden 64 --intermediate $I --vocab 128 --dtype bf16 >/dev/null 2>&1
check "the models are generated" test -f l32/model.safetensors -a -f q16/model.safetensors

n=0
while read -r model np input compute flags; do
    n=$((n + 1))
    launch=""
    [ "$np" -gt 1 ] && launch="$MPI -np $np -x HP_TEST_MLP_WHOLE"
    HP_TEST_MLP_WHOLE=1 $launch "$HP" run $model --random-input $input --compute $compute $flags \
        --output ref$n.st --stats-json whole$n.json >/dev/null 2>&1 </dev/null
    launch=""
    [ "$np" -gt 1 ] && launch="$MPI -np $np"
    expect 0 "logits max diff" -- $launch "$HP" run $model --random-input $input --compute $compute $flags \
        --compare ref$n.st --compare-rtol 1e-6 --stats-json chunked$n.json
done <<'LIST'
l32 1 1,3000 exact
l32 1 2,1500 bf16
l32 1 1,2200 exact
q16 1 1,3000 bf16
q16 1 3,1000 exact
l32 2 1,3000 exact --tp 2
q16 2 1,3000 bf16 --tp 2 --no-sequence-parallel
l32 2 1,3000 bf16 --cp 2
q16 2 2,2600 exact --dp 2
LIST

# ws FILE: rank 0's workspace_bytes of a --stats-json or cost --format json file.
ws() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ranks"][0]["workspace_bytes"])' "$1"; }
smaller() { [ "$(ws "$1")" -lt "$(ws "$2")" ]; }
check "chunking shrinks run's workspace (1 process)" smaller chunked1.json whole1.json
check "chunking shrinks run's workspace (tp 2)" smaller chunked6.json whole6.json

# same_ws RUN COST: every rank's workspace_bytes agree
same_ws() {
    python3 - "$1" "$2" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); cost = json.load(open(sys.argv[2]))
ok = len(run["ranks"]) == len(cost["ranks"]) > 0
for a, b in zip(run["ranks"], cost["ranks"]):
    if a["workspace_bytes"] != b["workspace_bytes"]:
        ok = False
        print("rank", a["rank"], "run", a["workspace_bytes"], "cost", b["workspace_bytes"])
sys.exit(0 if ok else 1)
PY
}
"$HP" cost l32 --random-input 1,3000 --format json -o c1.json 2>/dev/null
check "cost workspace = run workspace at 3000 tokens" same_ws chunked1.json c1.json
"$HP" cost l32 --random-input 1,3000 --tp 2 --format json -o c6.json 2>/dev/null
check "cost workspace = run workspace at 3000 tokens, tp 2" same_ws chunked6.json c6.json
"$HP" cost l32 --random-input 1,3000 --cp 2 --format json -o c8.json 2>/dev/null
check "cost workspace = run workspace at 3000 tokens, cp 2" same_ws chunked8.json c8.json
"$HP" cost q16 --random-input 2,2600 --dp 2 --format json -o c9.json 2>/dev/null
check "cost workspace = run workspace at 2 x 2600 tokens, dp 2" same_ws chunked9.json c9.json

# growth MODE LO HI: cost's workspace growth per added token from seq LO to HI (bytes)
growth() {
    "$HP" cost l32 --batch 1 --seq "$2" --mode "$1" --format json -o g_lo.json 2>/dev/null &&
        "$HP" cost l32 --batch 1 --seq "$3" --mode "$1" --format json -o g_hi.json 2>/dev/null &&
        echo $((($(ws g_hi.json) - $(ws g_lo.json)) / ($3 - $2)))
}
inf=$(growth infer 4096 16384)
train=$(growth train 4096 16384)
echo "workspace growth per token: infer $inf B, train $train B (the MLP's 3·I floats: $((12 * I)) B)"
check "inference workspace grows by less than I floats per token ($inf B)" test "${inf:-999999}" -lt $((4 * I))
check "training workspace still holds every row's MLP intermediates ($train B)" test "${train:-0}" -ge $((12 * I))
finish

# Long prefill (docs/run.md "Long prefill"): the dense MLP's forward runs in row chunks of 1024 rows (the last
# one taking the rest when fewer than 1024 + 256 remain), so its buffers hold a chunk, not the sequence; and a run
# that takes no logits (no --output, no --compare) runs lm_head and the loss in the same row chunks.
# - The chunked logits equal the unchunked ones (HP_TEST_MLP_WHOLE=1: the MLP on all rows at once, as a training
#   runner runs it) within 1e-6 of max|logits| (bit-identical on the machines measured), for f32 and bf16 weights,
#   exact and bf16 compute, sequences of 3 chunks, 2 chunks with a long tail, batches, tp, cp and dp.
# - The loss of the logits-free run (head and loss chunked) equals, to the bit (--stats-json's 17 digits), the loss
#   of the same run with --output (the whole logits): 1 chunk and 2 chunks, f32 and bf16 weights, exact and bf16
#   compute, at 1 rank, tp 2 with and without SP, tp 2 --loss-parallel, cp 2, dp 2; and its workspace is smaller by
#   at least (T - 1024) x V floats (the chunked path is taken).
# - cost's workspace equals the logits-free run's to the byte at 1, 2 and several chunks (an even and an odd count
#   of full chunks) at 1 rank, tp 2 (and --loss-parallel), cp 2, dp 2.
# - cost's workspace grows with the sequence by less than the MLP's width per row (it grew by 3·I floats per row
#   unchunked), while --mode train (whose backward reads every row's intermediates) still grows by them.
# Under the sanitizers (HP_SANITIZED=1, tests/CMakeLists.txt) these runs take minutes: each list runs its cases
# marked "s", which still meet every kind (each family and weight dtype, exact and bf16 compute, each mesh kind,
# below, at and above a chunk; several chunks on 1 process and tp 2), and the release build runs them all (`full`).
source "$(dirname "$0")/lib.sh"
cd "$WORK"
full() { [ "${HP_SANITIZED:-0}" != 1 ]; }
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
I=2048
"$HP" gen --family llama --out l32 --layers 2 --hidden 64 --intermediate $I --vocab 128 >/dev/null 2>&1
"$HP" gen --family qwen2 --out q16 --layers 2 --hidden 64 --intermediate $I --vocab 128 --dtype bf16 >/dev/null 2>&1
check "the models are generated" test -f l32/model.safetensors -a -f q16/model.safetensors

n=0
while read -r when model np input compute flags; do
    n=$((n + 1))
    [ "$when" = s ] || full || continue
    launch=""
    [ "$np" -gt 1 ] && launch="$MPI -np $np -x HP_TEST_MLP_WHOLE"
    HP_TEST_MLP_WHOLE=1 $launch "$HP" run $model --random-input $input --compute $compute $flags \
        --output ref$n.st --stats-json whole$n.json >/dev/null 2>&1 </dev/null
    launch=""
    [ "$np" -gt 1 ] && launch="$MPI -np $np"
    expect 0 "logits max diff" -- $launch "$HP" run $model --random-input $input --compute $compute $flags \
        --compare ref$n.st --compare-rtol 1e-6 --stats-json chunked$n.json
done <<'LIST'
s l32 1 1,3000 exact
- l32 1 2,1500 bf16
s l32 1 1,2200 exact
- q16 1 1,3000 bf16
s q16 1 3,1000 exact
s l32 2 1,3000 exact --tp 2
- q16 2 1,3000 bf16 --tp 2 --no-sequence-parallel
s l32 2 1,3000 bf16 --cp 2
s q16 2 2,2600 exact --dp 2
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
# loss FILE: the loss of a --stats-json file, as written (17 digits)
loss() { python3 -c 'import json, sys; print(repr(json.load(open(sys.argv[1]))["loss"]))' "$1"; }
same_loss() { [ "$(loss "$1")" = "$(loss "$2")" ] || { echo "loss $(loss "$1") vs $(loss "$2")"; false; }; }
# The logits-free run: the same loss as the run that takes the whole logits, and the workspace cost gives.
V=4096
"$HP" gen --family llama --out v32 --layers 2 --hidden 64 --intermediate 128 --vocab $V >/dev/null 2>&1
"$HP" gen --family llama --out v16 --layers 2 --hidden 64 --intermediate 128 --vocab $V --dtype bf16 >/dev/null 2>&1
check "the vocab-heavy models are generated" test -f v32/model.safetensors -a -f v16/model.safetensors
n=0
mi=0
while read -r keep np mesh; do # keep: the combinations (1-4 below) sanitized builds run on this mesh
    mi=$((mi + 1))
    [ "$mesh" = - ] && mesh=""
    short=1,300 long=1,2100 # 1 chunk, 2 chunks (1024 + 1076 rows per rank)
    case "$mesh" in *--cp*) long=1,2600 ;; *--dp*) short=2,300 long=2,2100 ;; esac
    launch=""
    [ "$np" -gt 1 ] && launch="$MPI -np $np"
    ci=0
    for c in "v32 exact $short" "v32 bf16 $long" "v16 exact $long" "v16 bf16 $short"; do
        set -- $c
        n=$((n + 1)) ci=$((ci + 1))
        case $keep in *$ci*) ;; *) full || continue ;; esac
        $launch "$HP" run $1 --random-input $3 --compute $2 $mesh --output o$n.st --stats-json taken$n.json \
            >/dev/null 2>&1 </dev/null
        $launch "$HP" run $1 --random-input $3 --compute $2 $mesh --stats-json free$n.json >/dev/null 2>&1 </dev/null
        check "logits-free loss = whole-logits loss: $c np=$np $mesh" same_loss free$n.json taken$n.json
        if [ $2 = exact ]; then # cost's workspace is the logits-free run's
            "$HP" cost $1 --random-input $3 $mesh --format json -o cost$n.json 2>/dev/null
            check "cost workspace = logits-free run workspace: $c np=$np $mesh" same_ws free$n.json cost$n.json
        fi
    done
    # several chunks: 4 full ones and the rest (5000 rows per rank), 5 and the rest (6000)
    for T in 5000 6000; do
        # sanitized: an odd count on 1 process and an even one on tp 2
        full || { [ $mi -le 2 ] && [ $((T / 1000 % 2)) = $((mi % 2)) ]; } || continue
        input=1,$T
        case "$mesh" in *--cp*) input=1,$((2 * T)) ;; *--dp*) input=2,$T ;; esac
        $launch "$HP" run v32 --random-input $input $mesh --stats-json sev$T.json >/dev/null 2>&1 </dev/null
        "$HP" cost v32 --random-input $input $mesh --format json -o csev$T.json 2>/dev/null
        check "cost workspace = logits-free run workspace: $input np=$np $mesh" same_ws sev$T.json csev$T.json
    done
done <<'LIST'
12 1 -
2 2 --tp 2
3 2 --tp 2 --no-sequence-parallel
4 2 --tp 2 --loss-parallel
3 2 --cp 2
1 2 --dp 2
LIST
# The chunked path is taken: the workspace drops by at least the logits' rows past the longest chunk (of 2100
# rows: 1024 and 1076).
T=2100 C=1076
drops() { [ $(($(ws "$2") - $(ws "$1"))) -ge $(((T - C) * V * 4)) ] || { echo "$(ws "$2") -> $(ws "$1")"; false; }; }
check "the logits-free run holds one chunk of logits (1 process)" drops free2.json taken2.json
check "the logits-free run holds one chunk of logits (tp 2)" drops free6.json taken6.json
# The MLP-heavy model too (its MLP chunks dominate there).
"$HP" run l32 --random-input 1,3000 --stats-json l32.json >/dev/null 2>&1 </dev/null
"$HP" cost l32 --random-input 1,3000 --format json -o cl32.json 2>/dev/null
check "cost workspace = run workspace at 3000 tokens, MLP-heavy" same_ws l32.json cl32.json
$MPI -np 2 "$HP" run q16 --random-input 2,2600 --dp 2 --stats-json q16.json >/dev/null 2>&1 </dev/null
"$HP" cost q16 --random-input 2,2600 --dp 2 --format json -o cq16.json 2>/dev/null
check "cost workspace = run workspace at 2 x 2600 tokens, dp 2, MLP-heavy" same_ws q16.json cq16.json

# MoE: a sparse block's EP runtime holds one dispatch chunk (the MLP's row chunks of the group's most rows; routing
# once over all of them), and the sparse layers share one runtime. Against the unchunked runtime of the same binary
# (HP_TEST_MLP_WHOLE=1, which makes it whole as training does): routing identical (--compare's topk_idx) and logits
# within 1e-6 of max|logits| (an expert's rows go through the GEMM layer in fewer rows per call; see docs/run.md);
# below (1279 rows), at (1280: 1024 + 256) and above a chunk, f32 and bf16 weights (qwen2_moe: a shared expert and
# its gate), exact and bf16 compute, batches, ep 2 (tp 2 and the ep axis), a capacity factor. Where every product
# runs on the blocked kernel, whose rows do not depend on the call (HP_GEMM=hyperpar on an AVX-512 CPU, f32
# weights), the chunked logits are byte-identical. cost's workspace equals each chunked run's, and chunking shrinks
# it.
"$HP" gen --family qwen3_moe --out m32 --layers 3 >/dev/null 2>&1
"$HP" gen --family qwen2_moe --out m16 --layers 2 --dtype bf16 >/dev/null 2>&1
check "the MoE models are generated" test -f m32/model.safetensors -a -f m16/model.safetensors
printf -- '- match: "model.layers.*.mlp"\n  when: ep\n  region_dispatch: false\n  local_compute_fn:\n    _target_: qwen3moe_topk_router\n    capacity_factor: 1.0\n' >cf.yaml
n=0
while read -r when model np input compute flags; do
    n=$((n + 1))
    [ "$when" = s ] || full || continue
    [ "$flags" = "cf" ] && flags="--tp 2 --ep 2 --overrides cf.yaml"
    launch=""
    [ "$np" -gt 1 ] && launch="$MPI -np $np -x HP_TEST_MLP_WHOLE"
    HP_TEST_MLP_WHOLE=1 $launch "$HP" run $model --random-input $input --compute $compute $flags \
        --output mref$n.st --stats-json mwhole$n.json >/dev/null 2>&1 </dev/null
    launch=""
    [ "$np" -gt 1 ] && launch="$MPI -np $np"
    expect 0 "topk_idx 0 of" -- $launch "$HP" run $model --random-input $input --compute $compute $flags \
        --compare mref$n.st --compare-rtol 1e-6 --stats-json mchunk$n.json
    if [ $compute = exact ]; then
        "$HP" cost $model --random-input $input $flags --format json -o mcost$n.json 2>/dev/null
        check "cost workspace = chunked MoE run workspace: $model $input np=$np $flags" same_ws mchunk$n.json mcost$n.json
    fi
    case $input in *,1279 | 1,1000) ;; *) check "MoE chunking shrinks run's workspace: $model $input $flags" \
        smaller mchunk$n.json mwhole$n.json ;; esac
done <<'LIST'
s m32 1 1,1279 exact
s m32 1 1,1280 exact
- m32 1 1,3000 bf16
- m32 1 2,2100 exact
- m16 1 1,3000 exact
s m16 1 1,2600 bf16
- m32 2 1,3000 exact --tp 2 --ep 2 --ep-compute suggested
s m16 2 2,1500 exact --mesh dp=1,ep=2 --ep-axis --ep-compute suggested
s m32 2 1,3000 exact cf
LIST
if grep -q avx512bw /proc/cpuinfo; then # sanitized: 1 process at 3000 tokens
    for input in 1,1280 1,3000; do
        [ $input = 1,3000 ] || full || continue
        HP_GEMM=hyperpar HP_TEST_MLP_WHOLE=1 "$HP" run m32 --random-input $input --output bw.st >/dev/null 2>&1
        HP_GEMM=hyperpar "$HP" run m32 --random-input $input --output bc.st >/dev/null 2>&1
        check "MoE chunked logits byte-identical on the blocked kernel ($input)" cmp -s bw.st bc.st
    done
    if full; then
        HP_GEMM=hyperpar HP_TEST_MLP_WHOLE=1 $MPI -np 2 -x HP_GEMM -x HP_TEST_MLP_WHOLE "$HP" run m32 \
            --random-input 1,3000 --tp 2 --ep 2 --overrides cf.yaml --output bw.st >/dev/null 2>&1
        HP_GEMM=hyperpar $MPI -np 2 -x HP_GEMM "$HP" run m32 --random-input 1,3000 --tp 2 --ep 2 --overrides cf.yaml \
            --output bc.st >/dev/null 2>&1
        check "MoE chunked logits byte-identical on the blocked kernel (ep 2, capacity factor)" cmp -s bw.st bc.st
    fi
fi

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

# hyperpar train, trusted before step 1 (issue 36): ranks given other options (mpirun's MPMD form) exit 2 at once
# with one message naming the rank and the option, inputs compared by identity, not path, and --threads free;
# a bad token anywhere the run reads, an --eval-data with fewer windows than dp, a global batch below dp and a
# --save-every --out inside the model are refused before step 1, creating nothing; a batch the machine cannot
# hold is refused at once with its figure; flags that change nothing warn once.
source "$(dirname "$0")/lib.sh"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
cd "$WORK"
"$HP" gen --family llama --out M >/dev/null 2>&1 || { echo "FAIL: gen"; exit 1; }

# 400 tokens of vocabulary 128 (M's): 23 windows of 17; copies under other names and in another folder;
# bad.bin has a token >= 128 in window 21 of 24 (read at step 6 in file order); e1.bin is one window; ids.safetensors an
# input_ids [4, 16] I64 as a token file.
python3 - <<'EOF'
import json, os, struct
t = [(i * 5 + i // 7) % 128 for i in range(400)]
open("tok.bin", "wb").write(struct.pack("<400H", *t))
open("same.bin", "wb").write(struct.pack("<400H", *t))
os.makedirs("other", exist_ok=True)
u = list(t); u[7] = (u[7] + 1) % 128
open("other/tok.bin", "wb").write(struct.pack("<400H", *u))
b = list(t); b[21 * 16 + 7] = 300
open("bad.bin", "wb").write(struct.pack("<400H", *b))
open("e1.bin", "wb").write(struct.pack("<20H", *t[:20]))
open("ebad.bin", "wb").write(struct.pack("<60H", *(t[:40] + [128] + t[41:60])))
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [4, 16], "data_offsets": [0, 512]}}).encode()
open("ids.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<64q", *t[:64]))
EOF
D="--data tok.bin --seq 16 --global-batch 4"

# once NAME FILE: exactly one error line in FILE's output (rank 0's), naming what it should.
once() { [ "$(grep -c '^hyperpar: error:' "$1")" = 1 ]; }

# ---- T1: ranks given other options: exit 2, one message naming rank 1 and the option with both values ----
# (mpmd also checks that rank 0 printed exactly one error line)
mpmd() { # mpmd "A flags" "B flags" NEEDLE: rank 0 gets A, rank 1 B
    local out="$WORK/mpmd.out"
    $MPI -np 1 "$HP" train M $D --dp 2 $1 : -np 1 "$HP" train M $D --dp 2 $2 >"$out" 2>&1 </dev/null
    local rc=$?
    if [ "$rc" -ne 2 ] || ! grep -qF -- "$3" "$out" || ! once "$out"; then
        echo "FAIL: MPMD '$1' : '$2' exited $rc, expected 2 once with '$3'"; head -20 "$out"; FAILED=$((FAILED + 1))
    else PASSED=$((PASSED + 1)); fi
}
mpmd "--steps 3" "--steps 4" "rank 1 was given --steps 4 where rank 0 has --steps 3; every rank must be given the same"
# A value only one rank refuses: named as the option that differs (a usage error is said after the agreement).
mpmd "--steps 3" "--steps 0" "rank 1 was given --steps 0 where rank 0 has --steps 3"
mpmd "--steps 3" "--steps 3 --stop-after 5" "rank 1 was given --stop-after 5 where rank 0 has no --stop-after"
expect 2 "train: --lr expects a finite number > 0, got '0'" -- $MPI -np 2 "$HP" train M $D --lr 0
mpmd "--lr 1e-3 --beta1 0.8" "--lr 2e-3" "rank 1 was given --lr 2e-3 where rank 0 has --lr 1e-3"
mpmd "--schedule linear --warmup 1" "--schedule linear" "rank 1 was given no --warmup where rank 0 has --warmup 1"
mpmd "--seed 1" "--seed 2" "rank 1 was given --seed 2 where rank 0 has --seed 1"
mpmd "--zero 1" "" "rank 1 was given no --zero where rank 0 has --zero 1"
mpmd "" "--freeze *embed*" "rank 1 was given --freeze *embed* where rank 0 has no --freeze"
mpmd "--eval-data tok.bin --eval-every 1" "--eval-data tok.bin --eval-every 2" "rank 1 was given --eval-every 2"
mpmd "--out o1 --save-every 1" "--out o2 --save-every 1" "rank 1 was given --out o2 where rank 0 has --out o1"
mpmd "" "--grad-out g.safetensors" "rank 1 was given --grad-out g.safetensors where rank 0 has no --grad-out"
mpmd "--stats-json s.json --plot p.html --log-every 2" "--plot p.html --log-every 2" "rank 1 was given no --stats-json where rank 0 has"
check "nothing was written by the refused runs" bash -c '! ls -d o1 o2 g.safetensors s.json p.html 2>/dev/null'
# The data file by its identity: the same name in two folders (other bytes) differs; two names of one file agree,
# and --threads may differ.
expect 2 "rank 1 was given --data tok.bin where rank 0 has --data tok.bin, and the two are other files" -- \
    $MPI -np 1 "$HP" train M $D --dp 2 : -np 1 --wdir "$WORK/other" "$HP" train "$WORK/M" $D --dp 2
expect 0 "train: step 2/2 loss" -- $MPI -np 1 "$HP" train M $D --dp 2 --steps 2 --threads 1 \
    : -np 1 "$HP" train M --data same.bin --seq 16 --global-batch 4 --dp 2 --steps 2 --threads 2

# ---- T7: what is visible at the start is refused before step 1, and nothing is created ----
expect 2 "bad.bin: token 343 (byte offset 686) is 300" -- "$HP" train M --data bad.bin --seq 16 --global-batch 4 --steps 6 \
    --shuffle none --log-json bad.jsonl --out o3
check "a bad token at step 6: no step was taken, nothing written" bash -c \
    '! grep -q "train: step 1/" <("'"$HP"'" train M --data bad.bin --seq 16 --global-batch 4 --steps 6 --shuffle none 2>&1) && ! ls bad.jsonl o3 2>/dev/null'
expect 0 "train: step 2/2 loss" -- "$HP" train M --data bad.bin --seq 16 --global-batch 4 --steps 2 --shuffle none
expect 2 "outside the vocabulary [0, 128)" -- $MPI -np 2 "$HP" train M $D --dp 2 --eval-data ebad.bin \
    --eval-every 2 --steps 2 --log-json ev.jsonl
expect 2 "--eval-data e1.bin holds 1 window of --seq 16, fewer than the dp=2 replicas" -- \
    $MPI -np 2 "$HP" train M $D --dp 2 --eval-data e1.bin --eval-every 1 --plot ev.html
expect 2 "--global-batch 1 is fewer windows than the dp=2 replicas" -- \
    $MPI -np 2 "$HP" train M ${D/--global-batch 4/--global-batch 1} --dp 2
expect 2 "--micro-batch 3 rows per replica x dp=2 = 6 windows a micro-step, which does not divide --global-batch 4" -- \
    $MPI -np 2 "$HP" train M $D --dp 2 --micro-batch 3
check "no log or page of the refused runs" bash -c '! ls ev.jsonl ev.html 2>/dev/null'
expect 2 "--out M/run/step-2 lies inside the input M" -- "$HP" train M $D --steps 2 --out M/run --save-every 1
check "no folder left in the model folder" bash -c '[ "$(ls M)" = "$(printf "config.json\nmodel.safetensors")" ]'
mkdir -p run/step-2 && touch run/step-2/x
expect 2 "--out run holds step-2, a checkpoint of another run" -- "$HP" train M $D --steps 2 --out run --save-every 1
check "an earlier run's last checkpoint is named before step 1" bash -c '[ ! -e run/step-1 ]'
cp tok.bin tok.keep
expect 2 "--grad-out" -- "$HP" train M $D --grad-out tok.bin
check "--grad-out naming the token file: refused, the file intact" cmp -s tok.bin tok.keep

# ---- T11: a batch the machine cannot hold: refused at once with its figure, before anything is read ----
start=$(date +%s)
expect 2 "train of M on micro-batches of 10000000 x 17 tokens needs" -- "$HP" train M --data tok.bin --seq 16 \
    --global-batch 10000000 --log-json big.jsonl
check "refused within 10 s, no log" bash -c "[ \$((\$(date +%s) - $start)) -lt 10 ] && [ ! -e big.jsonl ]"
expect 2 "per rank x 2 ranks on this node" -- $MPI -np 2 "$HP" train M --data tok.bin --seq 16 \
    --global-batch 10000000 --dp 2
expect 2 "give a smaller --micro-batch" -- "$HP" train M --data tok.bin --seq 16 --global-batch 10000000 \
    --micro-batch 5000000

# ---- T16: flags that change nothing: one warning line on rank 0 ----
warns() { # warns CODE NEEDLE command...: exit CODE, NEEDLE once (exit 2: the warning precedes a refusal)
    local code="$1" needle="$2" out
    shift 2
    out=$("$@" 2>&1 </dev/null)
    local rc=$?
    if [ "$rc" -ne "$code" ] || [ "$(grep -cF -- "$needle" <<<"$out")" != 1 ]; then
        echo "FAIL: '$*' exited $rc or lacks one '$needle'"; echo "$out" | head -20; FAILED=$((FAILED + 1))
    else PASSED=$((PASSED + 1)); fi
}
# Big: a batch refused for memory right after the warnings, which come first (no step is needed to see them).
Big="--data tok.bin --seq 16 --global-batch 10000000"
warns 0 "hyperpar: warning: train: --min-lr has no effect with --schedule constant" \
    "$HP" train M $D --schedule constant --min-lr 1e-5
warns 2 "hyperpar: warning: train: --eval-every 5 has no effect" \
    "$HP" train M $Big --steps 2 --eval-data tok.bin --eval-every 5
warns 2 "hyperpar: warning: train: --eval-every 2 has no effect" \
    "$HP" train M $Big --steps 3 --stop-after 1 --eval-data tok.bin --eval-every 2
warns 0 "hyperpar: warning: train: --data-dtype has no effect with a safetensors --data" \
    "$HP" train M --data ids.safetensors --seq 16 --global-batch 4 --data-dtype uint16
warns 2 "hyperpar: warning: train: --seed has no effect with --shuffle none" "$HP" train M $Big --seed 5 --shuffle none
warns 2 "hyperpar: warning: train: --stop-after 1 has no effect" "$HP" train M $Big --stop-after 1
warns 2 "hyperpar: warning: train: --min-lr has no effect: --warmup 3 spans all --steps 3" \
    "$HP" train M $Big --steps 3 --warmup 3 --min-lr 1e-5
warns 0 "hyperpar: warning: train: --zero 1 has no effect at dp=1" $MPI -np 2 "$HP" train M $D --tp 2 --zero 1
check "no warning for flags that act" bash -c '! "'"$HP"'" train M '"$D"' --steps 2 --seed 5 --min-lr 1e-5 \
    2>&1 | grep -q warning'

finish

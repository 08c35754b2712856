# hyperpar train: one AdamW step of llama and qwen2 (tied embeddings) at 1 process and under mpirun at tp=2 and
# cp=2, the first step's gradients (--grad-out) and the parameters after it (--out) against PyTorch's
# (train_io.safetensors, checked by train_check.py); the --out folder runs and inspects, and after 3 steps its
# loss is lower than the original's; usage and input errors exit 2 with one message and write nothing.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
OPT="--steps 1 --lr 1e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0.1"
check_out() { python3 cli/train_check.py "$F/$1/train_io.safetensors" "$F/$1" "$WORK/$2.g.st" "$WORK/$2" >"$WORK/$2.log"; }

for fam in llama qwen2; do
    G=$F/$fam
    I=$G/forward_io.safetensors
    expect 0 "train: step 1/1 loss" -- "$HP" train $G --input $I $OPT --grad-out "$WORK/$fam.1.g.st" --out "$WORK/$fam.1"
    check "$fam: 1 process: gradients and the AdamW step equal PyTorch's" check_out $fam $fam.1
    while read -r np flags; do
        tag=$fam.$(tr -d ' -' <<<"$flags")
        expect 0 "train: step 1/1 loss" -- $MPI -np $np "$HP" train $G --input $I $OPT $flags \
            --grad-out "$WORK/$tag.g.st" --out "$WORK/$tag"
        check "$fam $flags: gradients and the AdamW step equal PyTorch's" check_out $fam $tag
    done <<'LIST'
2 --tp 2
2 --cp 2
LIST
done
# The checker fails on a wrong answer: three steps are not the golden's one.
G=$F/llama
I=$G/forward_io.safetensors
expect 0 "train: step 3/3 loss" -- "$HP" train $G --input $I --steps 3 --lr 1e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 \
    --weight-decay 0.1 --grad-out "$WORK/three.g.st" --out "$WORK/three"
check "three steps fail the one-step bar" test "$(check_out llama three; echo $?)" = 1
# The losses of --grad-out: F32 [3], falling.
check "loss F32 [3], falling" python3 - "$WORK/three.g.st" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
t = h["loss"]; assert t["dtype"] == "F32" and t["shape"] == [3], t
lo, hi = t["data_offsets"]; l = struct.unpack("<3f", b[8 + n + lo:8 + n + hi])
assert l[0] > l[1] > l[2] > 0, l
EOF
# The output folder is a checkpoint run and inspect load; its loss is lower than the original's.
loss() { grep -o 'run: loss [0-9.e+-]*' <<<"$1" | awk '{print $3}'; }
l0=$(loss "$("$HP" run $G --input $I 2>&1)")
l3=$(loss "$("$HP" run "$WORK/three" --input $I 2>&1)")
check "run on the output folder: loss $l3 < $l0" awk -v a="$l3" -v b="$l0" 'BEGIN { exit !(a != "" && a + 0 < b + 0) }'
expect 0 "LlamaForCausalLM" -- "$HP" inspect "$WORK/three"
check "config.json says float32" grep -q '"torch_dtype": "float32"' "$WORK/three/config.json"
check "the folder holds its marker, config.json and model.safetensors only" \
    test "$(ls -A "$WORK/three" | tr '\n' ' ')" = ".hyperpar-output config.json model.safetensors "
check "no temporary left beside it" test -z "$(ls "$WORK" | grep '\.tmp\.')"

# --out: a non-empty folder of the user's is refused and untouched; an earlier train output needs --force.
mkdir -p "$WORK/mine" && echo keep >"$WORK/mine/notes.txt"
expect 2 "is not empty and is not an earlier 'hyperpar train' output" -- "$HP" train $G --input $I --out "$WORK/mine"
check "the user's folder is untouched" test "$(ls -A "$WORK/mine")" = "notes.txt" -a "$(cat "$WORK/mine/notes.txt")" = keep
expect 2 "pass --force" -- "$HP" train $G --input $I --out "$WORK/three"
before=$(md5sum <"$WORK/three/model.safetensors")
expect 0 "train: wrote" -- "$HP" train $G --input $I --out "$WORK/three" --force
check "--force replaced the earlier output" test "$(md5sum <"$WORK/three/model.safetensors")" != "$before"
echo x >"$WORK/three/extra.txt"
expect 2 "is not empty" -- "$HP" train $G --input $I --out "$WORK/three" --force
check "a train output with a file of the user's is not replaced" test -f "$WORK/three/extra.txt"
mkdir -p "$WORK/empty"
expect 0 "train: wrote" -- "$HP" train $G --input $I --out "$WORK/empty"
check "an empty folder takes the output" test -f "$WORK/empty/model.safetensors"
expect 2 "the input" -- "$HP" train $G --input $I --out $G/sub
expect 2 "does not exist" -- "$HP" train $G --input $I --out "$WORK/no/such/dir"
cp $G/model.safetensors "$WORK/bare.safetensors"
expect 2 "has no config.json beside its weights" -- "$HP" train "$WORK/bare.safetensors" --input $I --out "$WORK/bare"

# Usage and input errors: exit 2, one message, nothing written.
expect 2 "missing --input" -- "$HP" train $G
expect 2 "--freeze is not supported by train yet" -- "$HP" train $G --input $I --freeze 'model.norm.*'
expect 2 "--lr expects a finite number > 0, got '0'" -- "$HP" train $G --input $I --lr 0
expect 2 "--lr expects" -- "$HP" train $G --input $I --lr nan
expect 2 "--lr expects" -- "$HP" train $G --input $I --lr 1e400
expect 2 "--beta1 expects a number in [0, 1), got '1'" -- "$HP" train $G --input $I --beta1 1
expect 2 "--beta2 expects" -- "$HP" train $G --input $I --beta2 -0.1
expect 2 "--eps expects" -- "$HP" train $G --input $I --eps 0
expect 2 "--weight-decay expects" -- "$HP" train $G --input $I --weight-decay -1
expect 2 "--steps" -- "$HP" train $G --input $I --steps 0
expect 2 "--steps" -- "$HP" train $G --input $I --steps 1000000001
expect 2 "--steps" -- "$HP" train $G --input $I --steps abc
expect 2 "--grad-out 'data/forward/llama/forward_io.safetensors' is one of the inputs" -- \
    "$HP" train $G --input $I --grad-out $I
expect 2 "--grad-out" -- "$HP" train $G --input $I --grad-out $G/model.safetensors
mkdir "$WORK/gx"
expect 2 "is or lies inside --out" -- "$HP" train $G --input $I --out "$WORK/gy" --grad-out "$WORK/gy"
check "nothing written for --grad-out = --out" test ! -e "$WORK/gy"
expect 2 "lies inside --out" -- "$HP" train $G --input $I --out "$WORK/gx" --grad-out "$WORK/gx/g.st"
check "no output of the refused run" test -z "$(ls -A "$WORK/gx")"
expect 2 "1 processes run it" -- "$HP" train $G --input $I --tp 2
expect 2 "4 ranks but 2 processes" -- $MPI -np 2 "$HP" train $G --input $I --cp 2 --tp 2
# A MoE model is refused with exit 2 and its message printed once, also under mpirun.
out=$($MPI -np 2 "$HP" train $F/mixtral --input $F/mixtral/forward_io.safetensors --tp 2 \
    --out "$WORK/moe" 2>&1 </dev/null)
rc=$?
check "MoE refused: exit 2" test "$rc" = 2
check "MoE refused: one message" test "$(grep -c 'no backward for MoE blocks' <<<"$out")" = 1
check "MoE refused: no --out written" test ! -e "$WORK/moe"
expect 2 "no backward for MoE" -- "$HP" train $F/mixtral --input $F/mixtral/forward_io.safetensors
expect 0 "--grad-out G" -- "$HP" train --help
expect 0 "train a dense checkpoint" -- "$HP" --help
# A signal while rank 0 writes (HP_TEST_PAUSE_MID_WRITE pauses the safetensors writer with its temporary made):
# the temporary folder and files go, --out never appears, the exit status is the signal's.
set -m # job control: background runs keep SIGINT
for sig in INT TERM; do
    P="$WORK/pause$sig"
    HP_TEST_PAUSE_MID_WRITE="$P" "$HP" train $G --input $I --out "$WORK/sig$sig" --grad-out "$WORK/sig$sig.g.st" \
        >"$P.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do [ -e "$P.ready" ] || ! kill -0 $pid 2>/dev/null && break; sleep 0.1; done
    check "train SIG$sig: paused mid-write with its temporary folder" test -e "$P.ready" -a -d "$WORK/sig$sig.tmp.$pid"
    kill -s $sig $pid
    wait $pid; rc=$?
    check "train SIG$sig: exit status $((128 + $(kill -l $sig))) (got $rc)" test "$rc" -eq $((128 + $(kill -l $sig)))
    check "train SIG$sig: no --out, no temporary left" test ! -e "$WORK/sig$sig" -a -z "$(ls "$WORK" | grep "\.tmp\.")"
    check "train SIG$sig: no --grad-out" test ! -e "$WORK/sig$sig.g.st"
done
finish

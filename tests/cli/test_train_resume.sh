# hyperpar train checkpoints (--save-every, --stop-after, --resume): K steps, save, resume, K steps gives
# bit-identical files (cmp of the merged checkpoints and of every rank's state) to 2K steps in one run: llama at 1 process; a token file with accumulation and ZeRO-1 at
# dp=2; qwen3_moe with TP-extend-EP at tp=2 x ep=2. A checkpoint folder loads as a model (run, inspect); a resume
# with other flags is refused naming the flag; an incomplete step folder is never resumed from.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
G=$F/llama
I=$G/forward_io.safetensors
# The bar: both checkpoints merged (hyperpar merge) are the same bytes, and so is every rank's optimizer state (but
# for the run id in its metadata).
same() {
    rm -rf "$WORK/m1" "$WORK/m2"
    "$HP" merge "$1" --out "$WORK/m1" >/dev/null 2>&1 && "$HP" merge "$2" --out "$WORK/m2" >/dev/null 2>&1 &&
        cmp -s "$WORK/m1/model.safetensors" "$WORK/m2/model.safetensors" &&
        cmp -s "$WORK/m1/config.json" "$WORK/m2/config.json" || return 1
    # the rank files: every tensor byte and metadata value but the run id, which names the run that wrote them
    python3 "$TESTS/cli/ckpt_same.py" "$1" "$2" $(cd "$1" && ls rank-*.safetensors)
}

"$HP" train $G --input $I --steps 4 --lr 1e-2 --clip 1 --save-every 2 --out "$WORK/a" >/dev/null 2>&1
expect 0 "checkpoint $WORK/b/step-2" -- "$HP" train $G --input $I --steps 4 --lr 1e-2 --clip 1 --save-every 2 \
    --stop-after 2 --out "$WORK/b"
check "--stop-after 2 wrote step-2 only" test -d "$WORK/b/step-2" -a ! -e "$WORK/b/step-4"
expect 0 "resumed from $WORK/b/step-2 at step 2" -- "$HP" train $G --input $I --steps 4 --lr 1e-2 --clip 1 \
    --save-every 2 --resume "$WORK/b" --out "$WORK/b"
check "1 process: 2 + 2 steps are bit-identical to 4" same "$WORK/a/step-4" "$WORK/b/step-4"
check "and the intermediate checkpoints too" same "$WORK/a/step-2" "$WORK/b/step-2"
expect 0 "run: loss" -- "$HP" run "$WORK/a/step-4" --input $I
expect 0 "LlamaForCausalLM" -- "$HP" inspect "$WORK/a/step-4"
# a resume with other flags, a folder without a complete checkpoint
expect 2 "the run was saved with lr 0.01" -- "$HP" train $G --input $I --steps 4 --lr 2e-2 --clip 1 --save-every 2 \
    --resume "$WORK/b/step-2" --out "$WORK/c"
mkdir -p "$WORK/d/step-7"
expect 2 "holds no complete checkpoint" -- "$HP" train $G --input $I --steps 4 --resume "$WORK/d"
check "an incomplete step-<t> is not taken" test "$(ls "$WORK/b" | tr '\n' ' ')" = "step-2 step-4 "
# A step-<t> that lacks a file its state.json names is incomplete: --resume RUN passes over it, naming one refuses it.
cp -r "$WORK/b/step-4" "$WORK/b/step-9" && rm "$WORK/b/step-9/rank-0.safetensors"
expect 2 "rank-0.safetensors, which state.json names, is missing" -- "$HP" train $G --input $I --steps 4 --lr 1e-2 \
    --clip 1 --save-every 2 --resume "$WORK/b/step-9" --out "$WORK/b"
expect 2 "at step 4 of 4; nothing is left" -- "$HP" train $G --input $I --steps 4 --lr 1e-2 --clip 1 --save-every 2 \
    --resume "$WORK/b" --out "$WORK/b"
rm -rf "$WORK/b/step-9"
expect 2 "--save-every needs --out" -- "$HP" train $G --input $I --save-every 2
expect 2 "--stop-after 5 is past --steps 4" -- "$HP" train $G --input $I --steps 4 --stop-after 5

# A token file, GB 4 in micro-steps of 1 row a replica (2 windows), ZeRO-1 over dp=2, shuffled by seed; then MoE with TP-extend-EP.
python3 - "$WORK/tok.bin" <<'PY'
import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<%dH" % 400, *[(i * 37 + 11) % 128 for i in range(400)]))
PY
D="--data $WORK/tok.bin --seq 15 --global-batch 4 --micro-batch 1 --steps 6 --warmup 2 --lr 1e-3 --seed 5"
$MPI -np 2 "$HP" train $G $D --dp 2 --zero 1 --save-every 3 --out "$WORK/e" >/dev/null 2>&1
expect 0 "checkpoint" -- $MPI -np 2 "$HP" train $G $D --dp 2 --zero 1 --save-every 3 --stop-after 3 --out "$WORK/f"
expect 0 "resumed" -- $MPI -np 2 "$HP" train $G $D --dp 2 --zero 1 --save-every 3 --resume "$WORK/f" --out "$WORK/f"
check "dp=2, ZeRO-1, token data: 3 + 3 steps are bit-identical to 6" same "$WORK/e/step-6" "$WORK/f/step-6"
Q=$F/qwen3_moe
M="--input $Q/forward_io.safetensors --tp 2 --ep 2 --overrides data/overrides/qwen3_moe_ep.yaml --steps 4 --lr 1e-2"
$MPI -np 2 "$HP" train $Q $M --save-every 2 --out "$WORK/g" >/dev/null 2>&1
$MPI -np 2 "$HP" train $Q $M --save-every 2 --stop-after 2 --out "$WORK/h" >/dev/null 2>&1
expect 0 "resumed" -- $MPI -np 2 "$HP" train $Q $M --save-every 2 --resume "$WORK/h" --out "$WORK/h"
check "qwen3_moe tp=2 x ep=2: 2 + 2 steps are bit-identical to 4" same "$WORK/g/step-4" "$WORK/h/step-4"
expect 2 "the run was saved with world 2" -- "$HP" train $Q --input $Q/forward_io.safetensors --steps 4 --lr 1e-2 \
    --resume "$WORK/h/step-2"
finish

# hyperpar train --data: a uint16 token file for the llama golden (vocabulary 128) trained for 6 steps in
# micro-batches with a warmup and a cosine schedule; the log holds one JSON line per step with the documented
# lr and a falling loss; no accumulation, dp=2, tp=2 and dp=2 with ZeRO-1 give the same losses within 1e-4
# relative; a safetensors input_ids as --data equals --input; --eval-data reports an eval loss; the seeded
# order is reproducible and not the file's; bad inputs exit 2.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
M=data/forward/llama
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"

# 193 tokens with a short pattern the model can learn: W = floor(192 / 15) = 12 windows, 3 steps an epoch.
python3 - "$WORK" <<'EOF'
import struct, sys
w = sys.argv[1]
t = [(i * 5 + i // 7) % 128 for i in range(193)]
open(w + "/f.bin", "wb").write(struct.pack("<193H", *t))
open(w + "/e.bin", "wb").write(struct.pack("<33H", *t[:33]))
open(w + "/f32.bin", "wb").write(struct.pack("<193I", *t))
bad = list(t); bad[100] = 128
open(w + "/bad.bin", "wb").write(struct.pack("<193H", *bad))
open(w + "/short.bin", "wb").write(struct.pack("<15H", *t[:15]))
open(w + "/odd.bin", "wb").write(struct.pack("<15H", *t[:15]) + b"x")
EOF
D="--data $WORK/f.bin --seq 15 --global-batch 4 --steps 6 --warmup 2 --schedule cosine --lr 1e-3 --min-lr 1e-4 --shuffle none"

expect 0 "train: step 6/6 loss" -- "$HP" train $M $D --micro-batch 2 --log-json "$WORK/mb2.jsonl"
check "6 JSON lines: the documented lr, grad_norm and tokens/s, a falling loss" python3 - "$WORK/mb2.jsonl" <<'EOF'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 6, len(rows)
lr, mn, W, N = 1e-3, 1e-4, 2, 6
for t, r in enumerate(rows, 1):
    want = lr * t / W if t <= W else mn + 0.5 * (lr - mn) * (1 + math.cos(math.pi * (t - W) / (N - W)))
    assert r["step"] == t and abs(r["lr"] - want) <= 1e-15, (t, r["lr"], want)
    assert r["grad_norm"] > 0 and r["tokens_per_s"] > 0 and r["loss"] > 0, r
l = [r["loss"] for r in rows]
# Epoch 2 (steps 4..6) sees epoch 1's windows again: every one of its losses is lower.
assert all(l[i + 3] < l[i] for i in range(3)), l
EOF

# The same losses at every accumulation and mesh (f32 reduction order only).
same() {
    python3 - "$WORK/mb2.jsonl" "$1" <<'EOF'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 6, (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-4 * abs(x), (a, b)
EOF
}
expect 0 "train: step 6/6 loss" -- "$HP" train $M $D --micro-batch 4 --log-json "$WORK/mb4.jsonl"
check "no accumulation: the same losses" same "$WORK/mb4.jsonl"
expect 0 "train: step 6/6 loss" -- "$HP" train $M $D --log-json "$WORK/mbd.jsonl"
check "--micro-batch defaults to the global batch" same "$WORK/mbd.jsonl"
# --micro-batch is rows per dp replica (issue 36 T15, as cost's and Megatron's): at dp 2, 1 row a replica is 2
# windows a micro-step, so GB 4 takes 2 micro-steps, as --micro-batch 2 does at dp 1
while read -r tag flags; do
    expect 0 "train: step 6/6 loss" -- $MPI -np 2 "$HP" train $M $D $flags --log-json "$WORK/$tag.jsonl"
    check "$flags: the same losses" same "$WORK/$tag.jsonl"
done <<'LIST'
dp2 --dp 2 --micro-batch 1
tp2 --tp 2 --micro-batch 2
zero --dp 2 --zero 1 --micro-batch 1
dp2mb2 --dp 2 --micro-batch 2
LIST
expect 2 "--micro-batch 2 rows per replica x dp=2 = 4 windows a micro-step, which does not divide --global-batch 6" -- \
    $MPI -np 2 "$HP" train $M ${D/--global-batch 4/--global-batch 6} --dp 2 --micro-batch 2
# uint32 holds the same tokens: the same run.
expect 0 "train: step 6/6 loss" -- "$HP" train $M ${D/f.bin/f32.bin} --data-dtype uint32 --log-json "$WORK/u32.jsonl"
check "a uint32 file of the same tokens: the same losses" same "$WORK/u32.jsonl"

# A safetensors input_ids [2, 16] as --data (rows as stored, 15 scored positions each), both rows every step in
# two micro-batches of one row: the losses and norms of --input on the same batch.
I=$M/forward_io.safetensors
expect 0 "train: step 2/2 loss 4.571283 grad-norm 3.86102" -- "$HP" train $M --input $I --steps 2
expect 0 "train: step 2/2 loss 4.571283 grad-norm 3.86102" -- "$HP" train $M --data $I --seq 16 --global-batch 2 \
    --micro-batch 1 --schedule constant --steps 2
expect 2 "input_ids is [2, 16]; its rows must be --seq 15 ids long" -- "$HP" train $M --data $I --seq 15 \
    --global-batch 2

# --eval-data: every 3 steps, the mean over its 2 windows, printed and logged.
expect 0 "train: step 3/6 eval loss" -- "$HP" train $M $D --eval-data "$WORK/e.bin" --eval-every 3 \
    --log-json "$WORK/ev.jsonl"
check "eval_loss at steps 3 and 6 only" python3 - "$WORK/ev.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows if "eval_loss" in r] == [3, 6], rows
assert rows[5]["eval_loss"] < rows[2]["eval_loss"], rows
EOF
# The seeded order differs from the file's order (another first batch, another first loss) and repeats itself.
expect 0 "" -- "$HP" train $M ${D/--shuffle none/--seed 5} --log-json "$WORK/s1.jsonl"
expect 0 "" -- "$HP" train $M ${D/--shuffle none/--seed 5} --log-json "$WORK/s2.jsonl"
check "seeded: reproducible, and not the file's order" python3 - "$WORK/s1.jsonl" "$WORK/s2.jsonl" "$WORK/mb2.jsonl" <<'EOF'
import json, sys
a, b, c = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
assert a == b and a[0] != c[0], (a, b, c)
EOF

# Errors: one message, exit 2.
expect 2 "--micro-batch 3 rows per replica x dp=1 = 3 windows a micro-step, which does not divide --global-batch 4" -- \
    "$HP" train $M $D --micro-batch 3
expect 2 "not both" -- "$HP" train $M $D --input $M/forward_io.safetensors
expect 2 "token 100 (byte offset 200) is 128, outside the vocabulary [0, 128)" -- \
    "$HP" train $M ${D/f.bin/bad.bin}
expect 2 "fewer than one window of --seq 15" -- "$HP" train $M ${D/f.bin/short.bin}
expect 2 "31 bytes is not a whole number of uint16 tokens" -- "$HP" train $M ${D/f.bin/odd.bin}
expect 2 "--data-dtype expects uint16 or uint32, got 'int8'" -- "$HP" train $M $D --data-dtype int8
expect 2 "--schedule expects constant, linear or cosine" -- "$HP" train $M ${D/cosine/step}
expect 2 "--data needs --seq" -- "$HP" train $M --data "$WORK/f.bin" --global-batch 4
expect 2 "--eval-data and --eval-every go together" -- "$HP" train $M $D --eval-data "$WORK/e.bin"
expect 2 "go with --data" -- "$HP" train $M --input $M/forward_io.safetensors --seq 4
expect 2 "--min-lr 0.01 is above --lr 0.001" -- "$HP" train $M ${D/--min-lr 1e-4/--min-lr 1e-2}
expect 2 "--log-json" -- "$HP" train $M $D --log-json "$WORK/f.bin"
check "the data file was not overwritten" test "$(stat -c %s "$WORK/f.bin")" = 386
expect 2 "token 100" -- $MPI -np 2 "$HP" train $M ${D/f.bin/bad.bin} --dp 2
# issue 36 T12: a run that cannot change the weights is said (lr 0 on every step: --grad-out may be its purpose) or
# refused (rows of one token score nothing, so a step would only decay the weights)
expect 0 "warning: train: every step's learning rate is 0 (--schedule cosine over --steps 1 ends at --min-lr 0 on its only step)" -- \
    "$HP" train $M --data "$WORK/f.bin" --seq 15 --global-batch 4
expect 0 "every step's learning rate is 0 (--schedule linear over --steps 1" -- \
    "$HP" train $M --data "$WORK/f.bin" --seq 15 --global-batch 4 --schedule linear
out=$("$HP" train $M --data "$WORK/f.bin" --seq 15 --global-batch 4 --steps 2 2>&1)
check "2 cosine steps: no lr-0 warning" bash -c '! grep -q "learning rate is 0" <<<"$1"' _ "$out"
python3 - "$WORK/one.safetensors" <<'PY'
import json, struct, sys
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [2, 1], "data_offsets": [0, 16]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<2q", 3, 4))
PY
expect 2 "one.safetensors: its rows are 1 token long, so no position is scored" -- \
    "$HP" train $M --input "$WORK/one.safetensors" --out "$WORK/never"
check "rows of one token: no output" test ! -e "$WORK/never"
expect 2 "rows of 1 ids score no position" -- "$HP" train $M --data "$WORK/one.safetensors" --seq 1 --global-batch 2 --steps 2
finish

# run / validate / cost token inputs (docs/run.md, "Inputs"): a token stream (uint16 and uint32) cut by --seq and
# --batch, --ids, and --random-input each give byte-identical outputs (logits, loss, routed experts) to the
# safetensors input_ids holding the same ids, at one process and under mpirun -np 2; the random ids are those the
# documented splitmix64 rule gives (recomputed here independently); every bad form exits 2 naming the cause.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
# From each golden's input_ids [B, S]: the ids as text, and as uint16 / uint32 streams with 5 extra tokens (the
# rest of a stream is not read); the splitmix64 ids of --random-input 2,16 --seed 7 (vocab 128) as safetensors.
python3 - "$WORK" $F/llama/forward_io.safetensors $F/qwen3_moe/forward_io.safetensors <<'PY'
import json, struct, sys
w = sys.argv[1]
def read_ids(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    t = h["input_ids"]; o = t["data_offsets"]; raw = b[8 + n + o[0]:8 + n + o[1]]
    assert t["dtype"] == "I64"
    return t["shape"], list(struct.unpack("<%dq" % (len(raw) // 8), raw))
def st(path, B, S, ids):
    h = json.dumps({"input_ids": {"dtype": "I64", "shape": [B, S], "data_offsets": [0, 8 * B * S]}}).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%dq" % len(ids), *ids))
for name, path in (("llama", sys.argv[2]), ("moe", sys.argv[3])):
    (B, S), ids = read_ids(path)
    open(f"{w}/{name}.shape", "w").write(f"{B} {S}\n")
    open(f"{w}/{name}.ids", "w").write(";".join(",".join(str(v) for v in ids[r * S:(r + 1) * S]) for r in range(B)))
    open(f"{w}/{name}.u16", "wb").write(struct.pack("<%dH" % (B * S + 5), *ids, 1, 2, 3, 4, 5))
    open(f"{w}/{name}.u32", "wb").write(struct.pack("<%dI" % (B * S + 5), *ids, 1, 2, 3, 4, 5))
M = (1 << 64) - 1
def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return state, z ^ (z >> 31)
s, r = 7, []
for _ in range(2 * 16):
    s, z = splitmix64(s)
    r.append(z % 128)
st(w + "/random7.st", 2, 16, r)
# a stream with token 200 (outside llama's vocabulary of 128) at token 3, and one of an odd byte count
open(w + "/bad.u16", "wb").write(struct.pack("<6H", 1, 2, 3, 200, 4, 5))
open(w + "/odd.u16", "wb").write(b"\x01\x00\x02")
PY
same() { cmp -s "$1" "$2"; }
differ() { ! cmp -s "$1" "$2"; }
for name in llama moe; do
    G=$F/llama; [ $name = moe ] && G=$F/qwen3_moe
    read -r B S <"$WORK/$name.shape"
    "$HP" run $G --input $G/forward_io.safetensors --output "$WORK/$name.ref.st" 2>/dev/null
    expect 0 "loss" -- "$HP" run $G --ids "$(cat "$WORK/$name.ids")" --output "$WORK/$name.ids.st"
    check "$name: --ids = input_ids" same "$WORK/$name.ref.st" "$WORK/$name.ids.st"
    expect 0 "loss" -- "$HP" run $G --input "$WORK/$name.u16" --seq $S --batch $B --output "$WORK/$name.u16.st"
    check "$name: uint16 stream = input_ids" same "$WORK/$name.ref.st" "$WORK/$name.u16.st"
    expect 0 "loss" -- "$HP" run $G --input "$WORK/$name.u32" --data-dtype uint32 --seq $S --batch $B \
        --output "$WORK/$name.u32.st"
    check "$name: uint32 stream = input_ids" same "$WORK/$name.ref.st" "$WORK/$name.u32.st"
    # one row (the default --batch) is the first S tokens: not the two-row output
    expect 0 "over $((S - 1)) positions" -- "$HP" run $G --input "$WORK/$name.u16" --seq $S --output "$WORK/$name.r1.st"
    check "$name: --batch defaults to one row" differ "$WORK/$name.ref.st" "$WORK/$name.r1.st"
done
grep -q "moe.0.topk_idx" "$WORK/moe.ids.st" || { echo "FAIL: run --output lacks moe.0.topk_idx"; FAILED=$((FAILED + 1)); }
# --random-input: the documented ids (recomputed in Python above), the same on every run; another seed differs.
"$HP" run $F/llama --input "$WORK/random7.st" --output "$WORK/rand.ref.st" 2>/dev/null
expect 0 "loss" -- "$HP" run $F/llama --random-input 2,16 --seed 7 --output "$WORK/rand7.st"
check "--random-input 2,16 --seed 7 = splitmix64 ids" same "$WORK/rand.ref.st" "$WORK/rand7.st"
expect 0 "loss" -- "$HP" run $F/llama --random-input 2,16 --output "$WORK/rand0.st"
check "--seed 0 differs from --seed 7" differ "$WORK/rand7.st" "$WORK/rand0.st"
# validate and cost take the same inputs
expect 0 "loss: distributed" -- "$HP" validate $F/llama --ids "$(cat "$WORK/llama.ids")"
"$HP" cost $F/llama --input $F/llama/forward_io.safetensors --format json -o "$WORK/cost.ref.json" 2>/dev/null
for form in "--ids $(cat "$WORK/llama.ids")" "--input $WORK/llama.u16 --seq 16 --batch 2" "--random-input 2,16"; do
    rm -f "$WORK/cost.json"
    "$HP" cost $F/llama $form --format json -o "$WORK/cost.json" 2>/dev/null
    check "cost $form: the same batch and figures" same "$WORK/cost.ref.json" "$WORK/cost.json"
done
expect 0 '"batch": 3, "seq": 5' -- "$HP" cost $F/llama --random-input 3,5 --format json
# under mpirun (tp=2): each form equals the safetensors input at the same mesh
$MPI -np 2 "$HP" run $F/llama --input $F/llama/forward_io.safetensors --tp 2 --output "$WORK/np2.ref.st" \
    2>/dev/null </dev/null
expect 0 "loss" -- $MPI -np 2 "$HP" run $F/llama --input "$WORK/llama.u16" --seq 16 --batch 2 --tp 2 \
    --output "$WORK/np2.u16.st"
check "-np 2: stream = input_ids" same "$WORK/np2.ref.st" "$WORK/np2.u16.st"
expect 0 "loss" -- $MPI -np 2 "$HP" run $F/llama --ids "$(cat "$WORK/llama.ids")" --tp 2 --output "$WORK/np2.ids.st"
check "-np 2: --ids = input_ids" same "$WORK/np2.ref.st" "$WORK/np2.ids.st"
out=$($MPI -np 2 "$HP" run $F/llama --ids "1,2;3" --tp 2 2>&1 </dev/null); rc=$?
check "-np 2: a ragged --ids exits 2" [ $rc -eq 2 ]
check "-np 2: the error printed once" [ "$(grep -c 'row 2 has 1 id, row 1 has 2' <<<"$out")" -eq 1 ]

# ---- bad forms: exit 2 with the cause, no output file ----
L=$F/llama
while IFS='|' read -r needle args; do
    eval "set -- $args"
    expect 2 "$needle" -- "$HP" run $L "$@" --output "$WORK/never.st"
done <<LIST
--ids is empty|--ids ''
row 2 has 1 id, row 1 has 3; every row must be the same length|--ids '1,2,3;4'
row 1, column 2: 'x' is not a token id|--ids '1,x,3'
row 2, column 1: 128 is outside the vocabulary [0, 128)|--ids '1;128'
row 1, column 1: -1 is outside the vocabulary|--ids '-1'
99999999999999999999 is outside the vocabulary|--ids '99999999999999999999'
row 1, column 2 is empty|--ids '1,,2'
row 2, column 1 is empty|--ids '1;'
'/' after 1 is neither ',' nor ';'|--ids '1/2'
B (the rows) must be in [1,|--random-input 0,4
S (the tokens per row) must be in [1,|--random-input 2,-3
expected B,S|--random-input 2
expected B,S|--random-input 2,x
B (the rows) must be in [1,|--random-input 99999999999,2
2147483647 rows of 2147483647 tokens overflow|--random-input 2147483647,2147483647
--ids and --random-input are two inputs|--ids 1 --random-input 1,1
--input and --ids are two inputs|--input $L/forward_io.safetensors --ids 1
--input and --random-input are two inputs|--input $WORK/llama.u16 --seq 4 --random-input 1,1
missing the input: --input IDS.safetensors|
--seed belongs to --random-input|--ids 1 --seed 3
--ids carries its own shape; --seq and --batch cut a token stream|--ids 1 --seq 2
--random-input carries its own shape|--random-input 1,2 --batch 2
--batch with --input needs --seq S|--input $WORK/llama.u16 --batch 2
holds input_ids [B, S] of its own|--input $L/forward_io.safetensors --seq 4
--data-dtype belongs to a token stream|--ids 1 --data-dtype uint32
--data-dtype expects uint16 or uint32|--input $WORK/llama.u16 --seq 4 --data-dtype int8
--seq expects an integer in [1,|--input $WORK/llama.u16 --seq 0
--batch expects an integer in [1,|--input $WORK/llama.u16 --seq 4 --batch -1
give --seq S to cut it into rows|--input $WORK/llama.u16
fewer than --batch 3 rows of --seq 16 (48 tokens)|--input $WORK/llama.u16 --seq 16 --batch 3
token 3 (byte offset 6) is 200, outside the vocabulary [0, 128)|--input $WORK/bad.u16 --seq 3 --batch 2
3 bytes is not a whole number of uint16 tokens|--input $WORK/odd.u16 --seq 1
LIST
check "no output file after the bad forms" [ ! -e "$WORK/never.st" ]
expect 2 "give either --ids or --batch/--seq" -- "$HP" cost $L --ids 1,2 --seq 4
expect 2 "row 1, column 2: 500 is outside the vocabulary [0, 128)" -- "$HP" cost $L --ids 1,500
expect 2 "--seed belongs to an input" -- "$HP" cost $L --seed 2
expect 2 "--ids and --random-input are two inputs" -- "$HP" validate $L --ids 1 --random-input 1,1
finish

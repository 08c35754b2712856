# train across pipeline stages (docs/pipeline.md): --pp with the 1f1b, gpipe and interleaved schedules gives the
# gradients, parameters and losses of the same inner mesh without the pipeline (one process when the inner mesh is
# one rank) — bit for bit, except a tied embedding, whose two stages' gradients are summed in another order —
# alone and composed with tp, cp, dp with ZeRO-1 and tp x ep; a checkpoint resumes bit for bit and refuses another
# pp by name; the stream's bytes and the activations kept follow the schedule; a rank killed mid-step ends the job.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
python3 -c 'import random, struct, sys
random.seed(0)
open(sys.argv[1], "wb").write(struct.pack("<4000H", *[random.randrange(100) for _ in range(4000)]))' "$WORK/tok.bin"
D="--data $WORK/tok.bin --seq 16 --steps 2 --schedule constant"

close() { # A B TOL: two safetensors files' tensors (same names) within TOL of each tensor's largest value
    python3 - "$@" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; out[k] = struct.unpack("<%df" % ((e - s) // 4), d[s:e])
    return out
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if set(a) != set(b): print("names differ:", sorted(set(a) ^ set(b))); sys.exit(1)
for k in a:
    scale = max(abs(x) for x in a[k]) or 1.0
    d = max(abs(x - y) for x, y in zip(a[k], b[k]))
    if d > tol * scale: print(k, "differs by", d, "of", scale); sys.exit(1)
PY
}

n=0
same() { # FAMILY INNER_NP "INNER FLAGS" NP "PIPELINE FLAGS" GB MB TOL
    local fam=$1 inp=$2 inner=$3 np=$4 ppf=$5 gb=$6 mb=$7 tol=$8 G=$F/$1
    n=$((n + 1))
    local a="$WORK/a$n" b="$WORK/b$n"
    IFS=' ' read -r -a fi <<<"$inner"
    IFS=' ' read -r -a fp <<<"$ppf"
    expect 0 "" -- $MPI -np $inp "$HP" train $G $D --global-batch $gb --micro-batch $mb "${fi[@]}" \
        --grad-out "$a.safetensors" --out "$a"
    expect 0 "" -- $MPI -np $np "$HP" train $G $D --global-batch $gb --micro-batch $mb "${fi[@]}" "${fp[@]}" \
        --grad-out "$b.safetensors" --out "$b"
    check "$fam $inner $ppf, $((gb / mb)) micro-batches: the gradients and losses" close "$a.safetensors" "$b.safetensors" $tol
    check "$fam $inner $ppf: the parameters after two steps" close "$a/model.safetensors" "$b/model.safetensors" $tol
}
# every family, pp=2 with 1f1b over 2 micro-batches: bit for bit
for fam in llama mistral qwen3 qwen3_moe mixtral qwen2_moe deepseek_v3 glm4_moe gpt_oss; do
    same $fam 1 "" 2 "--pp 2" 4 2 0
done
same qwen2 1 "" 2 "--pp 2" 4 2 1e-6 # tied: the embedding's and the head's gradients summed across two stages
# the schedules and the micro-batch counts
same llama 1 "" 2 "--pp 2 --pp-schedule gpipe" 4 1 0
same llama 1 "" 2 "--pp 2" 4 4 0
same qwen3 1 "" 4 "--pp 4" 4 1 0                                       # pp=4: two stages of the embedding alone
same qwen3 1 "" 4 "--pp 4 --pp-schedule gpipe" 4 2 0
same qwen2_moe 1 "" 2 "--pp 2 --pp-virtual 2" 4 1 0                    # interleaved (the default with virtual)
same deepseek_v3 1 "" 2 "--pp 2 --pp-virtual 2 --pp-schedule interleaved" 4 2 0
# composed with the other axes: the same inner mesh's numbers
same llama 2 "--tp 2" 4 "--pp 2" 4 1 0
same qwen3 2 "--dp 2 --zero 1" 4 "--pp 2" 4 1 0
same mistral 2 "--cp 2" 4 "--pp 2" 4 2 0
same mixtral 2 "--tp 2 --ep 2 --ep-compute suggested" 4 "--pp 2" 4 2 0

# the stream's bytes and the kept activations: llama's block is [1, 17, 64] f32 (4,352 bytes); 4 micro-batches of
# 1f1b: each rank sends or receives it 8 times (forward and backward); stage 0 keeps min(2, 4) = 2 micro-batches'
# layer input in flight, stage 1 one micro-batch's layer input and final-norm input
G=$F/llama
expect 0 "" -- $MPI -np 2 "$HP" train $G $D --global-batch 4 --micro-batch 1 --pp 2 --stats-json "$WORK/s.json"
check "p2p bytes and the activations kept in flight" python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
ok = [x["p2p_bytes"] for x in r] == [8 * 4352] * 2 and [x["p2p_calls"] for x in r] == [8, 8] and \
     [x["saved_bytes"] for x in r] == [2 * 4352, 2 * 4352]
print([(x["p2p_bytes"], x["p2p_calls"], x["saved_bytes"]) for x in r]) if not ok else None
sys.exit(0 if ok else 1)' "$WORK/s.json"

# cost --mode train predicts the same point-to-point bytes and calls, and the same activations kept in flight, on
# every rank (the schedule's in-flight counts)
cost_same() { # FAMILY NP GB MB FLAGS...
    local fam=$1 np=$2 gb=$3 mb=$4
    shift 4
    n=$((n + 1))
    expect 0 "" -- $MPI -np $np "$HP" train $F/$fam $D --global-batch $gb --micro-batch $mb "$@" \
        --stats-json "$WORK/t$n.json"
    expect 0 "" -- "$HP" cost $F/$fam --mode train --batch $gb --seq 17 --micro-batch $mb "$@" --format json \
        -o "$WORK/c$n.json"
    check "$fam $*, $gb/$mb: cost's p2p bytes, calls and kept activations are train's on every rank" python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))["ranks"]; c = json.load(open(sys.argv[2]))["ranks"]
key = lambda r: (r["p2p_bytes"], r["p2p_calls"], r["saved_bytes"])
ok = [key(r) for r in t] == [key(r) for r in c]
print("train", [key(r) for r in t], "cost", [key(r) for r in c]) if not ok else None
sys.exit(0 if ok else 1)' "$WORK/t$n.json" "$WORK/c$n.json"
}
cost_same llama 2 4 1 --pp 2
cost_same llama 2 4 2 --pp 2 --pp-schedule gpipe
cost_same qwen3 4 4 1 --pp 4
cost_same qwen2 4 4 1 --pp 2 --dp 2 --zero 1
cost_same mistral 4 4 2 --pp 2 --cp 2
cost_same qwen2_moe 2 4 1 --pp 2 --pp-virtual 2

# a checkpoint resumes bit for bit; another pp is refused by name
G=$F/qwen3_moe
R="--data $WORK/tok.bin --seq 16 --global-batch 4 --micro-batch 1 --steps 4"
expect 0 "" -- $MPI -np 2 "$HP" train $G $R --pp 2 --out "$WORK/r1" --save-every 4
expect 0 "" -- $MPI -np 2 "$HP" train $G $R --pp 2 --out "$WORK/r2" --save-every 2 --stop-after 2
cp -r "$WORK/r2" "$WORK/r3"
expect 0 "" -- $MPI -np 2 "$HP" train $G $R --pp 2 --out "$WORK/r2" --save-every 2 --resume "$WORK/r2"
check "resumed under the pipeline: the uninterrupted run's parameters to the byte" \
    cmp -s "$WORK/r1/step-4/model.safetensors" "$WORK/r2/step-4/model.safetensors"
expect 2 "saved under pipeline parallelism pp=2, where this run has pp=1" -- \
    $MPI -np 2 "$HP" train $G $R --dp 2 --out "$WORK/r3" --save-every 2 --resume "$WORK/r3"

# refusals: exit 2 with the reason
G=$F/llama
expect 2 "--pp-schedule interleaved runs virtual stages" -- \
    $MPI -np 2 "$HP" train $G $D --global-batch 4 --micro-batch 1 --pp 2 --pp-schedule interleaved
expect 2 "not a multiple of it" -- \
    $MPI -np 2 "$HP" train $F/qwen2_moe $D --global-batch 3 --micro-batch 1 --pp 2 --pp-virtual 2
expect 2 "--pp-schedule expects 1f1b, gpipe or interleaved" -- "$HP" train $G $D --global-batch 4 --pp-schedule zb
expect 0 "--pp-schedule has no effect" -- "$HP" train $G $D --global-batch 2 --pp-schedule gpipe

# kill -9 of one rank in the middle of a pipeline step: the job ends (nothing hangs)
( timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$HP" train $G --data "$WORK/tok.bin" --seq 16 \
    --global-batch 8 --micro-batch 1 --steps 100000 --pp 2 >"$WORK/kill.log" 2>&1; echo $? >"$WORK/kill.rc" ) &
job=$!
for _ in $(seq 100); do grep -q "step 3/" "$WORK/kill.log" 2>/dev/null && break; sleep 0.1; done
victim=$(pgrep -f "hyperpar train $G --data $WORK/tok.bin" | tail -1)
[ -n "$victim" ] && kill -9 "$victim"
wait $job
check "a rank killed mid-step ends the job, not by the timeout (rc $(cat "$WORK/kill.rc"))" \
    test "$(cat "$WORK/kill.rc")" != 124 -a "$(cat "$WORK/kill.rc")" != 0
finish

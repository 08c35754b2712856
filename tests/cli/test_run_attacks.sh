# Careless and hostile use of run's and bench's newest paths (docs/reliability.md):
# - a non-finite logit that first appears in a later row chunk of the chunked head and loss (rows > 1024) is
#   reported exactly as the run that takes the whole logits (--output) reports it: exit 3, the same message
#   naming lm_head and the position, at 1 process, a batch whose chunks cross rows, tp 2 (the bad vocabulary
#   entry on tp rank 1) and dp 2; nothing written;
# - the chunked loss equals the whole-logits loss to the bit at T = 1, 1023, 1024, 1025, 2049, for a batch whose
#   chunks cross rows under tp 2 with and without SP, cp 2, and MoE models past 1024 tokens (qwen3_moe,
#   deepseek_v3, mixtral over tp 2 with ep 2); a vocabulary tp does not divide is refused once (exit 2);
# - two outputs that are one file yet to be made (o.st and ./o.st) are refused; a failed --output write leaves
#   no --stats-json; folders, missing folders and inputs as outputs are refused (exit 2); a --compare reference
#   that is missing, not safetensors or of another shape is refused before the forward;
# - token inputs that are empty, truncated, of another dtype, negative or past the vocabulary (exit 2);
# - bench run / bench moe with bad counts, formats, presets and meshes (exit 2), and a batch this machine cannot
#   hold refused with the bytes before any allocation (exit 2, never killed for memory), and so is run's;
# - HP_GEMM set to anything but onednn or hyperpar is refused (exit 2); HP_BENCH_PYTHON that cannot run says so.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2"
export TMPDIR="$WORK"
"$HP" gen --family llama --out nf --layers 1 --hidden 64 --intermediate 128 --vocab 256 >/dev/null 2>&1
"$HP" gen --family llama --out l --layers 1 --hidden 64 --intermediate 128 --vocab 250 >/dev/null 2>&1
check "the models are generated" test -f nf/model.safetensors -a -f l/model.safetensors
python3 - <<'PY'
import json, struct
def st_write(path, tensors, cut=0):
    hdr, data = {}, b""
    for name, (dt, shape, raw) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    b = struct.pack("<Q", len(h)) + h + data
    open(path, "wb").write(b[:len(b) - cut])
def ids(path, B, S, bad):
    v = [(i * 37 + 11) % 255 for i in range(B * S)]
    v[bad] = 255  # the one token whose hidden state overflows the head
    st_write(path, {"input_ids": ("I64", [B, S], struct.pack("<%dq" % (B * S), *v))})
ids("late.st", 1, 2100, 1500)        # the second chunk's row 476
ids("late2.st", 2, 1100, 1100 + 500)  # row 1600 of the flattened batch: a chunk that crosses the rows
# Token 255's embedding is all channel 0, so the final norm gives it 8 x norm[0] = 2 there and every other
# token far less; lm_head row 200 is 3e38 x channel 0: only position 1500 (2 x 3e38) overflows to +Inf.
p = "nf/model.safetensors"
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
def put(name, idx, vals):
    off = 8 + n + h[name]["data_offsets"][0] + 4 * idx
    b[off:off + 4 * len(vals)] = struct.pack("<%df" % len(vals), *vals)
put("model.embed_tokens.weight", 255 * 64, [1e6] + [0.0] * 63)
put("model.norm.weight", 0, [0.25])
put("lm_head.weight", 200 * 64, [3e38] + [0.0] * 63)
open(p, "wb").write(b)
st_write("neg.st", {"input_ids": ("I64", [1, 4], struct.pack("<4q", 1, 2, -7, 3))})
st_write("past.st", {"input_ids": ("I64", [1, 4], struct.pack("<4q", 1, 2, 250, 3))})
st_write("f32.st", {"input_ids": ("F32", [1, 4], struct.pack("<4f", 1, 2, 3, 4))})
st_write("cut.st", {"input_ids": ("I64", [1, 4], struct.pack("<4q", 1, 2, 3, 4))}, cut=8)
st_write("empty.st", {"input_ids": ("I64", [0, 4], b"")})
open("odd.bin", "wb").write(struct.pack("<100H", *range(100)) + b"\x01")
open("big.bin", "wb").write(struct.pack("<100H", *([5] * 50 + [300] + [5] * 49)))
open("empty.bin", "wb").close()
PY

# ---- a non-finite logit first seen in a later chunk: the chunked run's verdict is the whole-logits run's ----
# same_verdict NAME WHERE LAUNCH...: the chunked run (no --output) and the whole-logits run exit 3 with the same
# error line, naming lm_head at WHERE; neither writes anything.
same_verdict() {
    local name="$1" where="$2"
    shift 2
    local a b ra rb
    "$@" --stats-json s.json >a.log 2>&1 </dev/null
    ra=$?
    "$@" --output o.st --stats-json s.json >b.log 2>&1 </dev/null
    rb=$?
    a=$(grep "hyperpar: error" a.log)
    b=$(grep "hyperpar: error" b.log)
    if [ "$ra" != 3 ] || [ "$rb" != 3 ] || [ "$a" != "$b" ] || ! grep -qF "lm_head is the first boundary whose output holds +Inf at $where" <<<"$a" || [ -e s.json ] || [ -e o.st ]; then
        echo "FAIL: $name: chunked exit $ra, whole exit $rb"; echo "  chunked: $a"; echo "  whole:   $b"
        ls s.json o.st 2>/dev/null
        FAILED=$((FAILED + 1)); return
    fi
    PASSED=$((PASSED + 1))
}
same_verdict "1 process, position 1500 of 2100" "[0, 1500, 200]" "$HP" run nf --input late.st
same_verdict "1 process, a chunk across rows" "[1, 500, 200]" "$HP" run nf --input late2.st
same_verdict "tp 2 (the entry on tp rank 1)" "[0, 1500, 200]" $MPI "$HP" run nf --input late.st --tp 2
same_verdict "tp 2 --loss-parallel" "[1, 500, 200]" $MPI "$HP" run nf --input late2.st --tp 2 --loss-parallel
same_verdict "dp 2" "[1, 500, 200]" $MPI "$HP" run nf --input late2.st --dp 2 --tp 1
# with the logits cut over the vocabulary (loss-parallel) the entry is seen by the tp rank holding it
expect 3 "on rank 1 of 2 (dp 0, cp 0, tp 1)" -- $MPI "$HP" run nf --input late.st --tp 2 --loss-parallel

# ---- the chunk edges: the logits-free loss is the whole-logits loss, to the bit ----
loss() { python3 -c 'import json, sys; print(repr(json.load(open(sys.argv[1]))["loss"]))' "$1"; }
# same_loss NAME LAUNCH...: the run without and with --output write the same loss
same_loss() {
    local name="$1"
    shift
    rm -f free.json taken.json
    "$@" --stats-json free.json >/dev/null 2>&1 </dev/null
    "$@" --output o.st --stats-json taken.json >/dev/null 2>&1 </dev/null
    rm -f o.st
    if [ ! -s free.json ] || [ ! -s taken.json ] || [ "$(loss free.json)" != "$(loss taken.json)" ]; then
        echo "FAIL: $name: loss $(loss free.json 2>&1 | tail -1) vs $(loss taken.json 2>&1 | tail -1)"
        FAILED=$((FAILED + 1)); return
    fi
    PASSED=$((PASSED + 1))
}
for T in 1 1023 1024 1025 2049; do same_loss "T = $T" "$HP" run l --random-input 1,$T; done
"$HP" run l --random-input 1,1 --stats-json one.json >/dev/null 2>&1
check "T = 1: no scored position, the loss is null" test "$(loss one.json)" = None
same_loss "batch 2 x 1025, tp 2" $MPI "$HP" run l --random-input 2,1025 --tp 2
# a vocabulary tp does not divide: the plan refuses it, once, naming the size (exit 2)
"$HP" gen --family llama --out l251 --layers 1 --hidden 64 --intermediate 128 --vocab 251 >/dev/null 2>&1
out=$($MPI "$HP" run l251 --random-input 2,1025 --tp 2 2>&1 </dev/null)
check "vocab 251 over tp 2: exit 2" test $? -eq 2
check "vocab 251 over tp 2: named once" test "$(grep -c "dim 0 of size 251 is not divisible by tp size 2" <<<"$out")" -eq 1
same_loss "batch 2 x 1025, tp 2 without SP" $MPI "$HP" run l --random-input 2,1025 --tp 2 --no-sequence-parallel
same_loss "1 x 2049, cp 2" $MPI "$HP" run l --random-input 1,2049 --cp 2 --tp 1
F="$TESTS/data/forward"
same_loss "qwen3_moe, 1 x 2049" "$HP" run "$F/qwen3_moe" --random-input 1,2049
same_loss "deepseek_v3, 2 x 1100" "$HP" run "$F/deepseek_v3" --random-input 2,1100
same_loss "mixtral, 2 x 1100, tp 2 ep 2" $MPI "$HP" run "$F/mixtral" --random-input 2,1100 --tp 2 --ep 2 --ep-compute suggested

# ---- outputs ----
mkdir -p dir
expect 2 "--stats-json and --output name the same file" -- "$HP" run l --random-input 1,8 --output new.st --stats-json ./new.st
check "the same file spelled twice: nothing written" test ! -e new.st
expect 2 "--stats-json and --output name the same file" -- "$HP" run l --random-input 1,8 --output new.st --stats-json dir/../new.st
expect 2 "is a folder, not a regular file" -- "$HP" run l --random-input 1,8 --stats-json dir
expect 2 "the folder 'missing/' does not exist" -- "$HP" run l --random-input 1,8 --output missing/o.st
expect 2 "the folder 'missing/' does not exist" -- "$HP" run l --random-input 1,8 --stats-json missing/s.json
expect 2 "is one of the inputs" -- "$HP" run l --input neg.st --stats-json neg.st
expect 1 "No space left on device" -- env HP_TEST_ENOSPC_AFTER=20000 "$HP" run l --random-input 1,30 --output o.st --stats-json s.json
check "a failed --output write leaves no --stats-json and no output" test ! -e s.json -a ! -e o.st
check "nothing partial in the folder" test -z "$(ls | grep -E '\.tmp\.')"

# a --compare reference that is missing, not safetensors or of another shape is refused before the forward:
# no statistics file, exit 2
echo garbage >garbage.st
"$HP" run l --random-input 1,8 --output ref18.st >/dev/null 2>&1
for ref in missing.st garbage.st ref18.st; do
    expect 2 "$ref" -- "$HP" run l --random-input 2,8 --compare $ref --stats-json s.json
    check "a bad reference $ref: no --stats-json" test ! -e s.json
done
expect 2 "ref18.st: needs 'logits' F32 [2, 8, 250] to compare with" -- "$HP" run l --random-input 2,8 --compare ref18.st
expect 2 "needs 'logits' F32 [2, 8, 250]" -- $MPI "$HP" run l --random-input 2,8 --compare ref18.st --tp 2

# ---- a batch this machine cannot hold: refused with the bytes before anything is allocated ----
expect 2 "--random-input 2147483647,1073741824 (its ids alone) needs" -- "$HP" run l --random-input 2147483647,1073741824
avail=$(awk '/MemAvailable/ {print $2}' /proc/meminfo) # KiB
if [ "${avail:-0}" -gt 0 ] && [ "$avail" -lt $((80 * 1024 * 1024)) ]; then # 64M tokens: 512 MiB of ids, 92 GiB of workspace
    expect 2 "run of l on a batch of 64 x 1000000 tokens needs 91.61 GiB of memory per rank, but this machine has" -- \
        "$HP" run l --random-input 64,1000000
fi

# ---- token inputs ----
expect 2 "input_ids[0][2] = -7 is outside the vocabulary [0, 250)" -- "$HP" run l --input neg.st
expect 2 "input_ids[0][2] = 250 is outside the vocabulary [0, 250)" -- "$HP" run l --input past.st
expect 2 "'input_ids' is F32 with 2 dims; expected I64 (or I32) [B, S]" -- "$HP" run l --input f32.st
expect 2 "the file looks truncated" -- "$HP" run l --input cut.st
expect 2 "it needs at least one token" -- "$HP" run l --input empty.st
expect 2 "holds 0 uint16 tokens, fewer than --batch 1 rows of --seq 10" -- "$HP" run l --input empty.bin --seq 10
expect 2 "201 bytes is not a whole number of uint16 tokens" -- "$HP" run l --input odd.bin --seq 50
expect 2 "token 50 (byte offset 100) is 300, outside the vocabulary [0, 250)" -- "$HP" run l --input big.bin --seq 100
expect 2 "--data-dtype expects uint16 or uint32, got 'float32'" -- "$HP" run l --input odd.bin --seq 50 --data-dtype float32

# ---- bench run / bench moe ----
SMALL="--preset llama-3-8b --hidden 64 --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --layers 1"
export HP_BENCH_PYTHON=false
expect 2 "--tokens expects an integer in [1, 65536], got '0'" -- "$HP" bench run $SMALL --tokens 0 --vocab 512
expect 2 "--tokens expects an integer in [1, 65536], got '-5'" -- "$HP" bench run $SMALL --tokens -5
expect 2 "--reps expects an integer" -- "$HP" bench run $SMALL --tokens 4 --reps 0
expect 2 "--threads expects an integer in [1, 1024], got '0'" -- "$HP" bench run $SMALL --tokens 4 --threads 0
expect 2 "--vocab expects an integer in [1, 1048576], got '0'" -- "$HP" bench run $SMALL --tokens 4 --vocab 0
expect 2 "--format expects text or json, got 'yaml'" -- "$HP" bench run $SMALL --tokens 4 --format yaml
expect 2 "unknown preset 'nope'" -- "$HP" bench run --preset nope --tokens 4
expect 2 "has 3 ranks but 2 processes run it" -- $MPI "$HP" bench run $SMALL --tokens 4 --tp 3
expect 0 "vocab 1" -- "$HP" bench run $SMALL --tokens 4 --vocab 1 --reps 1
expect 2 "of memory per rank, but this machine has" -- "$HP" bench run $SMALL --vocab 512 --tokens 65536 --batch 65536
check "a refused bench run leaves no temporary checkpoint" test -z "$(ls | grep hp-bench-run)"
# refused before the checkpoint is written (cost's figures need only the config): a TMPDIR where no folder can be
# made is never reached (a run that fits fails there: test_bench_run.sh)
expect 2 "of memory per rank, but this machine has" -- \
    env TMPDIR="$WORK/absent" "$HP" bench run $SMALL --vocab 512 --tokens 65536 --batch 65536
expect 2 "bench train of llama-3-8b at batch 65536 x 65536 tokens" -- \
    env TMPDIR="$WORK/absent" "$HP" bench train $SMALL --vocab 512 --tokens 65536 --batch 65536
expect 2 "--tokens expects an integer in [1, 1048576], got '0'" -- "$HP" bench moe --preset qwen3-30b-a3b --tokens 0
expect 2 "--reps expects an integer" -- "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --reps 0
if [ "${avail:-0}" -gt 0 ] && [ "$avail" -lt $((300 * 1024 * 1024)) ]; then # KiB: the 1M-token layer needs > 300 GiB
    expect 2 "bench moe of qwen3-30b-a3b at 1048576 tokens (2 of 128 experts held, f32) needs" -- \
        "$HP" bench moe --preset qwen3-30b-a3b --tokens 1048576 --ep 64
fi

# ---- the environment ----
expect 2 "HP_GEMM='garbage' in the environment is neither 'onednn' nor 'hyperpar'" -- env HP_GEMM=garbage "$HP" run l --random-input 1,8
expect 2 "HP_GEMM='oneDNN'" -- env HP_GEMM=oneDNN "$HP" bench run $SMALL --vocab 512 --tokens 4 --reps 1
expect 0 "" -- env HP_GEMM=onednn "$HP" run l --random-input 1,8
expect 0 "" -- env HP_GEMM= "$HP" run l --random-input 1,8
expect 0 "torch cannot be imported: cannot run $WORK/none/python: No such file or directory" -- \
    env HP_BENCH_PYTHON="$WORK/none/python" "$HP" bench run $SMALL --vocab 512 --tokens 4 --reps 1
expect 0 "torch cannot be imported: /bin/false exited with status 1 on 'import torch'" -- \
    env HP_BENCH_PYTHON=/bin/false "$HP" bench run $SMALL --vocab 512 --tokens 4 --reps 1
expect 0 "torch cannot be imported: cannot run $WORK/none/python: No such file or directory" -- \
    env HP_BENCH_PYTHON="$WORK/none/python" "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --dtype bf16 --reps 1
printf '#!/bin/sh\necho "ModuleNotFoundError: No module named '"'"'torch'"'"'" >&2\nexit 1\n' >notorch
chmod +x notorch
expect 0 "./notorch exited with status 1 on 'import torch': ModuleNotFoundError: No module named 'torch'" -- \
    env HP_BENCH_PYTHON=./notorch "$HP" bench run $SMALL --vocab 512 --tokens 4 --reps 1
finish

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
expect 2 "is not empty; choose another --out or pass --force" -- "$HP" train $G --input $I --out "$WORK/mine"
expect 2 "is not empty and was not written by hyperpar" -- "$HP" train $G --input $I --out "$WORK/mine" --force
check "the user's folder is untouched" test "$(ls -A "$WORK/mine")" = "notes.txt" -a "$(cat "$WORK/mine/notes.txt")" = keep
expect 2 "pass --force" -- "$HP" train $G --input $I --out "$WORK/three"
before=$(md5sum <"$WORK/three/model.safetensors")
expect 0 "train: wrote" -- "$HP" train $G --input $I --out "$WORK/three" --force
check "--force replaced the earlier output" test "$(md5sum <"$WORK/three/model.safetensors")" != "$before"
echo x >"$WORK/three/extra.txt"
expect 2 "holds 'extra.txt', which hyperpar did not write" -- "$HP" train $G --input $I --out "$WORK/three" --force
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
# MoE models train: mixtral (per-expert, experts cut over tp), qwen3_moe (batched) with TP-extend-EP and ZeRO-1
# over dp, against PyTorch's gradients and step.
for run in "mixtral 1" "mixtral 2 --tp 2" "qwen3_moe 2 --tp 2 --ep 2 --overrides data/overrides/qwen3_moe_ep.yaml" \
    "qwen3_moe 4 --dp 2 --tp 2 --ep 2 --zero 1 --overrides data/overrides/qwen3_moe_ep.yaml"; do
    set -- $run
    fam=$1 np=$2
    shift 2
    tag=$fam.moe$np$(tr -d ' -./' <<<"$*")
    expect 0 "train: step 1/1 loss" -- $MPI -np $np "$HP" train $F/$fam --input $F/$fam/forward_io.safetensors $OPT "$@" \
        --grad-out "$WORK/$tag.g.st" --out "$WORK/$tag"
    check "$fam $*: gradients and the AdamW step equal PyTorch's" check_out $fam $tag
done
set -- # the script's own arguments are not used below
# --freeze: the frozen tensors get no gradient and keep their values; a part of an MoE block cannot be frozen.
expect 0 "train: step 1/1 loss" -- "$HP" train $G --input $I $OPT --freeze 'model.norm.*' --grad-out "$WORK/fz.g.st" \
    --out "$WORK/fz"
python3 - "$WORK/fz.g.st" "$WORK/fz/model.safetensors" "$G/model.safetensors" <<'PY' >"$WORK/fz.log" 2>&1
import json, struct, sys
def hdr(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return b, 8 + n, h
g = hdr(sys.argv[1])[2]
assert "grad.model.norm.weight" not in g and "grad.model.layers.0.input_layernorm.weight" in g, sorted(g)[:5]
(ob, obase, oh), (ib, ibase, ih) = hdr(sys.argv[2]), hdr(sys.argv[3])
def data(b, base, h, k):
    lo, hi = h[k]["data_offsets"]; return b[base + lo:base + hi]
assert data(ob, obase, oh, "model.norm.weight") == data(ib, ibase, ih, "model.norm.weight"), "the frozen norm moved"
assert data(ob, obase, oh, "model.layers.0.input_layernorm.weight") != data(ib, ibase, ih, "model.layers.0.input_layernorm.weight")
PY
check "--freeze: no gradient, unchanged values; the others train" test $? = 0
expect 2 "does not freeze the tensors of an MoE block" -- "$HP" train $F/mixtral --input $F/mixtral/forward_io.safetensors \
    --freeze 'model.layers.0.block_sparse_moe.gate.*'
expect 2 "--zero" -- "$HP" train $G --input $I --zero 2
# The global gradient norm every step; --clip scales when it is exceeded (the same norm at 1 and 2 ranks).
expect 0 "grad-norm 4.26867 (clipped)" -- "$HP" train $G --input $I --clip 1
expect 0 "grad-norm 4.2686" -- $MPI -np 2 "$HP" train $G --input $I --tp 2 --clip 100
out=$("$HP" train $G --input $I --clip 100 2>&1)
check "a norm under --clip is not clipped" test "$(grep -c "grad-norm .*(clipped)" <<<"$out")" = 0 -a \
    "$(grep -c "grad-norm" <<<"$out")" = 1
expect 2 "--clip expects" -- "$HP" train $G --input $I --clip 0
# bf16 weights train on f32 master weights: the same first step as the checkpoint widened to f32.
"$HP" gen --family llama --out "$WORK/b16" --dtype bf16 --layers 2 --seed 3 >/dev/null 2>&1
mkdir -p "$WORK/b16f32" && cp "$WORK/b16/config.json" "$WORK/b16f32/"
python3 - "$WORK/b16/model.safetensors" "$WORK/b16f32/model.safetensors" "$WORK/b16.ids" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
out, hdr, off = [], {}, 0
for k in sorted(h, key=lambda k: h[k]["data_offsets"][0]):
    lo, hi = h[k]["data_offsets"]; raw = b[8 + n + lo:8 + n + hi]
    f32 = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2)) if h[k]["dtype"] == "BF16" else raw
    hdr[k] = {"dtype": "F32" if h[k]["dtype"] == "BF16" else h[k]["dtype"], "shape": h[k]["shape"], "data_offsets": [off, off + len(f32)]}
    out.append(f32); off += len(f32)
j = json.dumps(hdr).encode(); j += b" " * ((8 - len(j) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(j)) + j + b"".join(out))
ids = [(i * 29 + 5) % 128 for i in range(2 * 12)]; raw = struct.pack("<%dq" % len(ids), *ids)
j = json.dumps({"input_ids": {"dtype": "I64", "shape": [2, 12], "data_offsets": [0, len(raw)]}}).encode()
j += b" " * ((8 - len(j) % 8) % 8)
open(sys.argv[3], "wb").write(struct.pack("<Q", len(j)) + j + raw)
PY
for m in b16 b16f32; do
    expect 0 "train: step 1/1 loss" -- $MPI -np 2 "$HP" train "$WORK/$m" --input "$WORK/b16.ids" --tp 2 --steps 1 \
        --grad-out "$WORK/$m.g.st" --out "$WORK/$m.out"
done
python3 - "$WORK/b16.g.st" "$WORK/b16f32.g.st" "$WORK/b16.out/model.safetensors" "$WORK/b16f32.out/model.safetensors" \
    <<'PY' >"$WORK/b16.log" 2>&1
import json, struct, sys
def rd(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items() if v["dtype"] == "F32"}
for a, b in ((rd(sys.argv[1]), rd(sys.argv[2])), (rd(sys.argv[3]), rd(sys.argv[4]))):
    assert sorted(a) == sorted(b) and len(a) > 10
    for k in a:
        m = max(abs(x) for x in b[k]) or 1.0
        d = max(abs(x - y) for x, y in zip(a[k], b[k]))
        assert d <= 1e-6 * m + 1e-9, (k, d, m)
PY
check "bf16: the gradients and the f32 master weights equal the f32 checkpoint's" test $? = 0
# pad_token_id: transformers' embedding of every family is nn.Embedding(padding_idx = pad_token_id), so that
# row gets no gradient from it; the other rows are as without a pad token (llama is untied: its lm_head adds
# nothing to the embedding's gradient). The batch holds token 3 four times.
mkdir -p "$WORK/pad"
cp $G/model.safetensors "$WORK/pad/"
python3 - "$G/config.json" "$WORK/pad/config.json" "$WORK/pad.ids" <<'PY'
import json, struct, sys
c = json.load(open(sys.argv[1])); c["pad_token_id"] = 3; json.dump(c, open(sys.argv[2], "w"))
ids = [3, 9, 3, 17, 40, 3, 77, 5, 3, 12, 100, 1, 2, 64, 90, 8]
b = struct.pack("<16q", *ids); h = json.dumps({"input_ids": {"dtype": "I64", "shape": [2, 8], "data_offsets": [0, 128]}}).encode()
open(sys.argv[3], "wb").write(struct.pack("<Q", len(h)) + h + b)
PY
expect 0 "train: step 1/1 loss" -- "$HP" train $G --input "$WORK/pad.ids" --steps 1 --grad-out "$WORK/nopad.g.st"
expect 0 "train: step 1/1 loss" -- "$HP" train "$WORK/pad" --input "$WORK/pad.ids" --steps 1 --grad-out "$WORK/pad.g.st"
expect 0 "train: step 1/1 loss" -- $MPI -np 2 "$HP" train "$WORK/pad" --input "$WORK/pad.ids" --steps 1 --tp 2 \
    --grad-out "$WORK/pad2.g.st"
check "pad_token_id 3: its embedding row gets no gradient, every other row the same (1 process and tp=2)" \
    python3 - "$WORK/nopad.g.st" "$WORK/pad.g.st" "$WORK/pad2.g.st" <<'PY'
import json, struct, sys
def emb(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; v = json.loads(b[8:8 + n])["grad.model.embed_tokens.weight"]
    o, e = v["data_offsets"]; H = v["shape"][1]; f = struct.unpack("<%df" % ((e - o) // 4), b[8 + n + o:8 + n + e])
    return [f[r * H:(r + 1) * H] for r in range(v["shape"][0])]
a, b, c = (emb(p) for p in sys.argv[1:])
assert max(map(abs, a[3])) > 1e-6, "token 3's row has a gradient without a pad token"
assert max(map(abs, b[3])) == 0 and max(map(abs, c[3])) == 0, (max(map(abs, b[3])), max(map(abs, c[3])))
m = max(abs(x) for r in a for x in r)
for r in range(len(a)):
    if r != 3:
        assert max(abs(x - y) for x, y in zip(a[r], b[r])) <= 1e-6 * m, r
        assert max(abs(x - y) for x, y in zip(a[r], c[r])) <= 1e-5 * m, r
PY
expect 0 "--grad-out G" -- "$HP" train --help
expect 0 "train a checkpoint (dense or MoE)" -- "$HP" --help
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

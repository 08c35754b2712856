# A bf16 checkpoint trains on f32 master weights, as PyTorch trains the model loaded in float32: the forward reads
# the masters (exact compute), or under --compute bf16 what autocast reads (the products round them to bf16, the
# rest reads them as they are). After one step, the second step's loss (--grad-out) equals the loss `hyperpar run`
# computes from the first step's masters (--out, f32) with the same --compute, and not the loss of the masters
# rounded to bf16 (the stale reading issue 36 found: a bf16 copy made after the update) — at 1 process for dense
# and MoE families, and under tp=2 (norms under SP).
source "$(dirname "$0")/lib.sh"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
loss_of() { # G.safetensors I: the I-th loss of --grad-out, printed as train and run print it (%.7g)
    python3 - "$1" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
lo, hi = h["loss"]["data_offsets"]; l = struct.unpack("<%df" % ((hi - lo) // 4), b[8 + n + lo:8 + n + hi])
print("%.7g" % l[int(sys.argv[2])])
PY
}
python3 - "$WORK/ids.safetensors" <<'PY'
import json, struct, sys
ids = [(i * 7 + 3) % 128 for i in range(18)]
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [2, 9], "data_offsets": [0, 8 * 18]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<18q", *ids))
PY
I="$WORK/ids.safetensors"
near() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > float(sys.argv[3]) * abs(b))" "$@"; }
differs() { [ -n "$1" ] && ! near "$@"; }
OPT="--lr 1e-2 --schedule constant"
while read -r fam np flags; do
    tag=$fam.$np$(tr -d ' -' <<<"$flags")
    M="$WORK/$tag.m"
    "$HP" gen --family $fam --dtype bf16 --out "$M" >/dev/null 2>&1
    launch="" && [ "$np" -gt 1 ] && launch="$MPI -np $np"
    expect 0 "train: step 1/1 loss" -- $launch "$HP" train "$M" --input "$I" --steps 1 $OPT $flags --out "$WORK/$tag.o1"
    expect 0 "train: step 2/2 loss" -- $launch "$HP" train "$M" --input "$I" --steps 2 $OPT $flags --grad-out "$WORK/$tag.g"
    mkdir -p "$WORK/$tag.r1"
    python3 "$TESTS/cli/to_bf16.py" "$WORK/$tag.o1/model.safetensors" "$WORK/$tag.r1/model.safetensors"
    sed 's/"float32"/"bfloat16"/' "$WORK/$tag.o1/config.json" >"$WORK/$tag.r1/config.json"
    want=$(loss_of "$WORK/$tag.g" 1) # f32, as --grad-out stores it
    $launch "$HP" run "$WORK/$tag.r1" --input "$I" $flags >"$WORK/$tag.r1.log" 2>&1
    got=$(sed -n 's/^run: loss \([^ ]*\) over.*/\1/p' "$WORK/$tag.r1.log")
    check "$tag: the masters rounded to bf16 give another loss ($got)" differs "$got" "$want" 2e-6
    mkdir -p "$WORK/$tag.f"
    cp "$WORK/$tag.o1/model.safetensors" "$WORK/$tag.o1/config.json" "$WORK/$tag.f/"
    $launch "$HP" run "$WORK/$tag.f" --input "$I" $flags >"$WORK/$tag.f.log" 2>&1
    got=$(sed -n 's/^run: loss \([^ ]*\) over.*/\1/p' "$WORK/$tag.f.log")
    check "$tag: step 2's loss $want = run of the f32 masters ($got)" near "$got" "$want" 2e-6
done <<'LIST'
llama 1
qwen2 1
gpt_oss 1
qwen3_moe 1
deepseek_v3 1
llama 2 --tp 2
llama 1 --compute bf16
qwen3_moe 1 --compute bf16
LIST
finish

#!/usr/bin/env bash
# train_compare.sh — hyperpar train against the PyTorch reference (bench/train_ref.py), step by step.
#
#   bench/train_compare.sh [--steps N] [--quick] [--compute bf16 [--tol X]] [FAMILY ...]
#                                                              (default: the ten of tests/data/forward)
#
# For each family's tiny checkpoint (tests/data/forward/FAMILY; a bf16 one is compared as its f32 widening, since
# hyperpar's forward reads the bf16 rounding of its f32 masters), on one token file written here: the reference
# trains N steps (default 20) once, then `hyperpar train --log-json` runs the same flags at 1 process and under
# the meshes below, and every step's loss is compared: max |loss - ref| / |ref| over the steps, pass <= 1e-5.
# Prints one markdown row per family and mesh; exits 1 if any row fails, 2 on a usage or setup error.
# --compute bf16: both sides run hyperpar's BF16 mode (train_ref.py --compute bf16: every product's operands
# rounded to bf16). A rounding boundary crossed differently by a differently ordered f32 sum moves an operand by
# 2^-8, AdamW's first steps turn a tiny gradient's sign into a whole lr step and a router's near-tie into another
# expert, so the curves part by more than f32's; a row passes when it is no further from the bf16 reference than
# the f32 reference is (the "bf16 itself" column: reference exact vs reference bf16) — about half the rows do:
# over 20 steps the noise is as large as bf16's own effect, so this is a measurement, not a check of hyperpar
# (test_train_compute.sh checks step 1 closely) — or within --tol when given. The last column is the distance
# to torch.autocast's bf16 run.
# Needs python3 with torch (transformers if the family is not one bench/torch_model.py builds) and mpirun.
# HP (default build/hyperpar), PYTHON (python3) and MPIRUN ("mpirun --allow-run-as-root --oversubscribe")
# may be set. Flags of the run: FLAGS below; --quick runs only the first mesh of each list.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HP="${HP:-$ROOT/build/hyperpar}"
PYTHON="${PYTHON:-python3}"
MPIRUN="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}"
STEPS=20
QUICK=0
COMPUTE=exact
TOL=
FAMS=()
while (($#)); do
    case "$1" in
    --steps) STEPS="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --compute) COMPUTE="$2"; shift 2 ;;
    --tol) TOL="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "train_compare.sh: unknown option $1" >&2; exit 2 ;;
    *) FAMS+=("$1"); shift ;;
    esac
done
[[ $COMPUTE == exact || $COMPUTE == bf16 ]] || { echo "train_compare.sh: --compute expects exact or bf16" >&2; exit 2; }
[[ -n $TOL || $COMPUTE == bf16 ]] || TOL=1e-5
((${#FAMS[@]})) || FAMS=(llama mistral qwen2 qwen3 mixtral qwen2_moe qwen3_moe deepseek_v3 glm4_moe gpt_oss)
[[ -x "$HP" ]] || { echo "train_compare.sh: no hyperpar binary at $HP (build first, or set HP)" >&2; exit 2; }
"$PYTHON" -c 'import torch' 2>/dev/null || { echo "train_compare.sh: $PYTHON cannot import torch" >&2; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/hp-train-compare-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# 16-token windows of a 2001-token stream (125 windows), shuffled with seed 7, global batch 8 in two micro-batches:
# 20 steps read 160 windows, so the order crosses into a second epoch. Warmup, cosine decay to min-lr, clipping at
# 1 (the tiny models' norms are about 2, so every step clips), weight decay 0.1, beta2 0.95.
FLAGS="--seq 16 --global-batch 8 --steps $STEPS --lr 1e-3 --warmup 5 --schedule cosine \
--min-lr 1e-4 --clip 1.0 --weight-decay 0.1 --beta2 0.95 --seed 7"

# Each mesh: a label, the process count, the flags ("@EP" is the family's EP overrides file).
DENSE_MESHES="1 process|1|
1 process, no accumulation|1|--micro-batch 8
tp=2 (SP)|2|--tp 2
tp=2, no SP, loss-parallel|2|--tp 2 --no-sequence-parallel --loss-parallel
cp=2|2|--cp 2
dp=2, ZeRO-1|2|--dp 2 --zero 1
dp=2 x tp=2|4|--dp 2 --tp 2"
MOE_MESHES="1 process|1|
tp=2 (experts cut over tp)|2|--tp 2 --packed-fused
tp=2 x ep=2 (TP-extend-EP)|2|--tp 2 --ep 2 --overrides @EP
dp=2 x tp=2 x ep=2, ZeRO-1|4|--dp 2 --tp 2 --ep 2 --zero 1 --overrides @EP
ep=2 (axis)|2|--mesh dp=1,ep=2 --ep-axis --overrides @EP
dp=2 x ep=2 (axis), ZeRO-1|4|--mesh dp=2,ep=2 --ep-axis --zero 1 --overrides @EP"

# $1: model folder -> $2: the f32 copy (every floating tensor widened, config's dtype float32); tokens for $1's
# vocabulary into $3.
prepare() {
    "$PYTHON" - "$1" "$2" "$3" <<'EOF'
import json, os, random, struct, sys
sys.path.insert(0, os.path.join(os.environ["ROOT"], "bench"))
import torch, torch_model
src, dst, tok = sys.argv[1:]
os.makedirs(dst)
cfg = json.load(open(os.path.join(src, "config.json")))
cfg["torch_dtype"] = "float32"
cfg.pop("dtype", None)
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
t = torch_model.read_safetensors(os.path.join(src, "model.safetensors"))
head, blobs, off = {}, [], 0
for k, v in t.items():
    if v.is_floating_point():
        v = v.to(torch.float32)
    b = v.contiguous().numpy().tobytes() if v.numel() else b""
    head[k] = {"dtype": {torch.float32: "F32", torch.int64: "I64", torch.int32: "I32"}[v.dtype],
               "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for b in blobs:
        f.write(b)
V = cfg["vocab_size"]
r = random.Random(1)  # a learnable pattern with 30% noise
ids = [(i * 5 + i // 7) % V if r.random() < 0.7 else r.randrange(V) for i in range(2001)]
open(tok, "wb").write(struct.pack("<%dH" % len(ids), *ids))
EOF
}

# max relative loss difference of $2 against $1 (JSON lines), "-" if the step counts differ
maxrel() {
    "$PYTHON" - "$1" "$2" <<'EOF'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
print("%.2e" % max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) and a else "-")
EOF
}

export ROOT
fail=0
if [[ $COMPUTE == bf16 ]]; then
    echo "| family | mesh | max rel diff over $STEPS steps (--compute bf16) | | bf16 itself | vs torch.autocast bf16 |"
    echo "|---|---|---|---|---|---|"
else
    echo "| family | mesh | max rel diff over $STEPS steps | |"
    echo "|---|---|---|---|"
fi
for fam in "${FAMS[@]}"; do
    src="$ROOT/tests/data/forward/$fam"
    [[ -f "$src/config.json" ]] || { echo "train_compare.sh: no model $src" >&2; exit 2; }
    M="$WORK/$fam"
    prepare "$src" "$M" "$WORK/$fam.bin"
    D="--data $WORK/$fam.bin $FLAGS --compute $COMPUTE"
    # The EP overrides of the tests, less a capacity factor: one drops the slots past an expert's capacity by
    # design (deepseek_v3_ep.yaml's 1.25 drops some on this data), which the reference does not do.
    ov="$ROOT/tests/data/overrides/${fam}_ep.yaml"
    [[ ! -f $ov ]] || grep -v 'capacity_factor' "$ov" >"$WORK/${fam}_ep.yaml"
    if ! "$PYTHON" "$ROOT/bench/train_ref.py" "$M" $D --micro-batch 4 --log-json "$WORK/$fam.ref.jsonl" 2>"$WORK/$fam.ref.log"; then
        echo "| $fam | (reference) | failed: $(tail -1 "$WORK/$fam.ref.log") | FAIL |"
        fail=1
        continue
    fi
    ac="" effect=""
    if [[ $COMPUTE == bf16 ]]; then
        "$PYTHON" "$ROOT/bench/train_ref.py" "$M" ${D/--compute bf16/--compute autocast} --micro-batch 4 \
            --log-json "$WORK/$fam.ac.jsonl" 2>/dev/null && ac=yes
        "$PYTHON" "$ROOT/bench/train_ref.py" "$M" ${D/--compute bf16/--compute exact} --micro-batch 4 \
            --log-json "$WORK/$fam.ex.jsonl" 2>/dev/null && effect="$(maxrel "$WORK/$fam.ref.jsonl" "$WORK/$fam.ex.jsonl")"
    fi
    if grep -q '"num_experts\|"num_local_experts\|"n_routed_experts' "$src/config.json"; then meshes="$MOE_MESHES"
    else meshes="$DENSE_MESHES"; fi
    ((QUICK)) && meshes="$(head -1 <<<"$meshes")"
    n=0
    while IFS='|' read -r label np flags; do
        n=$((n + 1))
        flags="${flags//@EP/$WORK/${fam}_ep.yaml}"
        [[ $flags == *--micro-batch* ]] || flags="--micro-batch 4 $flags"
        log="$WORK/$fam.$n.jsonl"
        if [[ $np == 1 ]]; then cmd=("$HP"); else cmd=(timeout 600 $MPIRUN -np "$np" "$HP"); fi
        if ! "${cmd[@]}" train "$M" $D $flags --log-json "$log" >"$WORK/$fam.$n.out" 2>&1 </dev/null; then
            echo "| $fam | $label | hyperpar failed: $(grep -m1 -i 'error\|hyperpar' "$WORK/$fam.$n.out" | head -c 200) | FAIL |"
            fail=1
            continue
        fi
        d="$(maxrel "$WORK/$fam.ref.jsonl" "$log")"
        bar="${TOL:-${effect:--1}}"
        if [[ $d != - && $bar != - ]] && "$PYTHON" -c "import sys; sys.exit(0 if float('$d') <= float('$bar') else 1)"; then ok=pass
        else ok=FAIL; fail=1; fi
        if [[ $COMPUTE == bf16 ]]; then
            echo "| $fam | $label | $d | $ok | ${effect:--} | $([[ -n $ac ]] && maxrel "$WORK/$fam.ac.jsonl" "$log" || echo -) |"
        else
            echo "| $fam | $label | $d | $ok |"
        fi
    done <<<"$meshes"
done
exit $fail

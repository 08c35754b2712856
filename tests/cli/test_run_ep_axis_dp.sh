# An explicit ep axis is data parallelism outside the MoE blocks (issue 36 item 2; as Megatron and torchtitan carve
# EP out of DP): the batch rows split over dp x ep, each member of an EP group runs the dense region on rows of its
# own and the MoE blocks exchange tokens over the group. Before, the members held the same rows and did every dense
# FLOP ep times. Checked on qwen3_moe at --mesh dp=1,ep=2 --ep-axis (2 ranks):
#  1. run: the logits equal one process's within 1e-5, and each rank routes its own row: the all-to-all and gather
#     bytes of every rank are those of TP-extend-EP at --dp 2 --ep 2 (the same row split, the same EP group);
#     validate (forward and --backward) passes;
#  2. train: ten steps equal PyTorch's losses (tests/data/train_ref.json), at ZeRO 0 and 1;
#  3. cost: every rank's FLOPs are half of one process's (were equal to it), the same as --dp 2 --ep 2's;
#  and a batch smaller than dp x ep is refused naming both.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
G=$F/qwen3_moe
OV="--overrides data/overrides/qwen3_moe_ep.yaml"
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
AXIS="--mesh dp=1,ep=2 --ep-axis"

# 1. run
"$HP" run $G --random-input 2,16 --output "$WORK/one.st" >/dev/null 2>&1 </dev/null
expect 0 "OK" -- $MPI -np 2 "$HP" run $G --random-input 2,16 $AXIS $OV --compare "$WORK/one.st" --compare-rtol 1e-5
$MPI -np 2 "$HP" run $G --random-input 2,16 $AXIS $OV --stats-json "$WORK/axis.json" >/dev/null 2>&1 </dev/null
$MPI -np 2 "$HP" run $G --random-input 2,16 --dp 2 --ep 2 $OV --stats-json "$WORK/dpep.json" >/dev/null 2>&1 </dev/null
same_traffic() { # AXIS_JSON DPEP_JSON
    python3 - "$1" "$2" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["ranks"]; b = json.load(open(sys.argv[2]))["ranks"]
ok = len(a) == len(b) == 2
for x, y in zip(a, b):
    for k in ("all-to-all", "gather"):
        print("rank %d %s: ep axis %d, --dp 2 --ep 2 %d" % (x["rank"], k, x["bytes"][k], y["bytes"][k]))
        ok = ok and x["bytes"][k] == y["bytes"][k] and x["bytes"][k] > 0
sys.exit(0 if ok else 1)
PY
}
check "run: each rank of the ep axis routes and gathers its own row, as --dp 2 --ep 2" \
    same_traffic "$WORK/axis.json" "$WORK/dpep.json"
expect 0 "loss: distributed" -- $MPI -np 2 "$HP" validate $G --random-input 2,16 $AXIS $OV
expect 0 "loss: distributed" -- $MPI -np 2 "$HP" validate $G --random-input 2,16 $AXIS $OV --backward
expect 2 "the batch has 1 rows for dp x ep" -- $MPI -np 2 "$HP" run $G --random-input 1,16 $AXIS $OV

# 2. train: ten steps against PyTorch's curve
same_curve() { # GRAD_OUT
    python3 - "$1" data/train_ref.json <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
lo, hi = h["loss"]["data_offsets"]; got = struct.unpack("<%df" % ((hi - lo) // 4), b[8 + n + lo:8 + n + hi])
ref = json.load(open(sys.argv[2]))["loss"]["qwen3_moe"]
worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
sys.exit(0 if len(got) == len(ref) == 10 and worst <= 2e-5 else 1)
PY
}
OPT="--steps 10 --lr 1e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0.1"
for z in 0 1; do
    $MPI -np 2 "$HP" train $G --input $G/forward_io.safetensors $OPT $AXIS --zero $z $OV --grad-out "$WORK/g$z.st" \
        >"$WORK/t$z.log" 2>&1 </dev/null
    check "train $AXIS --zero $z: 10 steps equal PyTorch's" same_curve "$WORK/g$z.st"
done

# 3. cost: FLOPs per rank
flops() { # MESH FLAGS...: every rank's FLOPs, one a line
    "$HP" cost $G --batch 2 --seq 16 "$@" $OV --format json 2>/dev/null |
        python3 -c 'import json, sys; [print(int(r["flops"])) for r in json.load(sys.stdin)["ranks"]]'
}
one=$(flops --mesh dp=1)
axis=$(flops $AXIS)
dpep=$(flops --dp 2 --ep 2)
check "cost: one process's FLOPs known ($one)" test "${one:-0}" -gt 0
check "cost: each rank of the ep axis computes half of one process's FLOPs ($(echo $axis) vs $one)" \
    test "$axis" = "$(printf '%s\n%s' $((one / 2)) $((one / 2)))"
check "cost: the ep axis's FLOPs are --dp 2 --ep 2's" test "$axis" = "$dpep"
finish

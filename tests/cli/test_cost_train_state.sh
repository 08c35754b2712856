# The training state is exact: `hyperpar cost --mode train --format json`'s grad_bytes, optim_bytes, master_bytes
# and saved_bytes of every rank equal what `hyperpar train --stats-json` counted after a step, to the byte: dense
# and MoE families at 1, 2 and 4 ranks (tp with SP, cp, dp x tp, TP-extend-EP, the explicit ep axis, experts cut
# over tp), ZeRO-1, tied embeddings, a bf16 checkpoint (f32 masters), a frozen tensor.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
same_state() { # TRAIN_STATS COST_JSON
    python3 - "$1" "$2" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); cost = json.load(open(sys.argv[2]))
ok = run["world"] == cost["world"] == len(cost["ranks"]) == len(run["ranks"])
for a, b in zip(run["ranks"], cost["ranks"]):
    for k in ("grad_bytes", "optim_bytes", "master_bytes", "saved_bytes"):
        if a[k] != b[k]:
            ok = False
            print("rank", a["rank"], k, "train", a[k], "cost", b[k])
    if a["grad_bytes"] <= 0 or a["saved_bytes"] <= 0:
        ok = False
sys.exit(0 if ok else 1)
PY
}
"$HP" gen --family llama --dtype bf16 --out "$WORK/llama16" >/dev/null 2>&1
"$HP" gen --family qwen3_moe --dtype bf16 --out "$WORK/moe16" >/dev/null 2>&1
# dp 2 x an explicit ep axis of 2 splits the batch four ways (the ep axis is data parallelism outside the MoE
# blocks): the golden's two rows, then the same rows reversed, as a batch of 4 (@B4 in the list).
python3 - $F/qwen3_moe/forward_io.safetensors "$WORK/qwen3_moe.b4.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
t = h["input_ids"]; o = t["data_offsets"]; B, S = t["shape"]
ids = struct.unpack("<%dq" % (B * S), b[8 + n + o[0]:8 + n + o[1]]) if t["dtype"] == "I64" else \
    struct.unpack("<%di" % (B * S), b[8 + n + o[0]:8 + n + o[1]])
ids = list(ids) + list(ids[::-1])
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [2 * B, S], "data_offsets": [0, 16 * B * S]}}).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%dq" % len(ids), *ids))
PY
n=0
while read -r fam np flags; do
    n=$((n + 1))
    fam=${fam//@W/$WORK}
    case "$fam" in
    /*) G=$fam ;;
    *) G=$F/$fam ;;
    esac
    I=$F/llama/forward_io.safetensors
    [ -f $G/forward_io.safetensors ] && I=$G/forward_io.safetensors
    [[ "$flags" == *@B4* ]] && I=$WORK/$fam.b4.safetensors && flags=${flags//@B4/}
    ov=""
    case "$flags" in
    *--ep\ *)
        b=$(basename $G)
        [ "$b" = moe16 ] && b=qwen3_moe
        ov="--overrides data/overrides/${b}_ep.yaml" ;;
    esac
    launch="" && [ "$np" -gt 1 ] && launch="$MPI -np $np"
    flags=${flags//@W/$WORK}
    $launch "$HP" train $G --input $I --steps 1 $flags $ov --stats-json "$WORK/t$n.json" >"$WORK/t$n.err" 2>&1 </dev/null
    check "$fam np=$np $flags: train ran (rc $?)" test -s "$WORK/t$n.json"
    # train runs an --input as one micro-batch of each replica's rows; cost's default is 1 row per replica
    # (Megatron's), so it is given train's: the rows per replica, micro_batch x micro_batches of the default
    rows=$("$HP" cost $G --input $I --mode train $flags $ov --format json 2>/dev/null </dev/null |
           python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["micro_batch"] * d["micro_batches"])')
    "$HP" cost $G --input $I --mode train --micro-batch ${rows:-1} $flags $ov --format json -o "$WORK/c$n.json" \
        >"$WORK/c$n.err" 2>&1 </dev/null
    check "$fam np=$np $flags: cost ran" test -s "$WORK/c$n.json"
    check "$fam np=$np $flags: cost's training state = train's, every rank" same_state "$WORK/t$n.json" "$WORK/c$n.json"
done <<'LIST'
llama 1
qwen2 1
llama 2 --tp 2
llama 2 --tp 2 --no-sequence-parallel
llama 2 --cp 2
llama 4 --dp 2 --tp 2 --zero 1
qwen3 2 --dp 2 --zero 1
deepseek_v3 2 --tp 2
gpt_oss 2 --tp 2
qwen3_moe 1
qwen3_moe 2 --tp 2 --ep 2
qwen3_moe 4 --dp 2 --ep 2 --ep-axis --zero 1 @B4
qwen3_moe 2 --mesh dp=1,ep=2 --ep-axis --zero 1
mixtral 2 --dp 2 --ep 2 --zero 1
qwen2_moe 2 --tp 2
gpt_oss 2 --tp 2 --ep 2
@W/llama16 2 --tp 2 --zero 1
@W/llama16 2 --dp 2 --zero 1
@W/moe16 1
llama 1 --freeze model.layers.0.*
LIST
finish

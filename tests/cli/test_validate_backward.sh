# validate --backward (issue 22): every parameter's gradient of one training step under mpirun against one
# process's, for the dense goldens at tp=2 (SP on and off, loss-parallel), cp=2, dp=2 and products; a generated
# model with uneven splits (odd S with cp padding, vocab 132 over tp=4, 8 heads / 4 kv heads); the MoE families
# with experts cut over tp, TP-extend-EP and the explicit ep axis; a nudged gradient (a missed sum in miniature) is
# named first with exit 3.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 180 mpirun --allow-run-as-root --oversubscribe"
for fam in llama mistral qwen2 qwen3; do
    G=$F/$fam
    while read -r np flags; do
        expect 0 "loss: distributed" -- $MPI -np $np "$HP" validate $G --input $G/forward_io.safetensors $flags \
            --backward
    done <<'LIST'
2 --tp 2
2 --tp 2 --no-sequence-parallel --loss-parallel
2 --cp 2
2 --dp 2
4 --cp 2 --tp 2 --loss-parallel
4 --dp 2 --tp 2 --no-sequence-parallel
LIST
done
# Uneven splits: S = 15, vocab 132 over tp = 4 (blocks 33), 8 heads and 4 kv heads; cp = 2 pads S to 16.
"$HP" gen --family llama --out "$WORK/gen" --heads 8 --kv-heads 4 --head-dim 8 --vocab 132 --layers 2 --seed 7 \
    >/dev/null 2>&1
python3 - "$WORK/ids.st" <<'PY'
import json, struct, sys
ids = [(i * 37 + 11) % 132 for i in range(3 * 15)]
raw = struct.pack("<%dq" % len(ids), *ids)
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [3, 15], "data_offsets": [0, len(raw)]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + raw)
PY
# (validate's tape drops the cp padding: the forward's boundaries of a padded sequence agree too)
expect 0 "loss: distributed" -- $MPI -np 2 "$HP" validate "$WORK/gen" --input "$WORK/ids.st" --cp 2
expect 0 "loss: distributed" -- $MPI -np 4 "$HP" validate "$WORK/gen" --input "$WORK/ids.st" --tp 4 --backward
expect 0 "loss: distributed" -- $MPI -np 4 "$HP" validate "$WORK/gen" --input "$WORK/ids.st" --cp 2 --tp 2 \
    --loss-parallel --backward
expect 0 "loss: distributed" -- $MPI -np 2 "$HP" validate "$WORK/gen" --input "$WORK/ids.st" --dp 2 --backward
# A gradient nudged after its sums is named first, and the ones before it agree. (The table is stdout, the error
# stderr: kept apart, since mpirun may forward a chunk of one into the middle of a line of the other.)
out=$($MPI -np 2 -x HP_TEST_PERTURB_GRAD=model.layers.1.self_attn.k_norm.weight "$HP" validate $F/qwen3 \
    --input $F/qwen3/forward_io.safetensors --tp 2 --backward 2>"$WORK/nudge1.err")
check "exit 3 naming the nudged parameter" grep -q \
    "diverge from one process first at model.layers.1.self_attn.k_norm.weight" "$WORK/nudge1.err"
check "the table flags it" grep -q "model.layers.1.self_attn.k_norm.weight .*DIVERGES  <- first divergence" <<<"$out"
check "parameters before it agree" grep -q "model.layers.1.self_attn.q_norm.weight .* ok" <<<"$out"
# A gradient nudged inside the backward (a wrong dual in miniature) is named first among the gradients.
out=$($MPI -np 2 -x "HP_TEST_PERTURB_BOUNDARY=model.layers.1.mlp (gradient)" "$HP" validate $F/llama \
    --input $F/llama/forward_io.safetensors --tp 2 --backward 2>"$WORK/nudge2.err")
check "exit 3 naming the nudged boundary gradient" grep -q \
    "diverge from one process first at model.layers.1.mlp (gradient)" "$WORK/nudge2.err"
check "the forward's boundaries and the gradients before it agree" grep -q "model.norm (gradient) .* ok" <<<"$out"
# --backward belongs to validate.
expect 2 "--backward belongs to 'hyperpar validate'" -- "$HP" run $F/llama --input $F/llama/forward_io.safetensors \
    --backward
# MoE blocks: experts cut over tp, TP-extend-EP, the explicit ep axis; MLA (deepseek_v3) with its MoE layers.
while read -r fam np flags; do
    OV=data/overrides/${fam}_ep.yaml
    [ $fam = deepseek_v3 ] && OV=data/overrides/deepseek_v3_forward_ep.yaml
    case "$flags" in *ep*) flags="$flags --overrides $OV" ;; esac
    expect 0 "loss: distributed" -- $MPI -np $np "$HP" validate $F/$fam --input $F/$fam/forward_io.safetensors $flags \
        --packed-fused --backward
done <<'LIST'
mixtral 2 --tp 2
gpt_oss 2 --tp 2 --no-sequence-parallel
qwen3_moe 2 --tp 2 --ep 2
deepseek_v3 2 --tp 2 --ep 2
glm4_moe 4 --mesh dp=1,tp=2,ep=2 --ep-axis
qwen2_moe 4 --dp 2 --tp 2 --ep 4
LIST
finish

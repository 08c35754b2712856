# validate across pipeline stages (docs/pipeline.md "validate across stages", docs/run.md "validate"): each stage
# records its own layers' boundaries on its first rank, the tapes meet on rank 0 and are compared with one process's
# by name, in the one-process order. Checked here:
#   - the forward at pp=2 and pp=4 on dense and MoE goldens (deepseek_v3, gpt_oss and qwen2_moe with virtual stages
#     among them), pp=2 x tp=2 and pp=2 x cp=2: exit 0, every boundary one process validates listed once, in its
#     order, each ok, the later stages named as the recorders of their layers;
#   - validate --backward at pp=2 (a tied head, MLA and MoE, pp=2 x tp=2) and pp=4; virtual stages refused by reason;
#   - a boundary perturbed on stage 1 (HP_TEST_PERTURB_BOUNDARY), a gradient of a stage-1 parameter
#     (HP_TEST_PERTURB_GRAD) and a boundary's gradient on stage 1: exit 3, named first, the rows before it ok;
#   - run --output under a pipeline writes each sparse layer's routing (moe.<l>.topk_idx, relayed from its stage to
#     rank 0): every tensor of the file equals the inner mesh's to the byte (qwen2_moe, mixtral, deepseek_v3).
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"

# same_rows ONE_PROCESS_TABLE PIPELINE_TABLE MIN_STAGE: the pipeline's table lists the one-process table's rows (the
# boundary or parameter names, in order), each ok, the loss ok, and names stage MIN_STAGE as a recorder
same_rows() {
    python3 - "$1" "$2" "$3" <<'PY'
import re, sys
def rows(path):
    out = []
    for line in open(path):
        if line.startswith("boundary") or line.startswith("loss:") or not line.strip():
            continue
        m = re.match(r"(\S+(?: \(gradient\))?)\s", line)
        out.append((m.group(1) if m else line, line.rstrip().endswith(" ok")))
    return out
one, pp, stage = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3]
text = open(sys.argv[2]).read()
ok = [n for n, _ in one] == [n for n, _ in pp] and all(k for _, k in pp) and len(pp) > 10 and \
    "(stage %s)" % stage in text and re.search(r"^loss: .*: ok$", text, re.M) is not None
if not ok:
    print("rows: one process", len(one), "pipeline", len(pp), "first differing:",
          next((a, b) for a, b in zip(one + [None] * len(pp), pp + [None] * len(one)) if a is None or b is None or a[0] != b[0]),
          "not ok:", [n for n, k in pp if not k][:3], "stage %s named:" % stage, "(stage %s)" % stage in text)
sys.exit(0 if ok else 1)
PY
}

# pp_validate FAMILY NP [--backward] FLAGS...: one process's table (the mesh flags dropped, --packed-fused kept),
# then the pipeline's, compared (same_rows)
pp_validate() {
    local fam=$1 np=$2 G=$F/$1 bw="" stage=1 one=""
    shift 2
    [ "$1" = --backward ] && { bw=--backward; shift; }
    case " $* " in *" --pp 4 "*) stage=3 ;; esac
    case " $* " in *" --packed-fused "*) one=--packed-fused ;; esac
    "$HP" validate $G --input $G/forward_io.safetensors $bw $one >"$WORK/one.txt" 2>"$WORK/one.err" </dev/null ||
        { echo "one process failed:"; tail -3 "$WORK/one.err"; return 1; }
    $MPI -np $np "$HP" validate $G --input $G/forward_io.safetensors $bw "$@" >"$WORK/pp.txt" 2>"$WORK/pp.err" \
        </dev/null || { echo "pipeline failed:"; grep -m2 "error" "$WORK/pp.err"; return 1; }
    same_rows "$WORK/one.txt" "$WORK/pp.txt" $stage
}
while read -r fam np flags; do
    check "validate $fam $flags: the one-process table, every boundary ok, recorded on its stage" \
        pp_validate $fam $np $flags
done <<'LIST'
llama 2 --pp 2
qwen2 2 --pp 2
qwen3 4 --pp 4
llama 4 --pp 2 --tp 2
mistral 4 --pp 2 --cp 2
qwen2_moe 2 --pp 2 --pp-virtual 2
mixtral 4 --pp 2 --tp 2
qwen3_moe 4 --pp 4
glm4_moe 2 --pp 2
deepseek_v3 2 --pp 2
deepseek_v3 4 --pp 4
gpt_oss 2 --pp 2
LIST
while read -r fam np flags; do
    check "validate --backward $fam $flags: every gradient one process takes, each ok" \
        pp_validate $fam $np --backward $flags
done <<'LIST'
llama 2 --pp 2
qwen2 2 --pp 2
llama 4 --pp 2 --tp 2
qwen3 4 --pp 4
deepseek_v3 2 --pp 2 --packed-fused
gpt_oss 2 --pp 2 --packed-fused
LIST
expect 2 "validate --backward takes one training step of one micro-batch" -- $MPI -np 2 "$HP" validate $F/qwen2_moe \
    --input $F/qwen2_moe/forward_io.safetensors --pp 2 --pp-virtual 2 --backward

# A boundary perturbed on stage 1 is named first, with its stage; the boundaries before it (stage 0's, relayed
# nowhere, and stage 1's first) agree. (The table is stdout, the error stderr: kept apart.)
I=$F/llama/forward_io.safetensors
out=$($MPI -np 2 -x HP_TEST_PERTURB_BOUNDARY=model.layers.1.self_attn "$HP" validate $F/llama --input $I --pp 2 \
    2>"$WORK/p1.err"); rc=$?
check "a perturbed stage-1 boundary: exit 3 (got $rc)" test $rc = 3
check "the error names it and its stage" grep -q \
    "diverges from one process first at model.layers.1.self_attn (after identity (stage 1))" "$WORK/p1.err"
check "the table flags it first" grep -q "^model.layers.1.self_attn .*(stage 1) .*DIVERGES  <- first divergence" <<<"$out"
check "the boundaries before it agree" grep -q "^model.layers.1.input_layernorm .*(stage 1) .* ok$" <<<"$out"
check "stage 0's agree" grep -q "^model.layers.0 .*residual add (stage 0) .* ok$" <<<"$out"
# the same on a sparse block of the last stage, inside a stage of tp=2 (MLA and MoE: deepseek_v3, layer 2 on stage 1)
out=$($MPI -np 4 -x HP_TEST_PERTURB_BOUNDARY=model.layers.2.mlp "$HP" validate $F/deepseek_v3 \
    --input $F/deepseek_v3/forward_io.safetensors --pp 2 --tp 2 2>"$WORK/p2.err"); rc=$?
check "a perturbed stage-1 MoE block at pp=2 x tp=2: exit 3 (got $rc)" test $rc = 3
check "the error names it" grep -q "diverges from one process first at model.layers.2.mlp (after" "$WORK/p2.err"
check "the table flags it first" grep -q "^model.layers.2.mlp .*(stage 1) .*DIVERGES  <- first divergence" <<<"$out"
# the backward: a stage-1 parameter's gradient, and a stage-1 boundary's gradient
out=$($MPI -np 2 -x HP_TEST_PERTURB_GRAD=model.layers.1.mlp.down_proj.weight "$HP" validate $F/llama --input $I \
    --pp 2 --backward 2>"$WORK/p3.err"); rc=$?
check "a nudged stage-1 gradient: exit 3 (got $rc)" test $rc = 3
check "the error names the parameter" grep -q \
    "gradients diverge from one process first at model.layers.1.mlp.down_proj.weight" "$WORK/p3.err"
check "the parameters before it agree" grep -q "^model.layers.1.mlp.up_proj.weight .* ok$" <<<"$out"
out=$($MPI -np 2 -x "HP_TEST_PERTURB_BOUNDARY=model.layers.1.mlp (gradient)" "$HP" validate $F/llama --input $I \
    --pp 2 --backward 2>"$WORK/p4.err"); rc=$?
check "a nudged stage-1 boundary gradient: exit 3 (got $rc)" test $rc = 3
check "the error names it" grep -q "gradients diverge from one process first at model.layers.1.mlp (gradient)" \
    "$WORK/p4.err"
check "the forward and the gradients before it agree" grep -q "^model.norm (gradient) .*(stage 1) .* ok$" <<<"$out"

# run --output under a pipeline: the routing of every sparse layer, relayed to rank 0 from its stage; the file's
# tensors (logits, loss, moe.<l>.topk_idx) are the inner mesh's to the byte, with the model's own router
same_output() { # FAMILY INNER_NP INNER_FLAGS PP_NP PP_FLAGS
    local G=$F/$1 L1=""
    [ "$2" -gt 1 ] && L1="$MPI -np $2"
    $L1 "$HP" run $G --input $G/forward_io.safetensors $3 --output "$WORK/a.safetensors" >/dev/null 2>&1 </dev/null &&
        $MPI -np $4 "$HP" run $G --input $G/forward_io.safetensors $5 --output "$WORK/b.safetensors" \
            >/dev/null 2>"$WORK/b.err" </dev/null || { grep -m2 error "$WORK/b.err"; return 1; }
    python3 - "$WORK/a.safetensors" "$WORK/b.safetensors" <<'PY'
import json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
routing = [k for k in a if k.endswith(".topk_idx")]
ok = a == b and len(routing) >= 2
if not ok:
    print("routing in the reference:", routing, "differ:", sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)))
sys.exit(0 if ok else 1)
PY
}
check "run --output qwen2_moe pp=2 = one process's, routing included" same_output qwen2_moe 1 "" 2 "--pp 2"
check "run --output mixtral pp=2 = one process's" same_output mixtral 1 "" 2 "--pp 2"
check "run --output deepseek_v3 pp=2 = one process's" same_output deepseek_v3 1 "" 2 "--pp 2"
check "run --output deepseek_v3 pp=3 = one process's" same_output deepseek_v3 1 "" 3 "--pp 3"
check "run --output qwen2_moe pp=2 x 2 virtual stages = one process's" same_output qwen2_moe 1 "" 2 "--pp 2 --pp-virtual 2"
check "run --output mixtral pp=2 x tp=2 = tp=2's" same_output mixtral 2 "--tp 2" 4 "--pp 2 --tp 2"
finish

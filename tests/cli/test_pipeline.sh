# Pipeline parallelism in plan, explain, shard and merge (docs/pipeline.md): --pp N puts a pp axis outermost; the
# plan records each stage's ranks and layers; shard writes each rank only its stage's tensors (the embedding on the
# first stage, the final norm and lm_head on the last, a tied embedding on both); merge restores the checkpoint to
# the byte; run executes one, its output (logits, loss, routing) that of the inner mesh to the byte (train:
# test_pipeline_train.sh; cost: test_cost_pp.sh; validate: test_pipeline_validate.sh).
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward

same_tensors() { # ORIGINAL_FOLDER MERGED_FOLDER: every tensor equal in dtype, shape and bytes
    python3 - "$1" "$2" <<'PY'
import glob, json, struct, sys
def tensors(folder):  # the checkpoint's own files (a golden folder also holds its reference outputs)
    out = {}
    for path in glob.glob(folder + "/model*.safetensors"):
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        head = json.loads(raw[8:8 + n])
        for k, v in head.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], raw[8 + n + a:8 + n + b])
    return out
x, y = tensors(sys.argv[1]), tensors(sys.argv[2])
bad = [k for k in x if k not in y or x[k] != y[k]] + [k for k in y if k not in x]
print(" ".join(bad[:5]))
sys.exit(1 if bad else 0)
PY
}

stages_hold() { # SHARD_FOLDER: each rank holds only tensors of its stage (plan.json's pipeline), and something
    python3 - "$1" <<'PY'
import json, re, sys
d = sys.argv[1]
plan, man = json.load(open(d + "/plan.json")), json.load(open(d + "/manifest.json"))
pipe = plan["pipeline"]
last = pipe["pp"] - 1
stage_of_rank, stage_of_layer = {}, {}
for s in pipe["stages"]:
    for r in range(*s["ranks"]):
        stage_of_rank[r] = s["stage"]
    for c in s["chunks"]:
        for l in range(c["first_layer"], c["first_layer"] + c["layers"]):
            stage_of_layer[l] = s["stage"]
tied = "lm_head.weight" not in [t["name"] for t in man["tensors"]]
def stages(name):  # a stack of experts is named under its layer too
    m = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
    if m:
        return {stage_of_layer.get(int(m.group(1)), last)}
    if "embed_tokens" in name:
        return {0, last} if tied else {0}
    return {last}
ok = True
for r in man["ranks"]:
    s = stage_of_rank[r["rank"]]
    names = [t["name"] for t in r["tensors"]]
    if not names:
        print("rank", r["rank"], "holds nothing")
        ok = False
    for n in names:
        if s not in stages(n):
            print("rank", r["rank"], "of stage", s, "holds", n)
            ok = False
sys.exit(0 if ok else 1)
PY
}

n=0
for c in "llama:--pp 2 --tp 2" "qwen2:--pp 2" "mixtral:--pp 2 --tp 2 --ep 2 --packed-fused" "qwen2_moe:--pp 2 --pp-virtual 2" \
         "deepseek_v3:--pp 3" "gpt_oss:--pp 2 --pp-layers 1,1 --dp 2"; do
    fam=${c%%:*}
    flags=${c#*:}
    n=$((n + 1))
    G=$F/$fam
    IFS=' ' read -r -a fl <<<"$flags"
    expect 0 "" -- "$HP" shard $G "${fl[@]}" --out "$WORK/s$n"
    check "$fam $flags: each rank holds its stage's tensors only" stages_hold "$WORK/s$n"
    expect 0 "" -- "$HP" merge "$WORK/s$n" --out "$WORK/m$n"
    check "$fam $flags: merge restores the checkpoint to the byte" same_tensors $G "$WORK/m$n"
done

# The plan file carries the stages; shard --plan takes them, and explain prints them
G=$F/llama
expect 0 "" -- "$HP" plan $G --pp 2 --tp 2 -o "$WORK/pp.json"
check "the plan records the pipeline" python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["pipeline"]; \
    sys.exit(0 if p["pp"] == 2 and [s["ranks"] for s in p["stages"]] == [[0, 2], [2, 4]] else 1)' "$WORK/pp.json"
expect 0 "" -- "$HP" shard $G --plan "$WORK/pp.json" --out "$WORK/fromplan"
expect 0 "stage 1 (ranks 2-3): chunk 1: layers 1-1 (1); final norm, lm_head and the loss" -- \
    "$HP" plan $G --pp 2 --tp 2 --format explain
expect 0 "the embedding again (lm_head is tied to it)" -- "$HP" plan $F/qwen2 --pp 2 --format explain

# A hand-edited plan whose stages do not cover the layers is refused by name
python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); p["pipeline"]["stages"][1]["chunks"][0]["layers"] = 2; \
    json.dump(p, open(sys.argv[2], "w"))' "$WORK/pp.json" "$WORK/bad.json"
expect 2 "the counts sum to 3, but the model has 2 decoder layers" -- "$HP" shard $G --plan "$WORK/bad.json" \
    --out "$WORK/bad"
check "nothing written for a refused plan" test ! -e "$WORK/bad"

# Bad pipeline flags: exit 2 with the reason
expect 2 "gives 3 counts; pp=2 x 1 virtual stages has 2 chunks" -- "$HP" plan $G --pp 2 --pp-layers 1,1,0
expect 2 "makes 8 chunks, but the model has only 2 decoder layers" -- "$HP" plan $G --pp 4 --pp-virtual 2
expect 2 "pp must be the mesh's first (outermost) axis" -- "$HP" plan $G --mesh tp=2,pp=2
expect 2 "give either --mesh or --dp/--cp/--tp/--pp" -- "$HP" plan $G --mesh pp=2 --pp 2
expect 2 "expected layer counts separated by commas" -- "$HP" plan $G --pp 2 --pp-layers 1,
# cost takes a pipeline (tests/cli/test_cost_pp.sh checks its figures against run's)
expect 0 "pipeline pp=2 x 1 virtual" -- "$HP" cost $G --pp 2 --batch 2 --seq 8
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
I=$G/forward_io.safetensors

# run across stages: the stream goes point to point between stages, the loss and the logits come from the last
# stage, each sparse layer's routing from its stage; a stage computes what the same ranks compute without the
# pipeline, so the output file is the inner mesh's to the bit, and the stream's bytes are each rank's block of it
pp_run() { # FAMILY INNER_NP INNER_FLAGS PP_FLAGS
    local fam=$1 np=$2 inner=$3 ppf=$4 G2=$F/$1 router=""
    grep -q '"num_local_experts"\|"num_experts"\|"n_routed_experts"' $G2/config.json && router="--router balanced"
    local pp=${ppf#--pp }
    pp=${pp%% *}
    local L1=""
    [ "$np" -gt 1 ] && L1="$MPI -np $np"
    $L1 "$HP" run $G2 --input $G2/forward_io.safetensors $inner $router --output "$WORK/a.safetensors" >/dev/null 2>&1 &&
        $MPI -np $((np * pp)) "$HP" run $G2 --input $G2/forward_io.safetensors $inner $ppf $router \
            --output "$WORK/b.safetensors" --stats-json "$WORK/b.json" >/dev/null 2>"$WORK/b.err" &&
        python3 - "$WORK/a.safetensors" "$WORK/b.safetensors" "$WORK/b.json" <<'PY'
import json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in head.items() if k != "__metadata__"}
a, b, s = load(sys.argv[1]), load(sys.argv[2]), json.load(open(sys.argv[3]))
# every tensor: the logits, the loss and each sparse layer's routing (moe.<l>.topk_idx, relayed from its stage)
ok = a == b and "logits" in a and all(r["p2p_calls"] > 0 and r["p2p_bytes"] > 0 for r in s["ranks"])
if not ok:
    print("differ:", sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)),
          [(r["p2p_bytes"], r["p2p_calls"]) for r in s["ranks"]])
sys.exit(0 if ok else 1)
PY
}
check "run llama pp=2: the logits of one process, to the bit" pp_run llama 1 "" "--pp 2"
check "run qwen2 (tied) pp=2" pp_run qwen2 1 "" "--pp 2"
check "run llama pp=2 x tp=2: tp=2's logits" pp_run llama 2 "--tp 2" "--pp 2"
check "run mistral pp=2 x cp=2: cp=2's logits" pp_run mistral 2 "--cp 2" "--pp 2"
check "run qwen3 pp=2 x dp=2: dp=2's logits" pp_run qwen3 2 "--dp 2" "--pp 2"
check "run mixtral pp=2 x tp=2 x ep=2" pp_run mixtral 2 "--tp 2 --ep 2 --ep-compute suggested" "--pp 2"
check "run qwen2_moe pp=2 with 2 virtual stages (the stream goes round twice)" pp_run qwen2_moe 1 "" "--pp 2 --pp-virtual 2"
check "run deepseek_v3 pp=3" pp_run deepseek_v3 1 "" "--pp 3"
check "run gpt_oss pp=2, a stage of no layer (--pp-layers 2,0)" pp_run gpt_oss 1 "" "--pp 2 --pp-layers 2,0"
# from a shard folder sharded for the pipeline: the same logits
expect 0 "" -- $MPI -np 4 "$HP" run "$WORK/fromplan" --input $I --output "$WORK/c.safetensors"
expect 0 "" -- $MPI -np 4 "$HP" run $G --input $I --pp 2 --tp 2 --output "$WORK/d.safetensors"
check "run from the pipeline's shard folder = run from the checkpoint" cmp -s "$WORK/c.safetensors" "$WORK/d.safetensors"
# the stream's bytes: llama's [2, 16, 64] f32 block, from stage 0 to stage 1 (the logits' delivery to rank 0 is not
# the pipeline's traffic)
expect 0 "" -- $MPI -np 2 "$HP" run $G --input $I --pp 2 --output "$WORK/e.safetensors" --stats-json "$WORK/e.json"
check "the stream's bytes, counted on both ends" python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
want = 2 * 16 * 64 * 4
sys.exit(0 if [x["p2p_bytes"] for x in r] == [want, want] and [x["p2p_calls"] for x in r] == [1, 1] else 1)' \
    "$WORK/e.json"
finish

# hyperpar train: checkpoints bound to their run (docs/train.md, "Checkpoints and
# resume"). On a tiny generated llama:
#  - a checkpoint's files belong together: a stale rank file of another step, two rank files swapped, state.json's
#    step edited, a rank file's metadata edited, model.safetensors replaced, a renamed step-<t> folder, all refused
#    (exit 2) by --resume and merge, naming the file and what is wrong;
#  - --resume refuses another model config (rms_norm_eps, rope_theta, another family of the same shapes) and other
#    data (by its bytes, whatever its path), and a new run refuses a run folder holding another run's checkpoints.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
"$HP" gen --family llama --out M >/dev/null 2>&1
small_train_inputs # tok.bin, ids.safetensors (lib.sh)
D="--data tok.bin --seq 16 --global-batch 4"
T="timeout 120 $HP train"

# ---- checkpoints bound to their run: 2 ranks, dp=2 ----
P="$D --steps 6 --dp 2 --save-every 2"
$MPI -np 2 "$HP" train M $P --stop-after 4 --out b >/dev/null 2>&1
check "the run's checkpoints" test -f b/step-2/state.json -a -f b/step-4/state.json
check "state.json records the run id, every file's size and hash, the model's config and the data's identity" \
    python3 - <<'PY'
import json
s = json.load(open("b/step-4/state.json"))
assert len(s["run_id"]) == 16 and s["run_id"] == json.load(open("b/step-2/state.json"))["run_id"]
assert set(s["sums"]) == set(s["files"]) and all(len(v["xxh64"]) == 16 for v in s["sums"].values())
assert s["model_config"]["rms_norm_eps"] == 1e-06 and "torch_dtype" not in s["model_config"]
assert s["flags"]["data"] == {"bytes": 4000, "xxh64": s["flags"]["data"]["xxh64"], "dtype": "uint16"}
PY
resume2() { $MPI -np 2 "$HP" train M $P --resume "$1" --out "${2:-b}"; }
tamper() { rm -rf t && cp -r b/step-4 t; }
# a stale rank file of another step of the same run
tamper && cp b/step-2/rank-1.safetensors t/rank-1.safetensors
expect 2 "t: rank-1.safetensors says checkpoint_step 2 where this checkpoint" -- resume2 t
expect 2 "belongs to another step" -- "$HP" merge t --out x
# two rank files swapped
tamper && mv t/rank-0.safetensors t/r && mv t/rank-1.safetensors t/rank-0.safetensors && mv t/r t/rank-1.safetensors
expect 2 "t: rank-0.safetensors says rank 1 where" -- resume2 t
expect 2 "belongs to another rank" -- "$HP" merge t --out x
# state.json's step edited
tamper && sed -i 's/"step": 4/"step": 3/' t/state.json
expect 2 "rank-0.safetensors says checkpoint_step 4 where this checkpoint (state.json: step 3" -- resume2 t
expect 2 "says checkpoint_step 4" -- "$HP" merge t --out x
# a rank file's metadata edited (same length: the size matches): AdamW's step past the run's, then below it (only
# its hash tells)
edit_step() { # VALUE: rank-1's "step" metadata (AdamW's steps, 4) replaced by one digit
    python3 - "$1" <<'PY'
import sys
p = "t/rank-1.safetensors"
raw = open(p, "rb").read()
i = raw.index(b'"step":"4"')
open(p, "wb").write(raw[:i] + b'"step":"' + sys.argv[1].encode() + b'"' + raw[i + 10:])
PY
}
tamper && edit_step 5
expect 2 "t: rank-1.safetensors says step 5 where this checkpoint (state.json: step 4 of 2 ranks" -- resume2 t
expect 2 "needs at most 4" -- "$HP" merge t --out x
tamper && edit_step 3
expect 2 "t: rank-1.safetensors has XXH64" -- resume2 t
expect 2 "it is not the file this checkpoint saved" -- "$HP" merge t --out x
# model.safetensors replaced: by another size, then by the same size (another step's)
tamper && cp M/model.safetensors t/model.safetensors
expect 2 "t: model.safetensors is 363" -- resume2 t
expect 2 "where state.json records" -- "$HP" merge t --out x
tamper && cp b/step-2/model.safetensors t/model.safetensors
expect 2 "t: model.safetensors has XXH64" -- resume2 t
expect 2 "t: model.safetensors has XXH64" -- "$HP" merge t --out x
check "nothing merged from a tampered checkpoint" test ! -e x
# a renamed step-<t> folder
rm -rf t && cp -r b/step-2 b2 && mkdir -p rn && mv b2 rn/step-4
expect 2 "rn/step-4: state.json says step 2, the folder's name step 4" -- resume2 rn/step-4 rn
expect 2 "the folder's name step 4" -- "$HP" merge rn --out x
# state.json without a run id (an edit, or a checkpoint written before)
tamper && python3 -c "import json; s = json.load(open('t/state.json')); del s['run_id']; json.dump(s, open('t/state.json', 'w'))"
expect 2 "t: state.json has no \"run_id\"" -- "$HP" merge t --out x
# the untouched checkpoint resumes and merges
expect 0 "resumed from b/step-4" -- resume2 b/step-4 b
expect 0 "merged" -- "$HP" merge b --out x

# ---- the model and the data of a resume ----
"$HP" train M $D --steps 4 --save-every 2 --stop-after 2 --out c >/dev/null 2>&1
cfg() { # NAME PYTHON-STATEMENT on c (M's config): M with the edited config.json as NAME
    rm -rf "$1" && cp -r M "$1" && python3 - "$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
}
R="$D --steps 4 --save-every 2 --resume c --out c"
cfg Meps 'c["rms_norm_eps"] = 1e-5'
expect 2 "the run trained a model whose config.json has rms_norm_eps 1e-06; Meps's has 1e-05" -- $T Meps $R
cfg Mrope 'c["rope_theta"] = 500000.0'
expect 2 "config.json has rope_theta 10000; Mrope's has 500000" -- $T Mrope $R
cfg Mfam 'c["model_type"] = "mistral"; c["architectures"] = ["MistralForCausalLM"]'
expect 2 "config.json has architectures [\"LlamaForCausalLM\"]; Mfam's has [\"MistralForCausalLM\"]" -- $T Mfam $R
cfg Mdt 'c["torch_dtype"] = "bfloat16"'
expect 0 "resumed from c/step-2" -- $T Mdt $D --steps 4 --save-every 2 --stop-after 3 --resume c/step-2 --out c2
# the data by its bytes: another spelling or folder of the same bytes is the same data; other bytes are not
mkdir -p elsewhere && cp tok.bin elsewhere/tok.bin
expect 0 "resumed from c/step-2" -- $T M --data ./tok.bin --seq 16 --global-batch 4 --steps 4 --save-every 2 \
    --stop-after 3 --resume c/step-2 --out c3
expect 0 "resumed from c/step-2" -- $T M --data elsewhere/tok.bin --seq 16 --global-batch 4 --steps 4 \
    --save-every 2 --stop-after 3 --resume c/step-2 --out c4
python3 -c "b = bytearray(open('tok.bin', 'rb').read()); b[100] ^= 1; open('other.bin', 'wb').write(b)"
expect 2 "the run was saved training on other data" -- $T M --data other.bin --seq 16 --global-batch 4 --steps 4 \
    --save-every 2 --resume c --out c
cp tok.bin tok32.bin
expect 2 "\"dtype\": \"uint32\"" -- $T M --data tok32.bin --data-dtype uint32 --seq 16 --global-batch 4 --steps 4 \
    --save-every 2 --resume c --out c

# ---- a run folder holds one run ----
expect 2 "--out c holds step-2, a checkpoint of run" -- $T M $D --steps 4 --save-every 2 --out c
expect 2 "continue that run with --resume" -- $T M $D --steps 4 --save-every 2 --out c
check "the other run's checkpoint is untouched" test -f c/step-2/state.json
"$HP" train M $D --steps 2 --save-every 2 --out d >/dev/null 2>&1
expect 2 "--out c holds step-2, a checkpoint of run" -- $T M $D --steps 4 --save-every 2 --resume d --out c
expect 0 "removed c/step-2, a checkpoint of another run" -- $T M $D --steps 2 --save-every 2 --out c --force
check "--force: the run folder holds the new run's checkpoint alone" test "$(ls c)" = "step-2"
# a run folder with two runs' checkpoints (made by hand) is not merged or resumed from
cp -r b/step-4 c/step-4
expect 2 "it holds the checkpoints of two runs" -- "$HP" merge c --out x2
expect 2 "it holds the checkpoints of two runs" -- $T M $D --steps 4 --save-every 2 --resume c --out e
finish

# bench train: the training step benchmark at tiny shapes (the preset's are replaced by the test-only shape
# options), dense and MoE, in one process and on 2 MPI ranks with tp = 2: exit 0, the text has its lines, the
# JSON parses and has positive step seconds and tokens/s and a split (forward + backward + optimizer) within 50%
# of the step, the temporary checkpoint is removed, and bad options exit 2. Speeds are never checked: only that
# the figures are there and consistent with one another.
source "$(dirname "$0")/lib.sh"
# The checkpoints go to a folder of this test's own, which must hold no run folder after each command.
export TMPDIR="$WORK/tmp" && mkdir -p "$TMPDIR"
left() { ! ls -A "$TMPDIR" | grep -q hp-bench-run; }
# No PyTorch unless a test below gives its stand-in (`false` exits 1 on `import torch`).
export HP_BENCH_PYTHON=false
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
SHAPES="--hidden 64 --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --layers 1 --vocab 512"
SMALL="--preset llama-3-8b $SHAPES --seq 16"
MOE="--preset qwen3-30b-a3b $SHAPES --tokens 16 --experts 8"
# sane FILE: the JSON parses, is bench train's, and its figures are positive with the split near the step.
sane() {
    python3 - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["bench"] == "train", d["bench"]
for k in ("step_s", "tokens_per_s", "forward_s", "backward_s", "optimizer_s", "model_gflop", "achieved_gflops",
          "gemm_gflops_per_rank", "gemm_gflops", "ratio_achieved_over_gemm"):
    assert d[k] > 0, (k, d[k])
assert d["backward_comm_s"] >= 0 and d["backward_comm_s"] <= d["backward_s"]
split = d["forward_s"] + d["backward_s"] + d["optimizer_s"]
assert 0.5 * d["step_s"] <= split <= 1.5 * d["step_s"], (split, d["step_s"])
assert abs(d["tokens_per_s"] * d["step_s"] - d["batch"] * d["tokens"]) < 1e-3 * d["batch"] * d["tokens"]
w = d["weights_per_token"]
assert abs(d["model_gflop"] - 6 * w * d["batch"] * d["tokens"] * 1e-9) <= 1e-4 * d["model_gflop"]
assert abs(d["achieved_gflops"] - d["model_gflop"] / d["step_s"]) <= 1e-3 * d["achieved_gflops"]
# issue 40: each median with its min and max over the reps, the host's load at the start and the end
for k in ("step", "forward", "backward", "backward_comm", "optimizer"):
    assert 0 <= d[k + "_min_s"] <= d[k + "_s"] <= d[k + "_max_s"], (k, d)
assert d["step_min_s"] > 0, d
for k in ("load_start", "load_end"):
    assert d[k] >= 0 or d[k] == -1, (k, d[k])
# issue 40: the reference GEMM names what ran it (oneDNN's implementation, hence its instruction set)
assert d["gemm_impl"].startswith(("oneDNN ", "hyperpar ")) and len(d["gemm_impl"]) > 8, d["gemm_impl"]
EOF
}
TEXT_LINES=("optimizer : AdamW, PyTorch's defaults"
            "step      : .* ms median of [0-9]* (min [0-9.]*, max [0-9.]*; slowest rank) -> .* training tokens/s"
            "split     : forward .* ms (min .*, max .*), backward .* ms (min .*, max .*) (communication .* ms of it: min .*, max .*), optimizer .* ms (min .*, max .*); sum of the medians .* of the step"
            "load      : 1-minute load average .* at start, .* at end ([0-9]* cores\\?)"
            "model     : 6 x .* G weights per token x .* tokens = .* GFLOP per step -> .* GFLOP/s achieved"
            "gemm      : .* GFLOP/s per rank (f32 2048x2048x2048 through the GEMM layer.*ratio achieved/gemm"
            "kernels   : " "mesh      : ")
text_ok() { # text_ok NAME OUTPUT
    local l
    for l in "${TEXT_LINES[@]}"; do check "$1: '$l'" grep -q -- "$l" <<<"$2"; done
}

expect 0 "usage: [mpirun -np N] hyperpar bench train --preset P" -- "$HP" bench train --help
expect 0 "training tokens/s" -- "$HP" bench train --help
expect 0 "rank 0 times PyTorch eager" -- "$HP" bench train --help
expect 0 "hyperpar bench train --help" -- "$HP" bench --help

# One process, dense and MoE.
out=$("$HP" bench train $SMALL --reps 2 2>&1 </dev/null)
check "1 process: exit 0" test $? -eq 0
check "1 process: header" grep -q "bench train: llama-3-8b (llama) 1 layer, H 64, I 128, .* bf16; batch 1 x 16 tokens" <<<"$out"
text_ok "1 process" "$out"
check "1 process: the temporary checkpoint is gone" left
"$HP" bench train $SMALL --reps 2 --format json >"$WORK/one.json" 2>/dev/null </dev/null
check "1 process: json sane" sane "$WORK/one.json"
"$HP" bench train $MOE --reps 2 --batch 2 --json >"$WORK/moe1.json" 2>/dev/null </dev/null
check "moe 1 process: json sane" sane "$WORK/moe1.json"
check "moe 1 process: the moe object" grep -q '"moe": {"experts": 8, "experts_preset": 128, "top_k": 8, .*"ep": 1' "$WORK/moe1.json"
check "moe 1 process: batch 2" grep -q '"batch": 2, "tokens": 16' "$WORK/moe1.json"
check "moe 1 process: the temporary checkpoint is gone" left

# Two ranks, tp = 2: dense and MoE (TP-extend-EP over the tp group).
out=$($MPI -np 2 "$HP" bench train $SMALL --tp 2 --threads 1 --reps 2 2>&1 </dev/null)
check "2 ranks: exit 0" test $? -eq 0
text_ok "2 ranks" "$out"
check "2 ranks: mesh tp=2" grep -q "mesh      : dp=1,cp=1,tp=2 (world 2), 2 ranks, MPI" <<<"$out"
check "2 ranks: printed once" test "$(grep -c 'training tokens/s' <<<"$out")" -eq 1
check "2 ranks: over 2 ranks" grep -q "GFLOP/s over 2 ranks   ratio achieved/gemm" <<<"$out"
$MPI -np 2 "$HP" bench train $SMALL --tp 2 --threads 1 --reps 2 --format json >"$WORK/two.json" 2>/dev/null </dev/null
check "2 ranks: json sane" sane "$WORK/two.json"
check "2 ranks: json has the ranks" grep -q '"tp": 2, "ranks": 2' "$WORK/two.json"
$MPI -np 2 "$HP" bench train $MOE --tp 2 --threads 1 --reps 2 --json >"$WORK/moe2.json" 2>/dev/null </dev/null
check "moe 2 ranks: json sane" sane "$WORK/moe2.json"
check "moe 2 ranks: ep 2" grep -q '"ep": 2, "overrides": 1}' "$WORK/moe2.json"
check "2 ranks: the temporary checkpoint is gone" left

# PyTorch eager in the same run, through a stand-in interpreter (tests never need torch): "import torch" works,
# and the step gets the embedded scripts, the bench's checkpoint folder while it exists and the bench's shapes,
# and prints a fixed 0.25 s step. The ratio is hyperpar's tokens/s over 16 / 0.25 = 64.
cat >"$WORK/fakepy" <<'EOF'
#!/bin/bash
[[ $1 == -c ]] && exit 0 # the probe: python3 -c 'import torch'
[[ $1 == -B && $2 == -c && $3 == *"sys.modules['torch_model'] = m"* ]] || exit 9
[[ $4 == *"def read_safetensors"* && $5 == *"def main():"* && $5 == *"--mode"* ]] && src=yes || src=no
[[ -f $6/config.json && -f $6/model.safetensors ]] && ckpt=yes || ckpt=no
[[ -n ${FAKE_ERROR:-} ]] && { echo "{\"error\": \"$FAKE_ERROR\"}"; exit 0; }
shift 6
echo 'Loading weights' # anything before the last JSON object is ignored
echo "{\"median_s\": 0.25, \"min_s\": 0.2, \"max_s\": 0.375, \"tokens_per_s\": 64, \"threads\": 3, \"model\": \"src=$src ckpt=$ckpt $*\", \"torch\": \"9.9\"}"
EOF
chmod +x "$WORK/fakepy"
HP_BENCH_PYTHON="$WORK/fakepy" "$HP" bench train $SMALL --reps 2 --threads 2 --json >"$WORK/pt.json" 2>/dev/null </dev/null
check "pytorch: the step's figures, the ratio, what ran" python3 - "$WORK/pt.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
pt = d["pytorch_eager"]
assert pt["median_s"] == 0.25 and pt["tokens_per_s"] == 64 and pt["threads"] == 3 and pt["dtype"] == "f32", pt
assert pt["min_s"] == 0.2 and pt["max_s"] == 0.375, pt
assert abs(d["ratio_over_pytorch"] - d["tokens_per_s"] / 64) <= 1e-5 * d["ratio_over_pytorch"], d
assert pt["model"] == "src=yes ckpt=yes --mode train --batch 1 --tokens 16 --threads 2 --reps 2 --dtype f32", pt
assert pt["torch"] == "9.9" and "9.9" in d["pytorch_note"], d
EOF
out=$(HP_BENCH_PYTHON="$WORK/fakepy" "$HP" bench train $SMALL --reps 2 2>&1 </dev/null)
check "pytorch: the text line" grep -q "pytorch   : 250.000 ms median (min 200.000, max 375.000) of the same batch -> 64.0 training tokens/s (PyTorch eager f32, src=yes ckpt=yes .*torch 9.9, 3 threads; the same run, rank 0)   ratio hyperpar/pytorch [0-9.]*$" <<<"$out"
out=$(FAKE_ERROR="no module named transformers" HP_BENCH_PYTHON="$WORK/fakepy" "$HP" bench train $SMALL --reps 1 2>&1 </dev/null)
check "pytorch: a failed step is named, the bench goes on" grep -q "PyTorch eager: not measured (.*fakepy failed: no module named transformers)" <<<"$out"
check "pytorch: the temporary checkpoint is gone" left
HP_BENCH_PYTHON="$WORK/fakepy" "$HP" bench run $SMALL --reps 1 --json >"$WORK/ptrun.json" 2>/dev/null </dev/null
check "pytorch: bench run times the forward in the weights' dtype" python3 - "$WORK/ptrun.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["pytorch_eager"]["model"].startswith("src=yes ckpt=yes --mode forward --batch 1 --tokens 16 "), d
assert d["pytorch_eager"]["model"].endswith("--dtype bf16") and d["pytorch_eager"]["dtype"] == "bf16", d
assert abs(d["ratio_over_pytorch"] - d["tokens_per_s"] / 64) <= 1e-5 * d["ratio_over_pytorch"], d
EOF
# Two ranks: rank 0 alone runs PyTorch, with the threads of both ranks (the node's cores hyperpar used).
HP_BENCH_PYTHON="$WORK/fakepy" $MPI -np 2 -x HP_BENCH_PYTHON "$HP" bench train $SMALL --tp 2 --threads 1 --reps 1 \
    --json >"$WORK/pt2.json" 2>/dev/null </dev/null
check "pytorch, 2 ranks: once, on 1 x 2 threads" grep -q '"model": "src=yes ckpt=yes --mode train --batch 1 --tokens 16 --threads 2 --reps 1 --dtype f32"' "$WORK/pt2.json"
check "pytorch, 2 ranks: one report" test "$(grep -c '"pytorch_eager"' "$WORK/pt2.json")" = 1
out=$(HP_BENCH_PYTHON=false "$HP" bench train $SMALL --reps 1 2>&1 </dev/null)
check "no torch: the note" grep -q "PyTorch eager: not measured here (torch cannot be imported: false exited with status 1 on 'import torch')" <<<"$out"

# Failures: every rank ends with the cause, no checkpoint left behind.
expect 2 "the mesh dp=1,cp=1,tp=4 has 4 ranks but 2 processes run it" -- $MPI -np 2 "$HP" bench train $SMALL --tp 4
check "failures: the temporary checkpoint is gone" left

# Bad options: exit 2 with the reason.
expect 2 "missing --preset" -- "$HP" bench train --seq 4
expect 2 "unknown preset 'llama'" -- "$HP" bench train --preset llama
expect 2 "--format expects text or json, got 'xml'" -- "$HP" bench train $SMALL --format xml
expect 2 "--batch expects an integer in [1, 65536], got '0'" -- "$HP" bench train $SMALL --batch 0
expect 2 "--batch 1 is fewer rows than dp 2" -- "$HP" bench train $SMALL --batch 1 --dp 2
expect 2 "--tokens is given twice" -- "$HP" bench train $SMALL --tokens 8
expect 2 "llama-3-8b is dense" -- "$HP" bench train $SMALL --experts 8
expect 2 "--reps expects an integer in [1, 50], got '0'" -- "$HP" bench train $SMALL --reps 0
expect 2 "unknown benchmark 'trian'; known: moe, ep, run, train, advise" -- "$HP" bench trian
finish

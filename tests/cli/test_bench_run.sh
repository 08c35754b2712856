# bench run: the runtime's forward pass benchmark at small shapes (the preset's are replaced by the test-only
# shape options) in one process and on 2 MPI ranks: the figures are printed (tokens/s, the bare/runtime ratio
# lines, the resident line), --json parses, a vocabulary above gen's limit is written by the bench itself,
# the temporary checkpoint is removed on success and on failure, and bad options exit 2. MoE presets at small
# shapes with --experts: the EP exchange as the all-to-all kind next to a bare all-to-all on the EP group, the
# MoE phase times, resident bytes against dense / tp + experts / ep, the EP compute declared with ep > 1.
# Timings are never checked: only that they are there.
source "$(dirname "$0")/lib.sh"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
SMALL="--preset llama-3-8b --hidden 64 --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --layers 1 --tokens 16 --vocab 512"
mkdir -p "$WORK/tmp"
export TMPDIR="$WORK/tmp"
# No PyTorch here, installed or not (`false` exits 1 on `import torch`): the note in place of the comparison.
export HP_BENCH_PYTHON=false
left() { [ -z "$(ls -A "$WORK/tmp" | grep hp-bench-run)" ]; }
# but "BASE" OPT...: the words of BASE without the options OPT and their values (an option may be given once).
but() {
    local base=($1) out=() i
    shift
    for ((i = 0; i < ${#base[@]}; i++)); do
        if [[ " $* " == *" ${base[i]} "* ]]; then i=$((i + 1)); else out+=("${base[i]}"); fi
    done
    echo "${out[@]}"
}

MOE="--preset qwen3-30b-a3b --hidden 64 --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --layers 1 --tokens 16 --vocab 512 --experts 8"
expect 0 "usage: [mpirun -np N] hyperpar bench run --preset P" -- "$HP" bench run --help
for p in llama-3-8b qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3; do
    check "--help lists $p" grep -q -- "^ .* $p " <<<"$("$HP" bench run --help)"
done
expect 0 "does not fit a 24 GiB machine" -- "$HP" bench run --help
expect 0 "hyperpar bench run --help" -- "$HP" bench --help

# One process: no collective (the bench takes no logits: nothing is gathered to rank 0).
out=$("$HP" bench run $SMALL --reps 2 2>&1 </dev/null)
check "1 process: exit 0" test $? -eq 0
check "1 process: tokens/s line" grep -q "forward   : .* ms median of 2 (min [0-9.]*, max [0-9.]*; slowest rank) -> .* tokens/s prefill" <<<"$out"
# Issue 40: the host's load at the start and the end, and the spread of the reps beside each median.
check "1 process: load line" grep -Eq "^  load      : 1-minute load average ([0-9]+\.[0-9]{2}|unknown) at start, ([0-9]+\.[0-9]{2}|unknown) at end \([0-9]+ cores?\)$" <<<"$out"
check "1 process: min <= median <= max in the text" python3 -c '
import re, sys
m = re.search(r"forward   : ([0-9.]+) ms median of 2 \(min ([0-9.]+), max ([0-9.]+);", sys.stdin.read())
med, lo, hi = map(float, m.groups())
assert lo <= med <= hi, (lo, med, hi)' <<<"$out"
check "1 process: no gather (no logits taken)" grep -q "gather         : none in this forward" <<<"$out"
check "1 process: GEMM limit line" grep -q "gemm limit: [0-9.]* GFLOP/s summed over the ranks (slowest [0-9.]*): a 2048^3 product through the GEMM layer in f32 .* the forward's GEMM rate is [0-9.]* of it (target >= 0.7)" <<<"$out"
grep -q "avx2 fma" <<<"$out" && check "1 process: cpu peak line" grep -q "cpu peak  : [0-9.]* GFLOP/s summed over the ranks: avx[0-9]* vfmadd231ps on registers only, every thread at once; the GEMM limit is [0-9.]* of it, the forward's GEMM rate [0-9.]*" <<<"$out"
check "1 process: resident line" grep -q "resident  : .* / tp 1 = .* ratio 1.0.* (target within 5%)" <<<"$out"
check "1 process: no all-gather" grep -q "all-gather     : none in this forward" <<<"$out"
check "1 process: PyTorch not measured" grep -q "PyTorch eager: not measured here (torch cannot be imported: false exited with status 1 on 'import torch')" <<<"$out"
check "1 process: the temporary checkpoint is gone" left
"$HP" bench run $SMALL --json --reps 1 >"$WORK/one.json" 2>/dev/null </dev/null
check "1 process: --json parses" python3 -m json.tool "$WORK/one.json" >/dev/null
check "1 process: --json has the resident ratio" grep -q '"resident_ratio": 1.0' "$WORK/one.json"
check "1 process: --json has the GEMM share" python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["gemm_limit_n"] == 2048 and d["gemm_limit_gflops"] > 0 and d["gemm_share"] > 0 and abs(d["gemm_share"] - d["gflops"] / d["gemm_limit_gflops"]) < 1e-3' "$WORK/one.json"
check "1 process: --json names what ran the GEMM limit" python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); i=d["gemm_limit_impl"]; assert i.startswith(("oneDNN ", "hyperpar ")) and len(i) > 8, i' "$WORK/one.json"
check "1 process: --json has the CPU's peak and its instruction" python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); i=d["peak_instruction"]; assert i in ("avx512 vfmadd231ps", "avx2 vfmadd231ps", "none (no avx2+fma)"), i; assert (d["peak_gflops"] > 0) == (i != "none (no avx2+fma)")' "$WORK/one.json"
check "1 process: --json: no PyTorch figures" grep -q '"pytorch_eager": null, "ratio_over_pytorch": null, "pytorch_note": "PyTorch eager: not measured here' "$WORK/one.json"
# spread FILE: the load pair and min <= median <= max of the forward (--reps 3, so the three can differ).
spread() {
    python3 - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("load_start", "load_end"):
    assert isinstance(d[k], (int, float)) and (d[k] >= 0 or d[k] == -1), (k, d[k])
assert 0 < d["min_s"] <= d["median_s"] <= d["max_s"], d
assert d["reps"] == 3, d["reps"]
EOF
}
"$HP" bench run $SMALL --json --reps 3 >"$WORK/three.json" 2>/dev/null </dev/null
check "1 process: --json has the load and the forward's spread" spread "$WORK/three.json"
expect 0 "dtype\": \"f32\"" -- "$HP" bench run $SMALL --dtype f32 --reps 1 --json
# --decode: the prefill, then one-token steps over the KV cache, against the read sweep and cost --mode decode
"$HP" bench run $SMALL --decode 4 --reps 1 --json >"$WORK/dec.json" 2>/dev/null </dev/null
check "decode: --json has the step, the read sweep and cost's prediction" python3 -c '
import json, sys
d = json.load(open(sys.argv[1])); x = d["decode"]
assert x["new_tokens"] == 4 and x["step_s"] > 0 and x["prefill_s"] > 0 and x["read_gbps"] > 0, x
assert x["tokens_per_s"] > 0 and x["kv_bytes"] > 0 and x["weight_bytes"] > 0, x
assert x["cost_read_bytes"] > 0 and x["cost_step_s"] > 0, x
assert x["cost_step_s"] >= x["cost_read_bytes"] / (x["read_gbps"] * 1e9) * (1 - 1e-4), x  # 6 digits printed
assert 0 < x["prefill_min_s"] <= x["prefill_s"] <= x["prefill_max_s"], x
assert 0 < x["step_min_s"] <= x["step_s"] <= x["step_max_s"], x
assert d["load_start"] >= 0 or d["load_start"] == -1, d' "$WORK/dec.json"
out=$("$HP" bench run $SMALL --decode 3 --reps 1 2>&1 </dev/null)
check "decode: text lines" grep -q "decode    : .* ms per step median .* tokens/s" <<<"$out"
check "decode: prefill line with its spread" grep -q "prefill   : 1 x 16 tokens in [0-9.]* ms (median of 1; min [0-9.]*, max [0-9.]*)" <<<"$out"
check "decode: load line" grep -q "load      : 1-minute load average .* at start, .* at end" <<<"$out"
check "decode: limit line" grep -q "limit     : read sweep .* GB/s .* decode at .* of it" <<<"$out"
check "decode: the temporary checkpoint is gone" left
expect 2 "--decode belongs to 'hyperpar bench run'" -- "$HP" bench train $SMALL --decode 3
# A vocabulary above gen's 65536 (Llama-3's 128256 is): the bench writes that checkpoint itself.
expect 0 "vocab above gen's limit" -- "$HP" bench run $(but "$SMALL" --vocab) --vocab 70000 --reps 1
check "big vocab: the temporary checkpoint is gone" left

# Two ranks, tp = 2: every collective kind the runtime uses next to its bare twin.
out=$($MPI -np 2 "$HP" bench run $SMALL --threads 1 2>&1 </dev/null)
check "2 ranks: exit 0" test $? -eq 0
check "2 ranks: tokens/s line" grep -q "tokens/s prefill" <<<"$out"
check "2 ranks: mesh tp=2" grep -q "mesh      : dp=1,cp=1,tp=2 (world 2), 2 ranks, MPI" <<<"$out"
check "2 ranks: all-gather ratio line" grep -q "all-gather     : runtime .* (tp group, same bytes and calls)   ratio bare/runtime" <<<"$out"
check "2 ranks: reduce-scatter ratio line" grep -q "reduce-scatter : runtime .* ratio bare/runtime" <<<"$out"
check "2 ranks: last-in line" grep -q "last rank in (no wait for a slower rank): runtime .* ratio bare/runtime" <<<"$out"
check "2 ranks: no gather (no logits taken)" grep -q "gather         : none in this forward" <<<"$out"
# synced KIND: KIND's lines have the synchronized figures (a barrier before each call)
synced() { grep -A2 "^  $1 *: runtime" <<<"$out" | grep -q "synchronized (a barrier before each call"; }
check "2 ranks: all-gather synchronized line" synced all-gather
check "2 ranks: resident line, tp 2" grep -q "resident  : .* / tp 2 = .* ratio 1.0" <<<"$out"
check "2 ranks: printed once" test "$(grep -c 'tokens/s prefill' <<<"$out")" -eq 1
check "2 ranks: the temporary checkpoint is gone" left
$MPI -np 2 "$HP" bench run $SMALL --threads 1 --reps 1 --json >"$WORK/two.json" 2>/dev/null </dev/null
check "2 ranks: --json parses" python3 -m json.tool "$WORK/two.json" >/dev/null
check "2 ranks: --json has the all-gather ratio" grep -q '"all-gather": {"bytes": [0-9]*, "calls": [1-9]' "$WORK/two.json"
$MPI -np 2 "$HP" bench run $SMALL --threads 1 --reps 3 --json >"$WORK/two3.json" 2>/dev/null </dev/null
check "2 ranks: --json has the load and the forward's spread (rank 0's, once)" spread "$WORK/two3.json"
expect 0 "mesh      : dp=2,cp=1,tp=1" -- $MPI -np 2 "$HP" bench run $SMALL --threads 1 --reps 1 --dp 2
# Without --threads (and without OMP_NUM_THREADS) the ranks of a node share its cores: never oversubscribed
# (test_threads.sh checks the counts).
expect 0 " per rank (" -- env -u OMP_NUM_THREADS $MPI -np 2 "$HP" bench run $SMALL --reps 1 --dp 2
expect 0 "threads   : 3 per rank (OMP_NUM_THREADS; " -- env OMP_NUM_THREADS=3 "$HP" bench run $SMALL --reps 1
expect 0 "(cp group, same bytes and calls)" -- $MPI -np 2 "$HP" bench run $SMALL --threads 1 --reps 1 --cp 2

# MoE, one process: the EP exchange (an EP group of one) is the all-to-all kind, next to its bare twin.
out=$("$HP" bench run $MOE --reps 2 2>&1 </dev/null)
check "moe 1 process: exit 0" test $? -eq 0
check "moe 1 process: moe line" grep -q "moe       : 8 experts (--experts; the preset has more), top-8, .* ep 1 " <<<"$out"
check "moe 1 process: phases line" grep -q "moe phases: route .*, dispatch .*, experts .*, return .*, combine .*, shared .* ms (summed over the 1 sparse layer" <<<"$out"
check "moe 1 process: all-to-all ratio line" grep -q "all-to-all     : runtime .* in 2 calls per rank; bare .* (ep group, same bytes and calls)   ratio bare/runtime" <<<"$out"
check "moe 1 process: resident against dense / tp + experts / ep" grep -Eq "resident  : .* dense .* / tp 1 \+ experts .* / ep 1 = .* ratio (0\.9[5-9]|1\.0[0-4])" <<<"$out"
check "moe 1 process: the temporary checkpoint is gone" left
# A vocabulary above gen's limit for a MoE family (gpt-oss: batched experts, router bias, sinks).
expect 0 "vocab above gen's limit" -- "$HP" bench run $(but "${MOE/qwen3-30b-a3b/gpt-oss-20b}" --vocab) --vocab 70000 --reps 1
# MoE, two ranks: TP-extend-EP over the tp group with the suggested compute declared.
out=$($MPI -np 2 "$HP" bench run $MOE --threads 1 2>&1 </dev/null)
check "moe 2 ranks: exit 0" test $? -eq 0
check "moe 2 ranks: ep = tp, compute declared" grep -q "ep 2 (TP-extend-EP, EP group: 2 consecutive ranks), compute declared by the 1 override" <<<"$out"
check "moe 2 ranks: all-to-all ratio line" grep -q "all-to-all     : runtime .* in 2 calls per rank; bare .* (ep group" <<<"$out"
check "moe 2 ranks: all-to-all synchronized line" test "$(grep -c "synchronized (a barrier before each call" <<<"$out")" -eq 4
check "moe 2 ranks: resident, experts / ep 2" grep -Eq "resident  : .* / tp 2 \+ experts .* / ep 2 = .* ratio (0\.9[5-9]|1\.0[0-4])" <<<"$out"
check "moe 2 ranks: the temporary checkpoint is gone" left
$MPI -np 2 "$HP" bench run $MOE --threads 1 --reps 1 --json >"$WORK/moe.json" 2>/dev/null </dev/null
check "moe 2 ranks: --json parses" python3 -m json.tool "$WORK/moe.json" >/dev/null
check "moe 2 ranks: --json has the all-to-all" grep -q '"all-to-all": {"bytes": [1-9][0-9]*, "calls": 2' "$WORK/moe.json"
check "moe 2 ranks: --json has the phases" grep -q '"moe": {"experts": 8, "experts_preset": 128, .*"ep": 2, "overrides": 1, .*"phases_s": {"route": ' "$WORK/moe.json"
# --ep 1 at tp 2: the plan cuts the experts over tp, which the runtime runs (the block's exit reduces).
expect 0 "all-to-all     : runtime" -- $MPI -np 2 "$HP" bench run $MOE \
    --threads 1 --reps 1 --ep 1
# DeepSeek-V3's MLA, routing groups and shared expert, one dense layer before the sparse one.
expect 0 "1 shared expert, 1 sparse layer of 2; ep 2" -- $MPI -np 2 "$HP" bench run $(but "${MOE/qwen3-30b-a3b/deepseek-v3}" --experts --layers) \
    --experts 16 --dense-layers 1 --layers 2 --threads 1 --reps 1
expect 2 "--experts 3 is not a multiple of ep 2" -- $MPI -np 2 "$HP" bench run $(but "${MOE/qwen3-30b-a3b/mixtral-8x7b}" --experts) --experts 3 --threads 1
check "moe failures: the temporary checkpoint is gone" left

# Failures end every rank with the cause, and leave no checkpoint behind.
expect 2 "the mesh dp=1,cp=1,tp=4 has 4 ranks but 2 processes run it" -- $MPI -np 2 "$HP" bench run $SMALL --tp 4
expect 2 "hidden_size 64 is not divisible by num_attention_heads 3" -- $MPI -np 2 "$HP" bench run $(but "$SMALL" --heads --kv-heads) --heads 3 --kv-heads 3 --threads 1
expect 2 "num_key_value_heads (1) is not divisible by tp (2)" -- $MPI -np 2 "$HP" bench run $(but "$SMALL" --kv-heads) --kv-heads 1 --threads 1
check "failures: the temporary checkpoint is gone" left
expect 2 "has 2 ranks but 1 process run it" -- "$HP" bench run $SMALL --tp 2
expect 1 "cannot create the temporary folder" -- env TMPDIR="$WORK/absent" "$HP" bench run $SMALL

# Bad options: exit 2 with the reason.
expect 2 "missing --preset (llama-3-8b, qwen3-30b-a3b, mixtral-8x7b, gpt-oss-20b, deepseek-v3)" -- "$HP" bench run --tokens 4
expect 2 "unknown preset 'llama'; known: llama-3-8b, qwen3-30b-a3b" -- "$HP" bench run --preset llama
expect 2 "llama-3-8b is dense: --ep, --experts and --dense-layers apply to the MoE presets" -- "$HP" bench run $SMALL --ep 2
expect 2 "llama-3-8b is dense" -- "$HP" bench run $SMALL --experts 8
expect 2 "--ep expects an integer in [1, 1048576], got '0'" -- "$HP" bench run $MOE --ep 0
expect 2 "--experts expects an integer in [1, 4096], got '4097'" -- "$HP" bench run $(but "$MOE" --experts) --experts 4097
expect 2 "--dense-layers expects an integer in [0, 1023], got '-1'" -- "$HP" bench run $MOE --dense-layers -1
expect 2 "--dense-layers applies to deepseek-v3" -- "$HP" bench run $MOE --dense-layers 0
expect 2 "--experts 4 is below qwen3-30b-a3b's top-8" -- "$HP" bench run $(but "$MOE" --experts) --experts 4
expect 2 "--experts 8 is too few for deepseek-v3's group-limited top-8" -- "$HP" bench run --preset deepseek-v3 --experts 8
expect 2 "--layers 2 has no sparse layer: deepseek-v3's first 3 layers are dense" -- "$HP" bench run --preset deepseek-v3 --experts 16 --layers 2
expect 2 "--tokens expects an integer in [1, 65536], got '0'" -- "$HP" bench run $(but "$SMALL" --tokens) --tokens 0
expect 2 "--vocab expects an integer in [1, 1048576], got '-3'" -- "$HP" bench run $(but "$SMALL" --vocab) --vocab -3
expect 2 "--layers expects an integer in [1, 1024], got 'x'" -- "$HP" bench run $(but "$SMALL" --layers) --layers x
expect 2 "--reps expects an integer in [1, 50], got '51'" -- "$HP" bench run $SMALL --reps 51
expect 2 "--threads expects an integer in [1, 1024], got '0'" -- "$HP" bench run $SMALL --threads 0
expect 2 "--tp expects an integer in [1, 1048576], got '0'" -- "$HP" bench run $SMALL --tp 0
expect 2 "--hidden expects an integer in [1, 65536], got '65537'" -- "$HP" bench run $(but "$SMALL" --hidden) --hidden 65537
expect 2 "--dtype must be bf16 or f32, got 'f16'" -- "$HP" bench run $SMALL --dtype f16
expect 2 "--heads 6 must be a multiple of --kv-heads 4" -- "$HP" bench run $(but "$SMALL" --heads --kv-heads) --heads 6 --kv-heads 4
expect 2 "unexpected argument 'extra'" -- "$HP" bench run $SMALL extra
expect 2 "" -- "$HP" bench run $SMALL --no-such-option
expect 2 "unknown benchmark 'walk'; known: moe, ep, run" -- "$HP" bench walk
finish

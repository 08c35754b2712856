# When nothing fits, say what would (issue 25, items 8 and 9): the binding constraint and the nearest changes,
# each a command line that is run here and must fit; advise --all lists every rejection; DeepSeek-V3 training on
# 256 x 80 GiB H100 with ZeRO-1 gets an answer.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
D=data/configs

# run_change LINE: runs a printed 'hyperpar ...' command line with this build (the words as a shell reads them)
run_change() { eval "\"\$HP\" ${1#hyperpar }"; }

# 1. DeepSeek-V3, 256 H100s, ZeRO-1, 4096 positions, a row per rank, micro-batches of 32 rows and selective
# recompute given (both kept: advise changes neither): the binding constraint and what fits
out=$("$HP" advise $D/deepseek-v3.json --world 256 --hardware H100 --mode train --zero 1 --seq 4096 --micro-batch 32 \
      --recompute selective 2>&1)
rc=$?
check "DeepSeek-V3 x 256 H100 ZeRO-1 --micro-batch 32: nothing fits (exit 2)" test $rc -eq 2
check "DeepSeek-V3: the --micro-batch and --recompute given are kept, and said so" \
    grep -q "^chosen   micro-batch 32 rows per replica (as given), recompute selective (as given); nothing fits" <<<"$out"
check "DeepSeek-V3: the binding constraint is named" grep -q "^binding constraint: gradients" <<<"$out"
check "DeepSeek-V3: figures for another engine" grep -qF "figures for a bf16 GPU engine (Megatron-style accounting), not hyperpar's runtime" <<<"$out"
cmds=$(grep -A1 -E "^  --(zero|recompute|micro-batch|seq|world|batch) " <<<"$out" | grep "^    hyperpar advise" | sed 's/^    //')
check "DeepSeek-V3: at least one change printed" test -n "$cmds"
while IFS= read -r line; do
    [ -z "$line" ] && continue
    res=$(run_change "$line" 2>&1)
    rc=$?
    check "the printed change fits when run: $line" test $rc -eq 0
    check "and has an accepted mesh: $line" grep -q "^  1 " <<<"$res"
done <<<"$cmds"
# the same question at the default (micro-batches of one row), with it given, and the budget spelled out: meshes
# that fit, each within the 72 GiB left of 80 after the 8 GiB reserve
for flags in "" "--micro-batch 1" "--mem-per-rank 80GiB"; do
    out=$("$HP" advise $D/deepseek-v3.json --world 256 --hardware H100 --mode train --zero 1 --seq 4096 \
          $flags --format json)
    check "DeepSeek-V3 x 256 H100 ZeRO-1 $flags: meshes that fit, each within 72 GiB" python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
ok = [c for c in d["candidates"] if c["ok"]]
sys.exit(0 if ok and all(c["max_bytes"] <= 72 << 30 and c["micro_batch"] == 1 for c in ok) and d["fit"] is None
         and d["engine"] == "estimate" and d["mem_per_rank"] == 80 << 30 and d["mem_usable"] == 72 << 30
         and d["chosen"]["relaxed"] is False else 1)' <<<"$out"
done

# 2. the JSON of a request nothing meets: the binding item, every change with its mesh and command
expect 2 "--world 32 " -- "$HP" advise $D/mixtral-8x7b.json --world 8 --hardware H100 --mode train --mem-per-rank 40GiB
out=$("$HP" advise $D/llama-3-8b.json --world 1 --mem-per-rank 12GiB --batch 1 --seq 1024 --format json 2>/dev/null)
check "advise JSON: fit with the binding item and a --world change" python3 -c '
import json, sys
f = json.loads(sys.argv[1])["fit"]
w = [c for c in f["changes"] if c["flag"] == "--world"]
sys.exit(0 if f["binding"] == "weights" and w and w[0]["value"] == "2" and w[0]["mesh"] and
         w[0]["bytes"] <= 12 << 30 and "--world 2" in w[0]["command"] else 1)' "$out"
line=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["fit"]["changes"][0]["command"])' "$out")
expect 0 "best first" -- run_change "${line/--format json/--format text}"

# 3. cost: a rank over its budget gets the binding item and the changes; each command, run, fits
for req in "llama-3-8b.json --tp 2 --mode train --hardware H100 --batch 8 --recompute none" \
           "llama-3-8b.json --tp 2 --dp 2 --mode train --hardware A100 --batch 8 --micro-batch 4 --mem-per-rank 100GiB" \
           "mixtral-8x7b.json --dp 4 --tp 2 --ep 2 --mode train --batch 4 --seq 2048 --mem-per-rank 300GiB" \
           "llama-3-8b.json --tp 2 --batch 64 --seq 8192 --mem-per-rank 40GiB"; do
    set -- $req
    out=$("$HP" cost $D/"$@" --format json)
    n=$(python3 -c '
import json, sys
f = json.loads(sys.argv[1])["fit"]
print(len(f["changes"]) if f and f["binding"] and f["total_bytes"] > f["budget"] else -1)' "$out")
    check "cost $*: does not fit, and says what would" test "${n:-0}" -gt 0
    for i in $(seq 0 $((${n:-0} - 1))); do
        line=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["fit"]["changes"][int(sys.argv[2])]["command"])' "$out" "$i")
        expect 0 "(fits)" -- run_change "${line/--format json/}"
    done
    expect 0 "nearest changes that fit" -- "$HP" cost $D/"$@"
done
# nothing single rescues it: the binding item, and what was tried
expect 0 "no single change found that fits (tried: a smaller --batch, a shorter --seq)" -- \
    "$HP" cost data/forward/llama --tp 2 --batch 2 --seq 16 --mem-per-rank 1MiB
expect 0 "binding constraint: activations" -- "$HP" cost data/forward/llama --tp 2 --batch 2 --seq 16 --mem-per-rank 1MiB
# with an input, its shape is the batch: no --seq or --batch change is offered (given --batch/--seq, --seq 4 fits;
# the budget holds the GEMM layer's 4 MiB and the tp group's shared window, 2 MiB at the least)
expect 0 "  --seq 4 " -- "$HP" cost data/forward/llama --tp 2 --batch 2 --seq 16 --mem-per-rank 6.2MiB
out=$("$HP" cost data/forward/llama --tp 2 --input data/forward/llama/forward_io.safetensors --mem-per-rank 6.2MiB \
      --format json)
check "an input's batch is kept: no --seq/--batch change" python3 -c '
import json, sys
f = json.loads(sys.stdin.read())["fit"]
sys.exit(0 if f and f["binding"] and all(c["flag"] not in ("--seq", "--batch") for c in f["changes"]) else 1)' <<<"$out"
# a rank that fits prints no changes (and the JSON's fit is null)
out=$("$HP" cost $D/llama-3-8b.json --tp 2 --mem-per-rank 80GiB --batch 1 --seq 512 --format json)
check "cost: a rank that fits has fit null" python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["fit"] is None else 1)' "$out"

# 4. advise --all: every candidate, accepted and rejected, in the text
out=$("$HP" advise $D/mixtral-8x7b.json --world 16 --mem-per-rank 70GiB --mode train --hardware H100 --micro-batch 1 --all 2>&1)
json=$("$HP" advise $D/mixtral-8x7b.json --world 16 --mem-per-rank 70GiB --mode train --hardware H100 --micro-batch 1 --format json 2>/dev/null)
read -r nok nrej <<<"$(python3 -c '
import json, sys
c = json.load(sys.stdin)["candidates"]
print(sum(x["ok"] for x in c), sum(not x["ok"] for x in c))' <<<"$json")"
check "advise --all: $nrej rejections, each with its reason" test "$(sed -n '/^rejected (all/,/^$/p' <<<"$out" | grep -cE '^  (pp=[^,]*,)?dp=')" -eq "$nrej"
check "advise --all: every accepted mesh ranked ($nok)" test "$(grep -cE '^  [0-9]+ +(pp=[^,]*,)?dp=' <<<"$out")" -eq "$nok"
check "some accepted, some rejected" test "$nok" -gt 0 -a "$nrej" -gt 12
check "advise without --all: at most 12 rejections" test "$("$HP" advise $D/mixtral-8x7b.json --world 16 --mem-per-rank 70GiB --mode train --hardware H100 --micro-batch 1 2>&1 | sed -n '/^rejected/,/^$/p' | grep -cE '^  (pp=[^,]*,)?dp=')" -le 12
# 5. no single change fits (Mixtral-8x7B training on 8 H100s with 40 GiB each: the experts' Adam state alone is past
# it on any 8-rank mesh, and ZeRO-1 has no expert-data-parallel group to shard it over): a change together with the
# lowest higher ZeRO level that makes it fit, in the text, the JSON ("with") and a command that fits when run.
# Without pipelines (--max-pp 1): a pipeline splits the experts over its stages, so with pp --world 32 alone fits.
out=$("$HP" advise $D/mixtral-8x7b.json --world 8 --hardware H100 --mode train --mem-per-rank 40GiB --max-pp 1 2>&1)
check "Mixtral x 8 H100: the pairs are announced" grep -q "none fits alone: each with the second flag" <<<"$out"
cmds=$(grep -A1 -E "^  --[a-z-]+ [^ ]+ --zero [123] " <<<"$out" | grep "^    hyperpar advise" | sed 's/^    //')
check "Mixtral x 8 H100: a change with --zero printed" test -n "$cmds"
while IFS= read -r line; do
    [ -z "$line" ] && continue
    check "the printed pair carries both flags once: $line" test "$(grep -o -- '--zero' <<<"$line" | wc -l)" -eq 1
    res=$(run_change "$line" 2>&1)
    check "the printed pair fits when run: $line" test $? -eq 0
done <<<"$cmds"
json=$("$HP" advise $D/mixtral-8x7b.json --world 8 --hardware H100 --mode train --mem-per-rank 40GiB --max-pp 1 \
    --format json 2>/dev/null)
check "advise JSON: each change's second flag under \"with\"" python3 -c '
import json, sys
f = json.loads(sys.argv[1])["fit"]
sys.exit(0 if f["changes"] and all(c["with"] and c["with"]["flag"] == "--zero" and int(c["with"]["value"]) >= 1
                                   and c["bytes"] <= 32 << 30 for c in f["changes"]) else 1)' "$json"
expect 2 "--world 32 " -- "$HP" advise $D/mixtral-8x7b.json --world 8 --hardware H100 --mode train --mem-per-rank 40GiB
out=$("$HP" advise $D/llama-3-8b.json --world 1 --mem-per-rank 12GiB --batch 1 --seq 1024 --format json 2>/dev/null)
check "a single change has \"with\": null" python3 -c '
import json, sys
sys.exit(0 if all(c["with"] is None for c in json.loads(sys.argv[1])["fit"]["changes"]) else 1)' "$out"
finish

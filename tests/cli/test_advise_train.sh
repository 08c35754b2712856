# advise and cost for training (issue 36 item 4):
#  1. --mode train runs micro-batches of 1 row per replica by default, in cost and advise alike; --micro-batch
#     given wins; a batch dp does not divide keeps one micro-batch of each replica's rows;
#  2. when no mesh fits, advise tries stronger recompute on a GPU (and smaller micro-batches below a larger one) and
#     says what it chose and why (text "chosen", JSON "chosen" and each candidate's micro_batch / recompute); a
#     --recompute or --micro-batch given is kept, and then "nothing fits" stands with the changes that would fit;
#  3. a GPU profile keeps a reserve of a tenth of its memory, --mem-reserve states another, in cost's fit check and
#     in advise, text and JSON;
#  4. --freeze under a GPU profile: frozen tensors have no gradient, optimizer state or master (cost and advise).
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
D=data/configs
GIB=1073741824

# 1. the default micro-batch: one row per replica
js() { "$HP" "$@" --format json 2>/dev/null; }
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(*[eval(e, {"d": d}) for e in sys.argv[1:]])' "$@"; }
read -r m n <<<"$(js cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --batch 8 --hardware H100 | field 'd["micro_batch"]' 'd["micro_batches"]')"
check "cost --mode train (H100): 1 row per replica, 8 / (1 x 2) = 4 micro-batches (got $m, $n)" test "$m $n" = "1 4"
read -r m n <<<"$(js cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --batch 8 | field 'd["micro_batch"]' 'd["micro_batches"]')"
check "cost --mode train (cpu): the same default (got $m, $n)" test "$m $n" = "1 4"
a=$(js cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --batch 8 --hardware H100 | field 'd["ranks"]')
b=$(js cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --batch 8 --hardware H100 --micro-batch 1 | field 'd["ranks"]')
check "cost: the default is --micro-batch 1" test "$a" = "$b"
read -r m n <<<"$(js cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --batch 8 --micro-batch 4 | field 'd["micro_batch"]' 'd["micro_batches"]')"
check "cost: --micro-batch 4 given wins (got $m, $n)" test "$m $n" = "4 1"
read -r m n <<<"$(js cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --batch 7 | field 'd["micro_batch"]' 'd["micro_batches"]')"
check "cost: 7 rows on dp=2 keep one micro-batch of each replica's rows (got $m, $n)" test "$m $n" = "4 1"
read -r m n <<<"$(js cost $D/llama-3-8b.json --dp 2 --tp 2 --batch 8 | field 'd["micro_batch"]' 'd["micro_batches"]')"
check "cost: inference has no micro-batches (got $m, $n)" test "$n" = "1"
out=$(js advise $D/llama-3-8b.json --world 8 --mode train --hardware H100 --batch 32)
check "advise: every candidate at 1 row per replica, the same as cost's default" python3 - "$out" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
c = [c for c in d["candidates"] if "micro_batch" in c]
ok = d["micro_batch"] == 1 and d["chosen"]["micro_batch"] == 1 and not d["chosen"]["relaxed"] and c and \
     all(x["micro_batch"] == 1 and x["micro_batches"] == 32 // x["dp"] for x in c)
sys.exit(0 if ok else 1)
PY
best=$(python3 -c 'import json,sys; c=json.loads(sys.argv[1])["candidates"][0]; print(c["dp"], c["cp"], c["tp"], c["max_bytes"])' "$out")
read -r dp cp tp mx <<<"$best"
tot=$(js cost $D/llama-3-8b.json --dp $dp --cp $cp --tp $tp --mode train --hardware H100 --batch 32 | field 'max(r["total_bytes"] for r in d["ranks"])')
check "advise's #1 ($dp x $cp x $tp) = cost with no --micro-batch: $mx vs $tot" python3 -c "import sys; sys.exit(0 if abs($mx - $tot) <= 0.02 * $tot else 1)"

# 2. nothing fits at recompute selective: advise chooses full and says why
A="$D/llama-3-8b.json --world 8 --seq 16384 --mem-per-rank 32GiB --zero 1 --mode train --hardware H100"
out=$("$HP" advise $A 2>&1)
check "advise: recompute full chosen, the reason printed" grep -q "^chosen   micro-batch 1 row per replica, recompute full: chosen by advise because nothing fitted with .*recompute selective" <<<"$out"
check "advise: the meshes that fit, ranked" grep -q "^  1 " <<<"$out"
check "advise: its cost command carries --recompute full" grep -q "^its own plan's figures: .*--recompute full" <<<"$out"
j=$(js advise $A)
check "advise JSON: chosen {micro_batch 1, recompute full, relaxed}, candidates at full" python3 - "$j" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
c = d["chosen"]
ok = (c["micro_batch"] == 1 and c["recompute"] == "full" and c["relaxed"] is True and "selective" in c["reason"]
      and d["hardware"]["recompute"] == "full" and d["fit"] is None
      and all(x["recompute"] == "full" for x in d["candidates"] if x["ok"]))
sys.exit(0 if ok else 1)
PY
expect 2 "no mesh of 8 ranks fits" -- "$HP" advise $A --recompute selective
out=$("$HP" advise $A --recompute selective 2>&1)
check "advise --recompute selective given: kept, and said so" grep -q "^chosen   .*recompute selective (as given); nothing fits, nothing else was tried; the --recompute given is kept" <<<"$out"
check "advise --recompute selective given: the change that fits is printed" grep -q "^  --recompute full" <<<"$out"
out=$("$HP" advise $A --micro-batch 1 2>&1)
check "advise --micro-batch 1 given: recompute may still change" grep -q "^chosen   micro-batch 1 row per replica, recompute full: chosen by advise" <<<"$out"
# cpu: no recompute to try
out=$("$HP" advise $D/llama-3-8b.json --world 2 --seq 8192 --mem-per-rank 40GiB --mode train 2>&1)
check "advise on cpu: nothing fits, no recompute tried" grep -q "^chosen   .*nothing fits, nothing else was tried (hyperpar's runtime has no recompute)" <<<"$out"

# 3. the memory reserve
j=$(js cost $D/llama-3-8b.json --tp 8 --mode train --hardware H100)
read -r res use bud <<<"$(field 'd["mem_reserve"]' 'd["mem_usable"]' 'd["mem_per_rank"]' <<<"$j")"
check "cost H100: reserve 8 GiB of 80, 72 usable (got $res $use $bud)" test "$res $use $bud" = "$((8 * GIB)) $((72 * GIB)) $((80 * GIB))"
check "cost H100: the hardware JSON states it" test "$(field 'd["hardware"]["mem_reserve"]' <<<"$j")" = $((8 * GIB))
res=$(js cost $D/llama-3-8b.json --tp 8 --mode train --hardware MI300X | field 'd["mem_reserve"]')
check "cost MI300X: a tenth of 192 GiB (got $res)" test "$res" = $((192 * GIB / 10))
res=$(js cost $D/llama-3-8b.json --tp 8 --mode train | field 'd["mem_reserve"]')
check "cost cpu: no reserve (got $res)" test "$res" = 0
res=$(js cost $D/llama-3-8b.json --tp 8 --mode train --hardware H100 --mem-reserve 2GiB | field 'd["mem_reserve"]')
check "cost --mem-reserve 2GiB wins (got $res)" test "$res" = $((2 * GIB))
res=$(js cost $D/llama-3-8b.json --tp 8 --mode train --hardware H100 --mem-reserve 0 | field 'd["mem_reserve"]')
check "cost --mem-reserve 0: none (got $res)" test "$res" = 0
expect 0 "less a reserve of 8.00 GiB" -- "$HP" cost $D/llama-3-8b.json --tp 8 --mode train --hardware H100
expect 0 "reserve  8.00 GiB per rank" -- "$HP" advise $D/llama-3-8b.json --world 8 --mode train --hardware H100
expect 2 "--mem-reserve 80.00 GiB is all of the budget" -- "$HP" cost $D/llama-3-8b.json --tp 8 --hardware H100 --mem-reserve 80GiB
expect 2 "--mem-reserve expects a size" -- "$HP" cost $D/llama-3-8b.json --tp 8 --hardware H100 --mem-reserve lots
# the fit check: a rank between the usable part and the whole budget does not fit, and fits without the reserve
tot=$(field 'max(r["total_bytes"] for r in d["ranks"])' <<<"$j")
bud=$(( (tot + 2 * GIB) / GIB ))GiB
expect 0 "does NOT fit" -- "$HP" cost $D/llama-3-8b.json --tp 8 --mode train --hardware H100 --mem-per-rank $bud
expect 0 "(fits)" -- "$HP" cost $D/llama-3-8b.json --tp 8 --mode train --hardware H100 --mem-per-rank $bud --mem-reserve 1GiB
f=$(js cost $D/llama-3-8b.json --tp 8 --mode train --hardware H100 --mem-per-rank $bud | field 'd["fit"]["reserve"]')
check "cost's fit JSON states the reserve (got $f)" test "$f" = $((8 * GIB))
j=$(js advise $D/llama-3-8b.json --world 8 --mode train --hardware H100 --mem-reserve 4GiB)
check "advise JSON: mem_reserve and mem_usable, every accepted mesh within the usable part" python3 - "$j" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
ok = d["mem_reserve"] == 4 << 30 and d["mem_usable"] == 76 << 30 and \
     all(c["max_bytes"] <= d["mem_usable"] for c in d["candidates"] if c["ok"])
sys.exit(0 if ok else 1)
PY

# 4. --freeze under a GPU profile: the frozen tensors' gradient, optimizer state and master are gone
st() { js cost $D/llama-3-8b.json --dp 2 --tp 2 --mode train --zero 1 --hardware H100 "$@" | field 'd["ranks"][0]["grad_bytes"]' 'd["ranks"][0]["optim_bytes"]' 'd["ranks"][0]["master_bytes"]' 'd["ranks"][0]["weight_bytes"]'; }
read -r g0 o0 m0 w0 <<<"$(st)"
read -r g1 o1 m1 w1 <<<"$(st --freeze model.embed_tokens.weight)"
E=$((128256 * 4096 / 2)) # the embedding's elements on a tp=2 rank; ZeRO-1 over dp=2 halves its state
check "freeze embed (H100): gradients -4 x $E, optimizer -8 x $E / 2, master -4 x $E / 2, weights kept" \
    test "$((g0 - g1)) $((o0 - o1)) $((m0 - m1)) $w1" = "$((4 * E)) $((4 * E)) $((2 * E)) $w0"
read -r g2 o2 m2 w2 <<<"$(st --freeze 'model.layers.*')"
check "freeze every layer (H100): the state of the embedding, head and final norm only" \
    test "$g2" -lt "$((g0 / 5))" -a "$w2" = "$w0"
ev() { js cost $D/mixtral-8x7b.json --dp 2 --tp 2 --ep 4 --ep-axis --mode train --hardware H100 "$@" | field 'sum(e["bytes"] for e in d["events"] if e["where"] == "expert gradients")' 'd["ranks"][0]["grad_bytes"]'; }
read -r e0 g0 <<<"$(ev)"
read -r e1 g1 <<<"$(ev --freeze 'model.layers.*.block_sparse_moe.experts.*')"
check "freeze the experts (mixtral, ep axis): no expert gradient all-reduce ($e0 -> $e1), fewer gradients" \
    test "$e0" -gt 0 -a "$e1" = 0 -a "$g1" -lt "$g0"
adv() { js advise $D/llama-3-8b.json --world 8 --mode train --hardware H100 --zero 1 "$@" | field 'min(c["state_bytes"] for c in d["candidates"] if c["ok"])'; }
s0=$(adv)
s1=$(adv --freeze 'model.layers.*')
check "advise --freeze (H100): less training state ($s0 -> $s1)" test "$s1" -lt "$s0"
finish

#!/bin/bash
# Issue 25, items 2-5: a shard folder remembers its mesh, plan and EP compute (run without flags; a contradicting
# flag refused naming both values; an edited plan.json refused; an older folder without one still runs on its
# mesh); --mesh tp=2,ep=2 is read the same way by every command, and plan --world names TP-extend-EP's rule;
# --ep-compute suggested|ARCHETYPE equals the YAML with that archetype (cmp of the outputs), is refused for a
# dense model by every command with one text, and the missing-compute refusal names the flag and the command;
# whatever plan -o writes from every override fixture, run --plan, shard --plan and cost --plan read, and run
# --plan gives the bytes run --overrides gives; a planner warning is printed once under mpirun.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
F=data/forward
MPI="timeout 180 mpirun --allow-run-as-root --oversubscribe"
Q=$F/qwen3_moe
QI=$Q/forward_io.safetensors

# ---- item 4: --ep-compute ----
cat >"$WORK/q3ep.yaml" <<'Y'
- match: "model.layers.*.mlp"
  when: ep
  region_dispatch: false
  local_compute_fn:
    _target_: qwen3moe_topk_router
Y
"$HP" plan $Q --tp 2 --ep 2 --overrides "$WORK/q3ep.yaml" -o "$WORK/yaml.plan.json" 2>/dev/null
"$HP" plan $Q --tp 2 --ep 2 --ep-compute suggested -o "$WORK/flag.plan.json" 2>/dev/null
check "plan: --ep-compute suggested writes the plan the YAML writes" cmp -s "$WORK/yaml.plan.json" "$WORK/flag.plan.json"
"$HP" plan $Q --tp 2 --ep 2 --ep-compute qwen3moe_ep_compute_fn -o "$WORK/key.plan.json" 2>/dev/null
check "plan: --ep-compute with a factory path's suffix is the same" cmp -s "$WORK/yaml.plan.json" "$WORK/key.plan.json"
$MPI -np 2 "$HP" run $Q --input $QI --tp 2 --ep 2 --overrides "$WORK/q3ep.yaml" -o "$WORK/yaml.st" >/dev/null 2>&1 </dev/null
expect 0 "topk_idx 0 of" -- $MPI -np 2 "$HP" run $Q --input $QI --tp 2 --ep 2 --ep-compute suggested -o "$WORK/flag.st" \
    --compare $QI
check "run: --ep-compute suggested gives the bytes the YAML gives" cmp -s "$WORK/yaml.st" "$WORK/flag.st"
# Refused for a dense model, the same text from every command that takes plan flags (advise: before any mesh).
for cmd in plan shard cost; do
    extra=""
    [ $cmd = shard ] && extra="--out $WORK/never"
    expect 2 "--ep-compute suggested: $F/llama is a dense model" -- "$HP" $cmd $F/llama --tp 2 --ep-compute suggested $extra
done
expect 2 "--ep-compute suggested: data/configs/llama-3-8b.json is a dense model" -- \
    "$HP" advise data/configs/llama-3-8b.json --world 4 --mem-per-rank 80GiB --ep-compute suggested
expect 2 "is a dense model (llama)" -- $MPI -np 2 "$HP" run $F/llama --input $F/llama/forward_io.safetensors --tp 2 \
    --ep-compute suggested
check "shard left no folder after the refusal" test ! -e "$WORK/never"
expect 2 "--ep-compute 'nonesuch' is not an EP compute archetype; give suggested (this family's: qwen3moe_topk_router)" \
    -- "$HP" plan $Q --tp 2 --ep 2 --ep-compute nonesuch
expect 2 "archetype 'deepseekv3_sigmoid_group_shared' does not fit module 'model.layers.0.mlp': missing submodule(s) shared_experts" \
    -- "$HP" plan $F/qwen2_moe --tp 2 --ep 2 --ep-compute deepseekv3_sigmoid_group_shared
expect 2 "contradicts the overrides, which declare local_compute_fn qwen3moe_topk_router" -- \
    "$HP" plan $Q --tp 2 --ep 2 --overrides "$WORK/q3ep.yaml" --ep-compute mixtral_topk_router
# The refusal without a compute names the flag and the command that ran.
for cmd in run validate; do
    out=$($MPI -np 2 "$HP" $cmd $Q --input $QI --tp 2 --ep 2 2>&1 </dev/null)
    check "$cmd: the missing EP compute names 'hyperpar $cmd ... --ep-compute suggested'" \
        grep -qF "declare it with: hyperpar $cmd ... --ep-compute suggested (this family's archetype qwen3moe_topk_router)" <<<"$out"
    check "$cmd: ... and the overrides file" grep -qF "pass it with: hyperpar $cmd ... --overrides FILE" <<<"$out"
    check "$cmd: printed once" test "$(grep -c 'declare it with' <<<"$out")" -eq 1
done
out=$($MPI -np 2 "$HP" train $Q --input $QI --steps 1 --tp 2 --ep 2 2>&1 </dev/null)
check "train: the missing EP compute names 'hyperpar train'" grep -qF "hyperpar train ... --ep-compute suggested" <<<"$out"
expect 0 "" -- $MPI -np 2 "$HP" train $Q --input $QI --steps 1 --tp 2 --ep 2 --ep-compute suggested
# advise's commands carry it.
out=$("$HP" advise data/configs/qwen3-30b-a3b.json --world 8 --mem-per-rank 80GiB --batch 1 --format json 2>/dev/null)
check "advise: the commands of EP candidates carry --ep-compute suggested" \
    grep -qF -- "--tp 2 --ep 2 --ep-compute suggested -o plan.json" <<<"$out"
check "advise: those of candidates without EP do not" bash -c '! grep -qE -- "--tp [0-9]+ --ep-compute" <<<"$1"' _ "$out"
cmdline=$(grep -o '"command": "hyperpar plan [^"]*--ep 2 --ep-compute suggested' <<<"$out" | head -1 | sed 's/^"command": "hyperpar //')
# shellcheck disable=SC2086
expect 0 "" -- "$HP" $cmdline -o "$WORK/advised.plan.json"
check "advise: its printed plan command declares the EP compute" grep -q '"_target_": "qwen3moe_topk_router"' "$WORK/advised.plan.json"

# ---- item 2: a shard folder remembers its mesh, plan and EP compute ----
"$HP" shard $Q --dp 2 --tp 2 --ep 2 --ep-compute suggested --out "$WORK/s4" --quiet >/dev/null 2>&1
check "shard writes plan.json beside the rank files" test -s "$WORK/s4/plan.json"
expect 0 "topk_idx 0 of" -- $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --compare $QI
expect 0 "OK" -- $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --dp 2 --tp 2 --ep 2 --compare $QI
expect 2 "--tp 4 contradicts the shard folder's tp=2" -- $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --tp 4
expect 2 "--ep 4 contradicts the shard folder's ep=2" -- $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --ep 4
expect 2 "--dp 1 contradicts the shard folder's dp=2" -- $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --dp 1
expect 2 "--mesh tp=2,ep=2 gives dp=1, which contradicts the shard folder's dp=2" -- \
    $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --mesh tp=2,ep=2
expect 2 "which contradicts the shard folder's dp=2,cp=1,tp=2 (world 4), ep=2 (TP-extend-EP)" -- \
    $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --mesh dp=2,tp=2,ep=2
expect 2 "--ep-axis (an explicit ep axis) contradicts the shard folder's TP-extend-EP" -- \
    $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --dp 2 --tp 2 --ep 2 --ep-axis
expect 2 "--ep-compute mixtral_topk_router gives 'model.layers.0.mlp' the EP compute mixtral_topk_router, which contradicts the shard folder's qwen3moe_topk_router" -- \
    $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --ep-compute mixtral_topk_router
expect 2 "the plan flags give sequence_parallel=false, which contradicts the shard folder's plan" -- \
    $MPI -np 4 "$HP" run "$WORK/s4" --input $QI --no-sequence-parallel
expect 0 "train:" -- $MPI -np 4 "$HP" train "$WORK/s4" --input $QI --steps 1
# A folder sharded without an EP compute (shard warns) is refused by run naming the flag, which then completes it.
out=$("$HP" shard $Q --dp 2 --tp 2 --ep 2 --out "$WORK/s4bare" --quiet 2>&1)
check "shard warns of the missing EP compute, naming --ep-compute" grep -qF "hyperpar shard ... --ep-compute suggested" <<<"$out"
expect 2 "declare it with: hyperpar run ... --ep-compute suggested" -- $MPI -np 4 "$HP" run "$WORK/s4bare" --input $QI
expect 0 "topk_idx 0 of" -- $MPI -np 4 "$HP" run "$WORK/s4bare" --input $QI --ep-compute suggested --compare $QI
# cost takes the folder too: the figures of its plan, the same as the flags it was sharded with give.
a=$("$HP" cost "$WORK/s4" --format json 2>/dev/null | sed 's|"model[_a-z]*": "[^"]*"||g')
z=$("$HP" cost $Q --dp 2 --tp 2 --ep 2 --ep-compute suggested --format json 2>/dev/null | sed 's|"model[_a-z]*": "[^"]*"||g')
check "cost of the shard folder is the cost of its plan" test -n "$a" -a "$a" = "$z"
expect 2 "--tp 4 contradicts the shard folder's tp=2" -- "$HP" cost "$WORK/s4" --tp 4
# Dense tp=2 at two ranks; an edited plan.json is refused; an older folder (no plan.json) runs on its mesh.
L=$F/llama
LI=$L/forward_io.safetensors
"$HP" shard $L --tp 2 --out "$WORK/l2" --quiet >/dev/null 2>&1
expect 0 "OK" -- $MPI -np 2 "$HP" run "$WORK/l2" --input $LI --compare $LI
expect 2 "--tp 1 contradicts the shard folder's tp=2" -- $MPI -np 2 "$HP" run "$WORK/l2" --input $LI --tp 1
expect 2 "the plan's mesh has 2 ranks but 4 processes run it" -- $MPI -np 4 "$HP" run "$WORK/l2" --input $LI
cp -r "$WORK/l2" "$WORK/l2edit"
sed -i 's/"loss_parallel": false/"loss_parallel": true/' "$WORK/l2edit/plan.json"
expect 2 "plan.json changed after sharding" -- $MPI -np 2 "$HP" run "$WORK/l2edit" --input $LI
cp -r "$WORK/l2" "$WORK/l2old"
rm "$WORK/l2old/plan.json"
sed -z -i 's/,\n *"stored": "plan.json"//' "$WORK/l2old/manifest.json"
check "the older folder's manifest records no stored plan" bash -c '! grep -q stored "$1"' _ "$WORK/l2old/manifest.json"
expect 0 "OK" -- $MPI -np 2 "$HP" run "$WORK/l2old" --input $LI --compare $LI
rm "$WORK/l2/plan.json"
expect 2 "plan.json is missing: the folder's manifest.json records its plan there" -- \
    $MPI -np 2 "$HP" run "$WORK/l2" --input $LI

# ---- item 3: --mesh tp=2,ep=2 is an explicit ep axis for every command; --ep rides on the tp ranks ----
M=$F/mixtral
MI=$M/forward_io.safetensors
MOV=data/overrides/mixtral_ep.yaml
expect 0 "" -- "$HP" plan $M --mesh tp=2,ep=2 --ep-compute suggested -o "$WORK/mx.plan.json"
expect 0 "ep-axis" -- grep -F '"ep_mode": "ep-axis"' "$WORK/mx.plan.json"
expect 0 "" -- "$HP" cost $M --mesh tp=2,ep=2 --ep-compute suggested
"$HP" shard $M --mesh tp=2,ep=2 --ep-compute suggested --out "$WORK/mx" --quiet >/dev/null 2>&1
$MPI -np 4 "$HP" run $M --input $MI --mesh tp=2,ep=2 --ep-compute suggested -o "$WORK/mx.a.st" >/dev/null 2>&1 </dev/null
$MPI -np 4 "$HP" run $M --input $MI --mesh tp=2,ep=2 --ep-axis --ep-compute suggested -o "$WORK/mx.b.st" >/dev/null 2>&1 </dev/null
check "run: --mesh tp=2,ep=2 is --mesh tp=2,ep=2 --ep-axis" cmp -s "$WORK/mx.a.st" "$WORK/mx.b.st"
expect 0 "topk_idx 0 of" -- $MPI -np 4 "$HP" run "$WORK/mx" --input $MI --compare $MI
expect 0 "OK" -- $MPI -np 4 "$HP" run $M --input $MI --mesh tp=2,ep=2 --overrides $MOV --compare $MI
expect 0 "" -- $MPI -np 4 "$HP" validate $M --input $MI --mesh tp=2,ep=2 --ep-compute suggested
expect 2 "--ep 2 adds no ranks: TP-extend-EP rides on the ranks of the dense region (dp x cp x tp = 2)" -- \
    "$HP" plan $M --tp 2 --ep 2 --world 4
expect 2 "For 4 ranks, --dp 2 --tp 2 --ep 2 was meant (or an ep axis of its own ranks: --mesh tp=2,ep=2)" -- \
    "$HP" plan $M --tp 2 --ep 2 --world 4
expect 2 "--dp 2 --tp 2 --ep 2 was meant" -- $MPI -np 4 "$HP" run $M --input $MI --tp 2 --ep 2 --ep-compute suggested
# qwen3_moe's fused experts cut over tp need --packed-fused: every command refuses the mesh alike, at plan time.
for cmd in plan cost; do
    expect 2 "would be split contiguously over tp=2" -- "$HP" $cmd $Q --mesh tp=2,ep=2 --ep-compute suggested
done
expect 2 "would be split contiguously over tp=2" -- "$HP" shard $Q --mesh tp=2,ep=2 --ep-compute suggested --out "$WORK/never"
expect 2 "would be split contiguously over tp=2" -- $MPI -np 4 "$HP" run $Q --input $QI --mesh tp=2,ep=2 --ep-compute suggested

# ---- item 5: whatever plan -o writes, every command reads ----
cat >"$WORK/gate.yaml" <<'Y'
- match: "model.layers.*.mlp"
  params: {gate.weight: {tp: replicate}}
Y
for ov in data/overrides/*.yaml "$WORK/gate.yaml"; do
    name=$(basename "$ov" .yaml)
    case $name in
    attn_* | mlp_*) model=$L flags="--tp 2" ;;
    gate) model=$Q flags="--tp 2 --ep 2 --ep-compute suggested" ;;
    deepseek_v3_*) model=$F/deepseek_v3 flags="--tp 2 --ep 2" ;;
    *) model=$F/${name%_ep} flags="--tp 2 --ep 2" ;;
    esac
    P="$WORK/$name.plan.json"
    out=$("$HP" plan $model $flags --overrides "$ov" -o "$P" 2>&1)
    check "$name: plan -o exits 0 ($out)" test -s "$P"
    check "$name: the stripped-params warning is not claimed for kept experts" bash -c '! grep -q "strips the derived sharding from .*experts" <<<"$1"' _ "$out"
    a=$($MPI -np 2 "$HP" run $model --input $model/forward_io.safetensors --plan "$P" -o "$WORK/$name.plan.st" 2>&1 </dev/null)
    ra=$?
    z=$($MPI -np 2 "$HP" run $model --input $model/forward_io.safetensors $flags --overrides "$ov" -o "$WORK/$name.ov.st" \
        2>&1 </dev/null)
    rz=$?
    check "$name: run --plan reads the plan (no 'regenerate')" bash -c '! grep -q "regenerate it" <<<"$1"' _ "$a"
    check "$name: run --plan exits as run --overrides does ($ra, $rz)" test $ra -eq $rz
    if [ $rz -eq 0 ]; then
        check "$name: run --plan gives the bytes run --overrides gives" cmp -s "$WORK/$name.plan.st" "$WORK/$name.ov.st"
    else # a contract the runtime refuses (attn_out_feature_shard): the same refusal both ways
        check "$name: run --plan refuses as run --overrides does" test "$(grep error: <<<"$a")" = "$(grep error: <<<"$z")"
    fi
    expect 0 "" -- "$HP" shard $model --plan "$P" --out "$WORK/$name.shards" --quiet
    expect 0 "" -- "$HP" cost $model --plan "$P"
done
# The gate-only override keeps the experts spread over ep: the plan's stacks are its params too.
check "gate.yaml: the plan keeps the experts on ep" grep -q '"experts.gate_up_proj"' "$WORK/gate.plan.json"
expect 2 "is not one the runtime lowers" -- $MPI -np 2 "$HP" run $L --input $LI --plan "$WORK/attn_out_feature_shard.plan.json"
# A planner warning is printed once under mpirun (rank 0).
cat >"$WORK/nomatch.yaml" <<'Y'
- match: "model.nothing.*"
  out_dst: {output: {tp: replicate}}
Y
out=$($MPI -np 2 "$HP" run $L --input $LI --tp 2 --overrides "$WORK/nomatch.yaml" 2>&1 </dev/null)
check "a planner warning under mpirun -np 2 is printed once" test "$(grep -c 'warning:' <<<"$out")" -eq 1
finish

# plan --overrides / --suggest-overrides / --no-derive end to end.
source "$(dirname "$0")/lib.sh"
D="$TESTS/data"
expect 0 "_target_: qwen3moe_topk_router" -- "$HP" plan "$D/golden/qwen3_moe_batched_bf16" --tp 2 --ep 2 --suggest-overrides
"$HP" plan "$D/golden/qwen3_moe_batched_bf16" --tp 2 --ep 2 --suggest-overrides > "$WORK/ov.yaml"
expect 0 "injection: local_compute_fn=qwen3moe_topk_router; region_dispatch=False" -- \
    "$HP" plan "$D/golden/qwen3_moe_batched_bf16" --tp 2 --ep 2 --overrides "$WORK/ov.yaml" --format explain
expect 0 '"_target_": "deepseekv3_sigmoid_group_shared"' -- \
    "$HP" plan "$D/golden/deepseek_v3_per_expert_f32" --tp 2 --ep 2 --overrides "$D/overrides/deepseek_v3_ep.yaml"
(cd "$TESTS" && "$HP" plan data/golden/mixtral_per_expert_f32 --tp 2 --ep 2 --overrides data/overrides/mixtral_ep.yaml) > "$WORK/m.json"
check "golden mixtral plan via the CLI" cmp -s "$WORK/m.json" "$D/plans/mixtral_tp2_ep2.json"
printf -- '- match: model.layers.0.self_attn\n  params: {q_proj.weight: {tp: shard(x)}}\n' > "$WORK/bad.yaml"
expect 2 "bad.yaml:2:" -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --overrides "$WORK/bad.yaml"
printf -- '- match: model.layers.0.selfattn\n  region_dispatch: false\n' > "$WORK/typo.yaml"
expect 2 "named_modules" -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --overrides "$WORK/typo.yaml"
expect 2 "cannot open" -- "$HP" plan "$D/configs/llama-3-8b.json" --overrides "$WORK/missing.yaml"
printf -- '- match: model.layers.0.mlp\n  params: {gate_proj.weight: {tp: shard(0)}, up_proj.weight: {tp: shard(0)}, down_proj.weight: {tp: shard(1)}}\n  in_src: {hidden_states: {tp: replicate}}\n  in_dst: {hidden_states: {tp: replicate}}\n  out_src: {tp: partial}\n  out_dst: {tp: replicate}\n' > "$WORK/only.yaml"
expect 0 '"boundaries": [' -- "$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --no-derive --overrides "$WORK/only.yaml"
n=$("$HP" plan "$D/configs/llama-3-8b.json" --tp 2 --no-derive --overrides "$WORK/only.yaml" | grep -c '"fqn"')
check "derive=false plan holds only the override (got $n boundaries)" test "$n" -eq 1
# Issue 10, item 16: the top level holds plan_overrides only; a null document or list is refused; a malformed
# glob is an error at parse time, with its position.
L="$D/configs/llama-3-8b.json"
printf 'plan_overrides:\n  - match: model.norm\n    params: {weight: {tp: replicate}}\nbogus: 1\n' > "$WORK/top.yaml"
expect 2 "top.yaml:4:8: unknown top-level key 'bogus'; the only top-level key is plan_overrides" -- "$HP" plan "$L" --tp 2 --overrides "$WORK/top.yaml"
printf '~\n' > "$WORK/null.yaml"
expect 2 "null.yaml:1:1: the overrides document is null" -- "$HP" plan "$L" --tp 2 --overrides "$WORK/null.yaml"
printf 'plan_overrides: ~\n' > "$WORK/nulllist.yaml"
expect 2 "plan_overrides is null" -- "$HP" plan "$L" --tp 2 --overrides "$WORK/nulllist.yaml"
printf -- '- match: "[*"\n  params: {}\n' > "$WORK/glob.yaml"
expect 2 "glob.yaml:1:10: match '[*' is not a valid glob" -- "$HP" plan "$L" --tp 2 --overrides "$WORK/glob.yaml"
printf '[]\n' > "$WORK/none.yaml"
expect 0 '"boundaries": [' -- "$HP" plan "$L" --tp 2 --overrides "$WORK/none.yaml"
expect 2 "no override entry was given" -- "$HP" plan "$L" --tp 2 --no-derive --overrides "$WORK/none.yaml"
printf -- '- match: model.norm\n  when: cp\n  params: {weight: {tp: replicate}}\n' > "$WORK/inactive.yaml"
expect 2 "no override entry applied" -- "$HP" plan "$L" --tp 2 --no-derive --overrides "$WORK/inactive.yaml"
expect 2 "--overrides is given twice" -- "$HP" plan "$L" --tp 2 --overrides "$WORK/none.yaml" --overrides "$WORK/only.yaml"
expect 2 "is one of the inputs" -- "$HP" plan "$L" --tp 2 --overrides "$WORK/only.yaml" -o "$WORK/only.yaml"
check "the overrides file is untouched" grep -q "match: model.layers.0.mlp" "$WORK/only.yaml"
finish

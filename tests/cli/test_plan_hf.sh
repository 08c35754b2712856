# plan --format hf --hf-version: the style names of the transformers release asked for, its misuse exit 2.
source "$(dirname "$0")/lib.sh"
F="$TESTS/data/forward"
L="$TESTS/data/configs/llama-3-8b.json"
M="$F/qwen3_moe"
# Default: the names of 5.25 (grouped_gemm + ep_dispatch_experts, no router key) and the DistributedConfig form.
expect 0 '"transformers_version": "5.25.0"' -- "$HP" plan "$M" --tp 2 --ep 2 --format hf
expect 0 '"model.layers.*.mlp.experts": "ep_dispatch_experts"' -- "$HP" plan "$M" --tp 2 --ep 2 --format hf
expect 0 '"ep_size": 2' -- "$HP" plan "$M" --tp 2 --ep 2 --format hf
"$HP" plan "$M" --tp 2 --ep 2 --format hf > "$WORK/default.json"
"$HP" plan "$M" --tp 2 --ep 2 --format hf --hf-version 5.25 > "$WORK/525.json"
check "no --hf-version is 5.25" cmp -s "$WORK/default.json" "$WORK/525.json"
check "5.25 refuses ep_router: none written" bash -c "! grep -q ep_router '$WORK/525.json'"
# Before 5.23: router masking, the old names.
expect 0 '"layers.*.mlp.gate": "ep_router"' -- "$HP" plan "$M" --tp 2 --ep 2 --format hf --hf-version 5.22.2
expect 0 '"layers.*.mlp.experts": "moe_tp_experts"' -- "$HP" plan "$M" --tp 2 --ep 2 --format hf --hf-version 5.20
# A style the release lacks is listed, never written: 5.28 drops moe_tp_experts.
expect 0 "style 'moe_tp_experts' is not in the registry of transformers 5.28.0" -- \
    "$HP" plan "$TESTS/data/golden/qwen3_moe_batched_bf16" --tp 2 --packed-fused --format hf --hf-version 5.28
# -o writes the same bytes.
"$HP" plan "$L" --tp 2 --format hf --hf-version 5.16 -o "$WORK/516.json"
"$HP" plan "$L" --tp 2 --format hf --hf-version 5.16 > "$WORK/516b.json"
check "-o and stdout agree" cmp -s "$WORK/516.json" "$WORK/516b.json"
check "5.16 has no DistributedConfig form" bash -c "! grep -q distributed_config '$WORK/516.json'"
# Misuse: exit 2, the accepted forms named.
expect 2 "--hf-version: transformers version 'abc' does not parse: give MAJOR.MINOR or MAJOR.MINOR.PATCH" -- \
    "$HP" plan "$L" --tp 2 --format hf --hf-version abc
expect 2 "transformers version '5.x' does not parse" -- "$HP" plan "$L" --tp 2 --format hf --hf-version 5.x
expect 2 "transformers version '5.26.0.dev0' does not parse" -- "$HP" plan "$L" --tp 2 --format hf --hf-version 5.26.0.dev0
expect 2 "transformers version '' does not parse" -- "$HP" plan "$L" --tp 2 --format hf --hf-version ""
expect 2 "transformers 4.57.0 is older than 5.0" -- "$HP" plan "$L" --tp 2 --format hf --hf-version 4.57
expect 2 "--hf-version names the transformers release that --format hf writes for; add --format hf" -- \
    "$HP" plan "$L" --tp 2 --hf-version 5.25
expect 2 "--hf-version names the transformers release that --format hf writes for" -- \
    "$HP" plan "$L" --tp 2 --format explain --hf-version 5.25
expect 2 "--hf-version is given twice" -- "$HP" plan "$L" --tp 2 --format hf --hf-version 5.25 --hf-version 5.22
# The version is checked before the model is read.
expect 2 "transformers version 'abc' does not parse" -- "$HP" plan "$WORK/none" --format hf --hf-version abc
expect 0 "--hf-version V" -- "$HP" plan --help
check "nothing written on a refusal" bash -c "! '$HP' plan '$L' --tp 2 --format hf --hf-version abc -o '$WORK/bad.json' 2>/dev/null; ! test -e '$WORK/bad.json'"
finish

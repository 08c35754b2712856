#!/usr/bin/env bash
# make_bf16_refs.sh — writes tests/data/bf16/FAMILY.json, the reference of tests/cli/test_train_compute.sh:
# bench/train_ref.py --compute bf16 (PyTorch autograd, every product's operands rounded to bf16) on the tiny
# checkpoint tests/data/forward/FAMILY and the 65 tokens of tests/data/bf16/tokens.bin (ids (5i + i div 7) mod 100),
# step 1's loss and each gradient's [norm, signed sum]. Needs python3 with torch and transformers (PYTHON).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
for fam in "${@:-llama qwen3_moe gpt_oss}"; do
    for f in $fam; do
        "$PYTHON" "$ROOT/bench/train_ref.py" "$ROOT/tests/data/forward/$f" --data "$ROOT/tests/data/bf16/tokens.bin" \
            --seq 16 --global-batch 4 --shuffle none --steps 1 --compute bf16 \
            --grad-stats "$ROOT/tests/data/bf16/$f.json" >/dev/null
        echo "wrote tests/data/bf16/$f.json"
    done
done

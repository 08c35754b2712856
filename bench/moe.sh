#!/usr/bin/env bash
# moe.sh — runs `hyperpar bench moe` for every preset at a decode size and a prefill size, one JSON line
# each. Ratios (sgemm_ratio, bandwidth_ratio) are the figures; absolute times on a shared machine are noise.
# Usage: bench/moe.sh [path/to/hyperpar] [extra options, e.g. --threads 8]
set -eu
HP="${1:-build/hyperpar}"
shift || true
for preset in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3; do
    for tokens in 16 512; do
        "$HP" bench moe --preset "$preset" --tokens "$tokens" --json "$@"
    done
done

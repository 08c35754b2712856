#!/usr/bin/env bash
# moe.sh — runs `hyperpar bench moe` for every preset at a decode size and a prefill size, with f32 and bf16
# expert weights, one JSON line each. The ratios are the figures, each to a limit measured in the same run:
# dense_ratio (the layer's GFLOP/s over one dense GEMM with the same FLOPs, backend, weight dtype and compute
# mode) and read_ratio (expert weight bytes read per second over a read-only sweep of 512 MiB). Absolute times
# on a shared machine are noise.
# Usage: bench/moe.sh [path/to/hyperpar] [extra options, e.g. --threads 8 --router real --compute bf16]
# Environment: DTYPES ("f32 bf16"), TOKENS ("16 512").
set -eu
HP="${1:-build/hyperpar}"
shift || true
for preset in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b deepseek-v3; do
    for dtype in ${DTYPES:-f32 bf16}; do
        for tokens in ${TOKENS:-16 512}; do
            "$HP" bench moe --preset "$preset" --tokens "$tokens" --dtype "$dtype" --json "$@"
        done
    done
done

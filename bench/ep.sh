#!/usr/bin/env bash
# ep.sh — runs `hyperpar bench ep` for every preset under mpirun (2 ranks by default), one JSON line each.
# The figures are ratios measured in the same run: ratio_bare_over_ep (a bare alltoallv of the same bytes
# over the EP exchange; ratio_last_bare_over_ep without the wait for a slower rank), resident_ratio (≈ 1/ep)
# and, for deepseek-v3 (the one preset with a shared expert), overlap.hidden_of_shared. Absolute times on a
# shared machine are noise.
# DeepSeek-V3's 256 experts are 42 GiB of f32: it runs with --local-experts (8 per rank by default,
# EP_DEEPSEEK_LOCAL) so that it fits; shapes, top-k, shared expert and the bytes exchanged are unchanged.
# Usage: bench/ep.sh [path/to/hyperpar] [extra options, e.g. --threads 1 --reps 5]
# Environment: NP (2), TOKENS (512), DS_TOKENS (256), EP_DEEPSEEK_LOCAL (8), MPIRUN (mpirun).
set -eu
HP="${1:-build/hyperpar}"
shift || true
NP="${NP:-2}"
TOKENS="${TOKENS:-512}"
DS_TOKENS="${DS_TOKENS:-256}"
MPIRUN="${MPIRUN:-mpirun}"
run() { "$MPIRUN" --allow-run-as-root --oversubscribe -np "$NP" "$HP" bench ep --json "$@"; }
for preset in qwen3-30b-a3b mixtral-8x7b gpt-oss-20b; do
    run --preset "$preset" --tokens "$TOKENS" "$@"
done
run --preset deepseek-v3 --tokens "$DS_TOKENS" --overlap --local-experts "${EP_DEEPSEEK_LOCAL:-8}" "$@"

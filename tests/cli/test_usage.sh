# Usage, --help on every command, exit codes for usage errors.
source "$(dirname "$0")/lib.sh"
expect 0 "commands:" -- "$HP" --help
expect 0 "hyperpar 0." -- "$HP" --version
expect 2 "usage:" -- "$HP"
expect 2 "unknown command 'frobnicate'" -- "$HP" frobnicate
for cmd in inspect plan gen demo; do
    expect 0 "usage: hyperpar $cmd" -- "$HP" "$cmd" --help
done
expect 2 "expected exactly one PATH" -- "$HP" inspect
expect 2 "unknown option" -- "$HP" inspect --bogus x
expect 2 "--expert-layout must be per-expert or batched" -- "$HP" inspect x --expert-layout stacked
expect 2 "--family is required" -- "$HP" gen --out "$WORK/x"
expect 2 "--out DIR is required" -- "$HP" gen --family llama
expect 2 "--layers expects an integer" -- "$HP" gen --family llama --out "$WORK/x" --layers 0
expect 2 "--dtype must be" -- "$HP" gen --family llama --out "$WORK/x" --dtype f8
expect 2 "unknown family \"gpt2\"" -- "$HP" gen --family gpt2 --out "$WORK/x"
expect 2 "--router expects balanced or real, got 'fast'" -- "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --router fast
expect 2 "--compute expects exact or bf16, got 'fp8'" -- "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --compute fp8
expect 2 "--max-gib expects a positive number, got '-1'" -- "$HP" bench ep --preset qwen3-30b-a3b --tokens 4 --max-gib -1
finish

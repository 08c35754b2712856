# Usage, --help on every command, exit codes for usage errors.
source "$(dirname "$0")/lib.sh"
expect 0 "commands:" -- "$HP" --help
expect 0 "hyperpar 0." -- "$HP" --version
expect 2 "usage:" -- "$HP"
expect 2 "unknown command 'frobnicate'" -- "$HP" frobnicate
for cmd in inspect plan gen convert demo; do
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

# One descriptor per command: --help lists every option (generated from the table the parser uses), so each
# long option --help names is accepted by the parser, and every command's help has its option lines. The synopsis
# is generated from the same table: every option it names is one of the listed ones.
for cmd in inspect plan gen convert demo shard merge moe run generate validate train cost advise tokenize "bench moe" "bench ep" "bench run" \
           "bench train" "bench advise"; do
    help=$("$HP" $cmd --help 2>&1)
    opts=$(grep -oE '^  (-[a-zA-Z], )?--[a-z][a-z0-9-]*' <<<"$help" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
    check "$cmd --help lists options" test "$(wc -l <<<"$opts")" -ge 2
    check "$cmd --help lists --help" grep -qx -- "--help" <<<"$opts"
    synopsis=$(grep -E '^(usage|   or): ' <<<"$help")
    check "$cmd --help starts with its synopsis" grep -q "^usage: .*hyperpar $cmd.* \[options\]$" <<<"$help"
    for o in $(grep -oE -- '--[a-z][a-z0-9-]*' <<<"$synopsis" | sort -u); do
        check "$cmd synopsis names $o, one of the options --help lists" grep -qx -- "$o" <<<"$opts"
    done
    for o in $opts; do
        [ "$o" = "--help" ] && continue
        out=$("$HP" $cmd "$o" 2>&1 </dev/null)
        if grep -q "unknown option" <<<"$out"; then
            echo "FAIL: $cmd --help lists $o but the parser refuses it"; FAILED=$((FAILED + 1))
        else PASSED=$((PASSED + 1)); fi
    done
done
# Our message, never getopt's own line before it, for every kind of bad option.
bad() { # bad NEEDLE -- command...
    local needle="$1"; shift 2
    local out rc
    out=$("$@" 2>&1 </dev/null); rc=$?
    check "'$*' exits 2 (rc $rc)" test "$rc" -eq 2
    check "'$*' says '$needle'" grep -qF -- "$needle" <<<"$out"
    check "'$*' prints one line of error" test "$(grep -c 'hyperpar: error' <<<"$out")" -eq 1
    check "'$*' has no getopt line" bash -c '! grep -qE "unrecognized|requires an argument|invalid option|ambiguous;|allow an argument" <<<"$1"' _ "$out"
}
bad "run: unknown option '--bogus'" -- "$HP" run x --bogus
bad "cost: unknown option '-Z'" -- "$HP" cost x -Z
bad "plan: --tp needs a value (N)" -- "$HP" plan x --tp
bad "plan: --output needs a value (FILE)" -- "$HP" plan x -o
bad "run: option '--comp' is ambiguous: --compare-rtol, --compare, --compute" -- "$HP" run x --comp exact
bad "shard: --force takes no value, got '--force=1'" -- "$HP" shard x --force=1
bad "bench: unknown option '--bogus'" -- "$HP" bench run --bogus
bad "gen: --seed needs a value (S)" -- "$HP" gen --seed
# --compute, --dtype and --compare-rtol: one parser each, the same message in every command.
for c in "run x --input i" "moe x --layer 1 --input i --output o" "bench moe --preset mixtral-8x7b --tokens 4"; do
    bad "--compute expects exact or bf16, got 'fp8'" -- "$HP" $c --compute fp8
done
for c in "bench moe --preset mixtral-8x7b --tokens 4" "bench run --preset llama-3-8b"; do
    bad "--dtype must be bf16 or f32, got 'f16'" -- "$HP" $c --dtype f16
done
bad "--dtype must be f32, bf16 or f16, got 'fp8'" -- "$HP" gen --family llama --out "$WORK/g" --dtype fp8
bad "--compare-rtol expects a number in (0, 1], got '2'" -- "$HP" run x --input i --compare-rtol 2
bad "--compare-rtol expects a number in (0, 1], got '0'" -- "$HP" moe x --layer 1 --input i --output o --compare-rtol 0
bad "--rtol expects a number in (0, 1], got 'x'" -- "$HP" validate x --input i --rtol x
# One preset table: every benchmark lists and takes the same presets (bench moe and ep: the MoE ones).
for p in qwen3-30b-a3b mixtral-8x7b deepseek-v3 gpt-oss-20b; do
    for b in moe ep run; do
        check "bench $b --help lists $p" grep -q -- "^  $p " <<<"$("$HP" bench $b --help)"
    done
done
bad "unknown preset 'llama-3-8b'; known: qwen3-30b-a3b, mixtral-8x7b, gpt-oss-20b, deepseek-v3" -- \
    "$HP" bench moe --preset llama-3-8b --tokens 4
bad "unknown preset 'x'; known: qwen3-30b-a3b, mixtral-8x7b, gpt-oss-20b, deepseek-v3" -- \
    "$HP" bench ep --preset x --tokens 4
bad "unknown preset 'x'; known: llama-3-8b, qwen3-30b-a3b" -- "$HP" bench run --preset x
finish

# gen with sizes whose products overflow or do not fit: a usage error (exit 2) naming the cause, before
# anything is built or written (no UBSan overflow, no wrapped size, no folder left, no disk filled).
source "$(dirname "$0")/lib.sh"
expect 2 "more than a safetensors header holds" -- "$HP" gen --family qwen3_moe --layers 65536 --experts 4096 --out "$WORK/a"
expect 2 "more than a safetensors header holds" -- "$HP" gen --family deepseek_v3 --layers 65536 --hidden 65536 --heads 65536 --kv-heads 65536 --head-dim 65536 --out "$WORK/a"
expect 2 "but the filesystem has" -- "$HP" gen --family llama --layers 65536 --hidden 65536 --intermediate 65536 --vocab 65536 --out "$WORK/a"
expect 2 "but the filesystem has" -- "$HP" gen --family mixtral --layers 1024 --hidden 65536 --intermediate 65536 --experts 64 --expert-layout batched --out "$WORK/a"
expect 2 "but the filesystem has" -- "$HP" gen --family qwen3 --hidden 65536 --vocab 65536 --head-dim 65536 --heads 65536 --kv-heads 1 --out "$WORK/a"
check "nothing left behind" test ! -e "$WORK/a"
# An existing folder stays as it was.
mkdir "$WORK/b"
expect 2 "but the filesystem has" -- "$HP" gen --family llama --layers 65536 --hidden 65536 --out "$WORK/b"
check "the existing folder stays empty" test -z "$(ls -A "$WORK/b")"
# Out-of-range single values are refused by the option parser.
expect 2 "--hidden" -- "$HP" gen --family llama --hidden 9223372036854775807 --out "$WORK/a"
expect 2 "--vocab" -- "$HP" gen --family llama --vocab 99999999999999999999 --out "$WORK/a"
finish

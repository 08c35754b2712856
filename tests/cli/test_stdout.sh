# Output that cannot be written is a failure: every command that prints to stdout exits 1 on a full device.
source "$(dirname "$0")/lib.sh"
C="$TESTS/data/configs/deepseek-v3.json"
G="$TESTS/data/golden/qwen3_moe_batched_bf16"

# full CMD...: stdout to /dev/full must give exit 1 and name standard output.
full() {
    local out rc
    out=$("$@" 2>&1 >/dev/full </dev/null)
    rc=$?
    if [ "$rc" -ne 1 ] || ! grep -qF "cannot write to standard output" <<<"$out"; then
        echo "FAIL: '$*' > /dev/full exited $rc"; echo "$out" | head -5; FAILED=$((FAILED + 1)); return
    fi
    PASSED=$((PASSED + 1))
}
if [ -w /dev/full ]; then
    full "$HP" plan "$C" --tp 8
    full "$HP" plan "$C" --tp 8 --format explain
    full "$HP" plan "$G" --tp 2 --ep 2 --suggest-overrides
    full "$HP" inspect "$C" --json
    full "$HP" inspect "$G" --tensors
    full "$HP" --help
    full "$HP" plan --help
fi
# A short output that fits the buffer still reaches the device at exit: the flush error is caught too.
if [ -w /dev/full ]; then full "$HP" --version; fi
# A failing command keeps its own exit code.
out=$("$HP" plan /nonexistent.json 2>&1 >/dev/full); rc=$?
check "an input error stays exit 2 with stdout full" test "$rc" -eq 2
finish

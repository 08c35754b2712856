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
# stdout and stderr never interleave mid-line (issue 36: both streams line-buffered): when they share a pipe, a write
# to one that ends mid-line is always followed by a write to the same one (the rest of that call's text), never
# by the other's (a fully buffered stdout wrote 4 KiB blocks that ended anywhere, with stderr lines between them).
# strace shows each write(2); the plan's explain report fills many buffers of stdout, train writes stderr lines.
whole_writes() { # LOG [strict]: strace's log of write(2) calls to fds 1 and 2; strict: every one ends a line
    python3 - "$@" <<'PY'
import re, sys
strict = len(sys.argv) > 2
n, open_fd, bad = 0, None, 0
for line in open(sys.argv[1]):
    m = re.match(r'(\d+ +)?write\(([12]), "(.*)"(\.\.\.)?, \d+\) = \d+', line)
    if not m:
        continue
    n += 1
    fd = m.group(2)
    bad += open_fd is not None and fd != open_fd
    open_fd = fd if m.group(4) is not None or not m.group(3).endswith("\\n") else None
    bad += strict and open_fd is not None
sys.exit(n < 2 or bad > 0 or open_fd is not None)
PY
}
if command -v strace >/dev/null 2>&1; then
    strace -f -e trace=write -s 100000 -o "$WORK/w1" "$HP" plan "$TESTS/data/configs/llama-3-8b.json" --tp 2 \
        --format explain >/dev/null 2>&1
    check "plan --format explain: no stdout write is left mid-line" whole_writes "$WORK/w1"
    # run prints its statistics line in pieces: each line must still reach stderr in one write
    strace -f -e trace=write -s 100000 -o "$WORK/w2" "$HP" run "$TESTS/data/forward/llama" --input \
        "$TESTS/data/forward/llama/forward_io.safetensors" >/dev/null 2>&1
    check "run: every write to stderr is whole lines" whole_writes "$WORK/w2" strict
else
    echo "SKIP: strace is not installed (scripts/install-deps.sh installs it)"
fi
finish

# lib.sh — helpers for CLI tests. Each test script: source this, call checks, end with `finish`.
# Usage of a test script: bash test_x.sh /path/to/hyperpar /path/to/tests
set -u
HP="$1"
TESTS="$2"
WORK=$(mktemp -d /tmp/hp_cli_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PASSED=0
FAILED=0

# expect CODE SUBSTRING -- command...   : exit code must be CODE and stdout+stderr must contain SUBSTRING.
expect() {
    local code="$1" needle="$2"
    shift 3
    local out rc
    out=$("$@" 2>&1 </dev/null)
    rc=$?
    if [ "$rc" -ne "$code" ]; then
        echo "FAIL: '$*' exited $rc, expected $code"; echo "$out" | head -20; FAILED=$((FAILED + 1)); return
    fi
    if [ -n "$needle" ] && ! grep -qF -- "$needle" <<<"$out"; then
        echo "FAIL: '$*' output lacks '$needle'"; echo "$out" | head -20; FAILED=$((FAILED + 1)); return
    fi
    PASSED=$((PASSED + 1))
}

# check NAME CONDITION-COMMAND... : passes when the command succeeds.
check() {
    local name="$1"
    shift
    if "$@"; then PASSED=$((PASSED + 1)); else echo "FAIL: $name"; FAILED=$((FAILED + 1)); fi
}

finish() {
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
}

# Writes, in the current folder, what the small training tests read: tok.bin (2000 uint16 tokens below 128) and
# ids.safetensors (input_ids I64 [2, 8]).
small_train_inputs() {
    python3 - <<'PY'
import json, struct
open("tok.bin", "wb").write(struct.pack("<%dH" % 2000, *[(i * 37 + 11) % 128 for i in range(2000)]))
B, S = 2, 8
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [B, S], "data_offsets": [0, 8 * B * S]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open("ids.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%dq" % (B * S), *[(i * 7) % 100 for i in range(B * S)]))
PY
}

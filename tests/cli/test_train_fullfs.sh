# A real full disk while saving: a tmpfs that holds the checkpoint of step 2 but not that of step 4 (mounted in a
# user and mount namespace of its own, `unshare -rm`, so no privilege is needed and nothing stays mounted). The
# save of step 4 fails with exit 1 naming the file and "No space left on device", leaves no temporary, and step-2
# is the uninterrupted run's, byte for byte but for the run id that names the run (tests/cli/ckpt_same.py). Where
# no tmpfs can be mounted (no user namespaces, no unshare) the test says SKIP and exits 77, which CTest reports as
# skipped.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
G=data/forward/llama
A="--input $G/forward_io.safetensors --steps 6 --lr 1e-2 --save-every 2"
MNT="$WORK/fs"
mkdir -p "$MNT"
if ! command -v unshare >/dev/null || ! unshare -rm sh -c "mount -t tmpfs -o size=1m tmpfs '$MNT'" 2>/dev/null; then
    echo "SKIP: cannot mount a tmpfs in a user namespace here (unshare -rm); the full-disk hook test covers the code"
    exit 77
fi
"$HP" train $G $A --out "$WORK/ref" >/dev/null 2>&1
T=$(stat -c %s "$WORK/ref/step-2"/* "$WORK/ref/step-2/.hyperpar-output" | awk '{s += $1} END {print s}')
# Room for one checkpoint and half of the next (tmpfs counts whole 4 KiB pages; a folder takes one).
KB=$(( (T + T / 2) / 1024 + 16 ))
unshare -rm sh -c "mount -t tmpfs -o size=${KB}k tmpfs '$MNT' &&
    { '$HP' train $G $A --out '$MNT/run' >'$WORK/log' 2>&1; echo \$? >'$WORK/rc';
      ls -A '$MNT/run' >'$WORK/ls'; cp -r '$MNT/run/step-2' '$WORK/step-2' 2>/dev/null; df -k '$MNT' >'$WORK/df'; }"
echo "a tmpfs of $KB KiB for checkpoints of $T bytes: exit $(cat "$WORK/rc"); $(grep -m1 'error' "$WORK/log")"
check "the save of step 4 fails with exit 1" test "$(cat "$WORK/rc")" = 1
check "the message names the cause" grep -q "No space left on device" "$WORK/log"
check "the message names the checkpoint being saved" grep -q "saving the checkpoint of step 4 failed.*$MNT/run/step-4/" "$WORK/log"
check "only step-2 is left in the run folder (no temporary)" test "$(cat "$WORK/ls")" = "step-2"
for f in config.json model.safetensors rank-0.safetensors state.json; do # (but for the run id: ckpt_same.py)
    check "step-2/$f is the uninterrupted run's" python3 "$TESTS/cli/ckpt_same.py" "$WORK/step-2" "$WORK/ref/step-2" $f
done
# --log-json on a full disk (issue 36 T9: its write errors were ignored, exit 0): a one-page tmpfs holds about 20 of
# 60 lines; the step whose line does not fit ends the run, exit 1, naming the file and the cause.
mkdir -p "$WORK/fs2"
unshare -rm sh -c "mount -t tmpfs -o size=4k tmpfs '$WORK/fs2' &&
    { '$HP' train $G --input $G/forward_io.safetensors --steps 60 --lr 1e-3 --log-json '$WORK/fs2/log.jsonl' \
      >'$WORK/log2' 2>&1; echo \$? >'$WORK/rc2'; }"
check "a log that no longer fits ends the run with exit 1 ($(cat "$WORK/rc2"))" test "$(cat "$WORK/rc2")" = 1
check "the message names the log and the cause" grep -q -- "--log-json $WORK/fs2/log.jsonl: cannot write step [0-9]*'s line (No space left on device)" "$WORK/log2"
finish

# Training faults under mpirun -np 2 (dp=2, a token file, a checkpoint every 2 of 6 steps), each at an exact point
# (the HP_TEST_* pause hooks, HP_TEST_ONLY_RANK picking the rank; no sleeps as synchronisation):
#  - kill -9 of rank 1 inside step 3 (rank 0 waits in a collective), of rank 0 and of rank 1 in the middle of
#    writing the checkpoint of step 4: mpirun and every rank end within 20 s, non-zero, naming the rank and the
#    signal; step-2 stays complete; --resume RUN takes step-2 (never the half-written step-4.tmp.<pid>, which the
#    next run removes as a dead run's); the resumed run's final checkpoint merges to the same bytes as an
#    uninterrupted run's;
#  - a full disk while saving (HP_TEST_ENOSPC_AFTER: the writes fail with ENOSPC after that many bytes) on rank 1
#    in its state file and on rank 0 in state.json: every rank fails with exit 1 naming the file and the cause,
#    no temporary stays, step-2 is intact and resumes to the same bytes;
#  - SIGTERM, SIGHUP and SIGINT while saving (1 process): the temporary removed, the signal's exit status.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
G=data/forward/llama
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2"
python3 - "$WORK/tok.bin" <<'PY'
import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<%dH" % 400, *[(i * 37 + 11) % 128 for i in range(400)]))
PY
D="--data $WORK/tok.bin --seq 15 --global-batch 4 --micro-batch 1 --steps 6 --lr 1e-3 --seed 5 --dp 2 --zero 1 --save-every 2"
merged_same() { # RUN: its last checkpoint merges to the bytes of the uninterrupted run's
    rm -rf "$WORK/cmp" && "$HP" merge "$1" --out "$WORK/cmp" >/dev/null 2>&1 &&
        cmp -s "$WORK/cmp/model.safetensors" "$WORK/ref.m/model.safetensors" &&
        cmp -s "$WORK/cmp/config.json" "$WORK/ref.m/config.json"
}
step2_intact() { # RUN: step-2 is complete and equal to the uninterrupted run's step-2
    # byte for byte but for the run id (ckpt_same.py): the rank files and state.json name the run that wrote them
    python3 "$TESTS/cli/ckpt_same.py" "$1/step-2" "$WORK/ref/step-2" model.safetensors rank-0.safetensors \
        rank-1.safetensors state.json
}
paused() { # P MPIRUN_PID: wait (up to 60 s) until a rank reached the pause point P
    for _ in $(seq 600); do
        [ -s "$1.ready" ] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
no_rank_left() { ! pgrep -f "hyperpar train .*--out $1( |$)" >/dev/null; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

$MPI "$HP" train $G $D --out "$WORK/ref" >/dev/null 2>&1
expect 0 "merged the checkpoint of step 6" -- "$HP" merge "$WORK/ref" --out "$WORK/ref.m"

# kill -9 at a pause point: NAME, the run folder, env...; sets rc and el (ms from the kill to mpirun's end).
killed_run() {
    local name="$1" run="$2"
    shift 2
    env "$@" $MPI "$HP" train $G $D --out "$run" >"$WORK/$name.log" 2>&1 &
    local mp=$!
    check "$name: a rank reached the pause point" paused "$WORK/$name" $mp
    local pid t0
    pid=$(cat "$WORK/$name.ready" 2>/dev/null)
    t0=$(date +%s%N)
    kill -9 "$pid"
    wait $mp
    rc=$?
    local el_mpirun
    el_mpirun=$(ms "$t0")
    # every rank gone too (a rank mpirun signalled may outlive it by a moment)
    for _ in $(seq 200); do no_rank_left "$run" && break; sleep 0.1; done
    el=$(ms "$t0")
    echo "$name: kill -9 of pid $pid: mpirun ended after $el_mpirun ms with exit status $rc, every rank after $el ms"
    check "$name: mpirun and every rank end within 20 s (took $el ms)" test "$el" -le 20000
    check "$name: exit status non-zero (got $rc; 124 would be the timeout)" test "$rc" -ne 0 -a "$rc" -ne 124
    check "$name: no rank of the run is left" no_rank_left "$run"
}

# Inside step 3: rank 1 pauses reading its batch, rank 0 goes on into the step's collectives.
killed_run step "$WORK/k" HP_TEST_ONLY_RANK=1 HP_TEST_PAUSE_IN_STEP="$WORK/step" HP_TEST_PAUSE_STEP=3
check "step: the message names rank 1 and the signal" grep -q "rank 1 .*exited on signal 9" "$WORK/step.log"
check "step: step-2 is complete and intact, nothing after it" step2_intact "$WORK/k"
check "step: no step-4" test ! -e "$WORK/k/step-4"
expect 0 "resumed from $WORK/k/step-2 at step 2" -- $MPI "$HP" train $G $D --resume "$WORK/k" --out "$WORK/k"
check "step: the resumed run's last checkpoint merges to the uninterrupted run's bytes" merged_same "$WORK/k"

# In the middle of writing step 4's rank file (its header written), on rank 0 and then on rank 1.
for r in 0 1; do
    run="$WORK/s$r"
    killed_run save$r "$run" HP_TEST_ONLY_RANK=$r HP_TEST_PAUSE_MID_WRITE="$WORK/save$r" HP_TEST_PAUSE_WRITE_OF=step-4.tmp
    check "save$r: the message names rank $r and the signal" grep -q "rank $r .*exited on signal 9" "$WORK/save$r.log"
    check "save$r: step-2 is complete and intact" step2_intact "$run"
    check "save$r: the half-written step-4 is a temporary, not step-4" \
        bash -c "ls -d '$run'/step-4.tmp.* >/dev/null 2>&1 && test ! -e '$run/step-4'"
    expect 2 "nor a training checkpoint" -- "$HP" merge "$(ls -d "$run"/step-4.tmp.* | head -1)" --out "$WORK/x"
    expect 0 "resumed from $run/step-2 at step 2" -- $MPI "$HP" train $G $D --resume "$run" --out "$run"
    check "save$r: the dead run's temporary was removed" bash -c "! ls -d '$run'/*.tmp.* >/dev/null 2>&1"
    check "save$r: the resumed run's last checkpoint merges to the uninterrupted run's bytes" merged_same "$run"
done
check "the next run says it removed the dead run's temporary" \
    grep -q "removed .*step-4.tmp.[0-9]*, the unfinished output of process" <(
        cp -r "$WORK/ref" "$WORK/stale" && mkdir "$WORK/stale/step-4.tmp.999999999" &&
        cp "$WORK/ref/step-4/.hyperpar-output" "$WORK/stale/step-4.tmp.999999999/" &&
        $MPI "$HP" train $G $D --resume "$WORK/stale/step-2" --out "$WORK/stale" --force 2>&1)
# Not a dead hyperpar's: a temporary without the marker stays.
mkdir -p "$WORK/stale/step-8.tmp.999999999"
$MPI "$HP" train $G $D --resume "$WORK/stale/step-4" --out "$WORK/stale" --force >/dev/null 2>&1
check "a temporary without the marker is never removed" test -d "$WORK/stale/step-8.tmp.999999999"

# A full disk while saving step 4: rank 1 in its state file, rank 0 in state.json (its last file).
size() { stat -c %s "$@" | awk '{s += $1} END {print s}'; }
R1=$(size "$WORK/ref/step-2/rank-1.safetensors")
T0=$(size "$WORK/ref/step-2"/{.hyperpar-output,config.json,model.safetensors,rank-0.safetensors,state.json})
S0=$(size "$WORK/ref/step-2/state.json")
for case in "1 $((R1 + R1 / 2)) step-4/rank-1.safetensors" "0 $((2 * T0 - S0 + 10)) step-4/state.json"; do
    set -- $case
    run="$WORK/full$1"
    expect 1 "$run/$3: " -- env HP_TEST_ONLY_RANK=$1 HP_TEST_ENOSPC_AFTER=$2 $MPI "$HP" train $G $D --out "$run"
    check "full disk on rank $1: the cause is named" grep -q "No space left on device" <(
        env HP_TEST_ONLY_RANK=$1 HP_TEST_ENOSPC_AFTER=$2 $MPI "$HP" train $G $D --out "$run.b" 2>&1)
    check "full disk on rank $1: the save failed as such" grep -q "saving the checkpoint of step 4 failed" <(
        env HP_TEST_ONLY_RANK=$1 HP_TEST_ENOSPC_AFTER=$2 $MPI "$HP" train $G $D --out "$run.c" 2>&1)
    check "full disk on rank $1: step-2 intact" step2_intact "$run"
    check "full disk on rank $1: no step-4 and no temporary" test "$(ls -A "$run")" = "step-2"
    expect 0 "resumed from $run/step-2" -- $MPI "$HP" train $G $D --resume "$run" --out "$run"
    check "full disk on rank $1: resumed to the uninterrupted run's bytes" merged_same "$run"
done
# SIGTERM, SIGHUP and SIGINT in the middle of saving step 4's checkpoint (1 process; a Python parent, so SIGINT is
# not ignored as in a shell's background job): the temporary folder is removed, step-2 stays, the exit status is
# the signal's (issue 36 T13: step-4.tmp.<pid> stayed behind)
for sig in TERM HUP INT; do
    run="$WORK/sig$sig"
    rc=$(python3 - "$HP" "$G" "$WORK/sig$sig" "$run" "$sig" ${D/--dp 2 --zero 1 /} <<'PY'
import os, signal, subprocess, sys, time
hp, g, pause, run, sig, *d = sys.argv[1:]
env = dict(os.environ, HP_TEST_PAUSE_MID_WRITE=pause, HP_TEST_PAUSE_WRITE_OF="step-4.tmp")
p = subprocess.Popen([hp, "train", g, *d, "--out", run], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(600):
    if os.path.exists(pause + ".ready") or p.poll() is not None:
        break
    time.sleep(0.1)
p.send_signal(getattr(signal, "SIG" + sig))
print(p.wait(timeout=60))
PY
)
    check "SIG$sig while saving: the process ends by the signal ($rc)" test "$rc" = "-$(kill -l $sig)"
    check "SIG$sig while saving: no temporary left ($(ls -A "$run" | tr '\n' ' '))" test "$(ls -A "$run")" = "step-2"
done
finish

# Signals while gen and bench run write: SIGINT / SIGTERM / SIGHUP remove the unfinished output (gen's
# "model.safetensors.tmp.PID" and the folder it made, bench run's $TMPDIR/hp-bench-run-XXXXXX) and the exit
# status is the signal's; after kill -9 the next run recognises the dead run's temporaries, removes them and
# succeeds. HP_TEST_PAUSE_MID_WRITE=P makes the safetensors writer create P.ready and wait (for P.go or a
# signal) with its temporary holding the header: the signals arrive at exactly that point, no sleeps.
source "$(dirname "$0")/lib.sh"
set -m # job control: background runs keep SIGINT (a non-interactive shell would start them with it ignored)
paused() { # P PID: wait (up to 60 s) until the run PID has reached its pause point
    for _ in $(seq 600); do
        [ -e "$1.ready" ] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
no_tmp() { ! ls "$1"/*.tmp.* >/dev/null 2>&1; }
W="$WORK"
GEN=(gen --family qwen3_moe --hidden 256 --layers 2)

# gen into a folder it creates: the signal removes the temporary and the folder.
for sig in INT TERM HUP; do
    HP_TEST_PAUSE_MID_WRITE="$W/g$sig" "$HP" "${GEN[@]}" --out "$W/new$sig" >"$W/g$sig.log" 2>&1 &
    pid=$!
    check "gen SIG$sig: reached the pause point" paused "$W/g$sig" $pid
    check "gen SIG$sig: the temporary exists while paused" bash -c "ls '$W/new$sig'/model.safetensors.tmp.$pid >/dev/null"
    kill -s $sig $pid
    wait $pid; rc=$?
    want=$((128 + $(kill -l $sig)))
    check "gen SIG$sig: exit status $want (got $rc)" test "$rc" -eq "$want"
    check "gen SIG$sig: says it was interrupted" grep -q "interrupted by signal" "$W/g$sig.log"
    check "gen SIG$sig: the folder it made is gone" test ! -e "$W/new$sig"
done

# gen --force over an earlier output: the signal removes the temporary; the earlier output stays whole.
expect 0 "wrote" -- "$HP" "${GEN[@]}" --out "$W/old"
sum=$(cat "$W/old"/* | cksum)
HP_TEST_PAUSE_MID_WRITE="$W/gf" "$HP" "${GEN[@]}" --seed 7 --force --out "$W/old" >"$W/gf.log" 2>&1 &
pid=$!
check "gen --force SIGINT: reached the pause point" paused "$W/gf" $pid
kill -s INT $pid
wait $pid; rc=$?
check "gen --force SIGINT: exit status 130 (got $rc)" test "$rc" -eq 130
check "gen --force SIGINT: no temporary left" no_tmp "$W/old"
check "gen --force SIGINT: the earlier output is untouched" test "$(cat "$W/old"/* | cksum)" = "$sum"

# kill -9: the temporary stays, and the next gen (with or without --force) removes it and succeeds.
for force in "" --force; do
    rm -f "$W"/gk.*
    HP_TEST_PAUSE_MID_WRITE="$W/gk" "$HP" "${GEN[@]}" --out "$W/killed$force" >/dev/null 2>&1 &
    pid=$!
    check "gen kill -9$force: reached the pause point" paused "$W/gk" $pid
    kill -9 $pid
    wait $pid 2>/dev/null
    check "gen kill -9$force: the dead run's temporary is there" test -e "$W/killed$force/model.safetensors.tmp.$pid"
    expect 0 "left by 'hyperpar gen' process $pid, which no longer runs" -- "$HP" "${GEN[@]}" $force --out "$W/killed$force"
    check "gen kill -9$force: the temporary is gone" no_tmp "$W/killed$force"
    check "gen kill -9$force: the output opens" "$HP" inspect "$W/killed$force" >/dev/null 2>&1
done
# Not gen's: a temporary of a live process, or a file without gen's marker, is never removed.
sleep 300 & live=$!
expect 0 "wrote" -- "$HP" "${GEN[@]}" --out "$W/keep"
echo '{"not": "ours"}' >"$W/keep/model.safetensors.tmp.999999999"
cp "$W/keep/model.safetensors" "$W/keep/model.safetensors.tmp.$live"
expect 2 "holds 'model.safetensors.tmp." -- "$HP" "${GEN[@]}" --force --out "$W/keep"
check "foreign temporaries stay" test -e "$W/keep/model.safetensors.tmp.999999999" -a -e "$W/keep/model.safetensors.tmp.$live"
kill $live; wait $live 2>/dev/null

# bench run (one process; MPI starts as a singleton, whose allocations LeakSanitizer cannot attribute).
export ASAN_OPTIONS=detect_leaks=0
mkdir -p "$W/tmp"
export TMPDIR="$W/tmp"
left() { [ -z "$(ls -A "$W/tmp" | grep hp-bench-run)" ]; }
SMALL="--preset llama-3-8b --hidden 64 --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --layers 1 --tokens 16 --vocab 512 --reps 1"
for sig in INT TERM; do
    HP_TEST_PAUSE_MID_WRITE="$W/b$sig" "$HP" bench run $SMALL >"$W/b$sig.log" 2>&1 &
    pid=$!
    check "bench run SIG$sig: reached the pause point" paused "$W/b$sig" $pid
    check "bench run SIG$sig: its folder exists while paused" bash -c "! $(declare -f left); left"
    kill -s $sig $pid
    wait $pid; rc=$?
    want=$((128 + $(kill -l $sig)))
    check "bench run SIG$sig: exit status $want (got $rc)" test "$rc" -eq "$want"
    check "bench run SIG$sig: the temporary checkpoint is gone" left
done
HP_TEST_PAUSE_MID_WRITE="$W/bk" "$HP" bench run $SMALL >/dev/null 2>&1 &
pid=$!
check "bench run kill -9: reached the pause point" paused "$W/bk" $pid
kill -9 $pid
wait $pid 2>/dev/null
check "bench run kill -9: the dead run's folder is there" bash -c "! $(declare -f left); left"
expect 0 "left by bench run process $pid, which no longer runs" -- "$HP" bench run $SMALL
check "bench run kill -9: the next run removed it (and its own)" left
# A folder whose owner is another host (a shared TMPDIR) or a live process stays.
mkdir -p "$W/tmp/hp-bench-run-AAAAAA/model" "$W/tmp/hp-bench-run-BBBBBB/model"
echo "hyperpar bench run host some-other-host pid 999999999" >"$W/tmp/hp-bench-run-AAAAAA/owner"
echo "hyperpar bench run host $(hostname) pid $$" >"$W/tmp/hp-bench-run-BBBBBB/owner"
expect 0 "tokens/s" -- "$HP" bench run $SMALL
check "other hosts' and live runs' folders stay" test -d "$W/tmp/hp-bench-run-AAAAAA" -a -d "$W/tmp/hp-bench-run-BBBBBB"
finish

# test_shard_safety.sh — shard / merge never touch their inputs, refuse unusable --out names with exit 2,
# stop cleanly on SIGINT / SIGTERM, and let exactly one of two concurrent runs into one --out win.
source "$(dirname "$0")/lib.sh"
G="$TESTS/data/golden"
W="$WORK"
no_tmp() { ! ls -d "$1".tmp.* >/dev/null 2>&1; }

# Issue 10 #4: --out = the source, its parent, or inside it; merge S --out S. Exit 2, nothing deleted.
cp -r "$G/mixtral_per_expert_f32" "$W/a" && echo t > "$W/a/tokenizer.json"
expect 2 "is the input" -- "$HP" shard "$W/a" --tp 2 --out "$W/a" --force
expect 2 "contains the input" -- "$HP" shard "$W/a" --tp 2 --out "$W" --force
expect 2 "lies inside the input" -- "$HP" shard "$W/a" --tp 2 --out "$W/a/shards"
check "source untouched" test -f "$W/a/model.safetensors" -a -f "$W/a/tokenizer.json" -a ! -e "$W/a/shards"
echo 'plan_overrides: []' > "$W/ov.yaml"
expect 2 "is the input" -- "$HP" shard "$W/a" --tp 2 --overrides "$W/ov.yaml" --out "$W/ov.yaml" --force
expect 0 "sharded into" -- "$HP" shard "$W/a" --tp 2 --out "$W/s"
expect 2 "is the input" -- "$HP" merge "$W/s" --out "$W/s" --force
check "shards untouched" test -f "$W/s/rank-00000.safetensors"

# #22: names that cannot be an output folder are usage errors (exit 2), for shard and merge.
echo x > "$W/file"
for out in "" . .. / "$W/file/sub" "$W/file"; do
    expect 2 "hyperpar: error: shard: --out" -- "$HP" shard "$W/a" --tp 2 --out "$out"
    expect 2 "hyperpar: error: merge: --out" -- "$HP" merge "$W/s" --out "$out"
done

# #19: a hole in an edited manifest names the tensor and the shard folder, never a temporary path.
python3 - "$W/s/manifest.json" <<'PY' || true
import json, sys
p = sys.argv[1]; m = json.load(open(p))
for t in m["ranks"][1]["tensors"]:
    if t["slices"] and t["slices"][0]["dim"] == 0:
        t["slices"][0]["offset"] = 0; break
json.dump(m, open(p, "w"), indent=1)
PY
out=$("$HP" merge "$W/s" --out "$W/m_hole" 2>&1); rc=$?
check "edited manifest: exit 2" test "$rc" -eq 2
check "edited manifest: no temporary path, no doubled prefix" bash -c "! grep -q '\.tmp\.' <<<\"\$1\" && ! grep -q \"tensor '[^']*': tensor '\" <<<\"\$1\"" _ "$out"
check "no output after a refused merge" test ! -e "$W/m_hole"

# HP_TEST_PAUSE_BEFORE_COMMIT=P makes a run pause with its output complete in its temporary folder, just before
# the install: it creates P.ready and waits for P.go or a signal. The tests below act at exactly that point.
set -m # job control: background runs keep SIGINT (a non-interactive shell would start them with it ignored)
paused() { # P PID: wait (up to 60 s) until the run PID has reached its pause point
    for _ in $(seq 600); do
        [ -e "$1.ready" ] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# #7: SIGINT / SIGTERM stop a run and remove its temporary folder; the exit status is the signal's.
"$HP" gen --family qwen3_moe --hidden 1024 --moe-intermediate 384 --experts 16 --layers 2 --heads 8 --kv-heads 4 \
    --head-dim 128 --out "$W/big" >/dev/null 2>&1
for sig in INT TERM HUP; do
    HP_TEST_PAUSE_BEFORE_COMMIT="$W/p$sig" "$HP" shard "$W/big" --tp 2 --out "$W/sig$sig" --quiet >"$W/sig$sig.log" 2>&1 &
    pid=$!
    check "SIG$sig: the run reached its pause point" paused "$W/p$sig" $pid
    check "SIG$sig: the temporary folder exists while paused" bash -c "ls -d '$W/sig$sig'.tmp.* >/dev/null"
    kill -s $sig $pid
    wait $pid; rc=$?
    check "SIG$sig: exit status from the signal (rc $rc)" test "$rc" -ge 128
    check "SIG$sig: no output installed" test ! -e "$W/sig$sig"
    check "SIG$sig: no temporary folder left" no_tmp "$W/sig$sig"
    check "SIG$sig: says it was interrupted" grep -q "interrupted by signal" "$W/sig$sig.log"
done
# A signal ignored at start (nohup, trap '') stays ignored: the run goes on and installs its output.
(trap '' HUP; HP_TEST_PAUSE_BEFORE_COMMIT="$W/pn" exec "$HP" shard "$W/big" --tp 2 --out "$W/nohup" --quiet) &
pid=$!
check "nohup: the run reached its pause point" paused "$W/pn" $pid
kill -s HUP $pid; touch "$W/pn.go"
wait $pid; rc=$?
check "nohup: an ignored SIGHUP does not stop the run (rc $rc)" test "$rc" -eq 0 -a -f "$W/nohup/manifest.json"
# The same for merge.
expect 0 "sharded into" -- "$HP" shard "$W/big" --tp 2 --out "$W/bigs" --quiet
HP_TEST_PAUSE_BEFORE_COMMIT="$W/pm" "$HP" merge "$W/bigs" --out "$W/msig" --quiet >/dev/null 2>&1 &
pid=$!
check "merge: the run reached its pause point" paused "$W/pm" $pid
kill -s INT $pid
wait $pid; rc=$?
check "merge SIGINT: exit status from the signal (rc $rc)" test "$rc" -ge 128
check "merge SIGINT: no output installed" test ! -e "$W/msig"
check "merge SIGINT: no temporary folder left" no_tmp "$W/msig"

# #5: a folder that appears (or fills up) at --out while a run works is never replaced: the run fails with exit 2.
HP_TEST_PAUSE_BEFORE_COMMIT="$W/pl" "$HP" shard "$W/big" --tp 2 --out "$W/late" --quiet >"$W/late.log" 2>&1 &
pid=$!
check "late folder: the run reached its pause point" paused "$W/pl" $pid
mkdir "$W/late" && echo x > "$W/late/notes.txt"
touch "$W/pl.go"
wait $pid; rc=$?
check "late folder: exit 2 (rc $rc)" test "$rc" -eq 2
check "late folder: notes.txt kept" test -f "$W/late/notes.txt"
check "late folder: the loser says why" grep -q "while hyperpar shard ran" "$W/late.log"
check "late folder: no temporary left" no_tmp "$W/late"
mkdir "$W/empty_out"
HP_TEST_PAUSE_BEFORE_COMMIT="$W/pe" "$HP" shard "$W/big" --tp 2 --out "$W/empty_out" --quiet >"$W/eo.log" 2>&1 &
pid=$!
check "empty --out: the run reached its pause point" paused "$W/pe" $pid
echo x > "$W/empty_out/notes.txt"
touch "$W/pe.go"
wait $pid; rc=$?
check "empty --out that filled up: exit 2 (rc $rc)" test "$rc" -eq 2
check "empty --out that filled up: notes.txt kept" test -f "$W/empty_out/notes.txt"

# Two concurrent runs into one --out, both past their checks before either installs: exactly one wins.
HP_TEST_PAUSE_BEFORE_COMMIT="$W/pr" "$HP" shard "$W/big" --tp 2 --out "$W/race" --quiet >"$W/r1.log" 2>&1 & p1=$!
HP_TEST_PAUSE_BEFORE_COMMIT="$W/pr2" "$HP" shard "$W/big" --tp 2 --out "$W/race" --quiet >"$W/r2.log" 2>&1 & p2=$!
check "race: run 1 reached its pause point" paused "$W/pr" $p1
check "race: run 2 reached its pause point" paused "$W/pr2" $p2
touch "$W/pr.go" "$W/pr2.go"
wait $p1; r1=$?; wait $p2; r2=$?
check "one of two concurrent runs wins (rc $r1 and $r2)" test "$((r1 + r2))" -eq 2 -a "$((r1 * r2))" -eq 0
check "the loser says why" grep -q "while hyperpar shard ran" "$W/r1.log" "$W/r2.log"
check "no temporary left after the race" no_tmp "$W/race"
expect 0 "merged into" -- "$HP" merge "$W/race" --out "$W/race_m" --verify
finish

# Continuing a run (issue 36 item 3, T8): --resume RUN --out RUN keeps the run folder with or without --save-every;
# a resume that would save a step-<t> already there is refused before step 1; a refused flag names the command
# line and mesh that saved the run; --steps may be raised (the schedule follows the new total); --log-json continues
# the run's own log (and refuses another run's, or an existing file for a new run without --force); --plot after a
# resume draws the whole run; --log-json inside --out is refused at once.
source "$(dirname "$0")/lib.sh"
cd "$WORK"
"$HP" gen --family llama --out M >/dev/null 2>&1
python3 -c "
import struct; open('tok.bin', 'wb').write(struct.pack('<400H', *[(i * 5 + i // 7) % 128 for i in range(400)]))"
D="--data tok.bin --seq 16 --global-batch 4 --lr 1e-3"
steps_of() { python3 -c "import json, sys; print(' '.join(str(json.loads(l)['step']) for l in open(sys.argv[1])))" "$1"; }

# 1. the run folder continued without --save-every: its last step is its new checkpoint
"$HP" train M $D --steps 4 --out run --save-every 2 --stop-after 2 >/dev/null 2>&1
expect 0 "--out run is a run folder: the run continues in it" -- "$HP" train M $D --steps 4 --resume run --out run
check "step-4 is a checkpoint of the run" test -f run/step-4/state.json
expect 0 "" -- "$HP" merge run --out merged
check "merge takes the continued run's last step" test -f merged/model.safetensors
# 2. a later checkpoint of its own in the way: refused before step 1, unless --force replaces it
"$HP" train M $D --steps 6 --out r2 --save-every 2 >/dev/null 2>&1
out=$("$HP" train M $D --steps 6 --resume r2/step-2 --out r2 --save-every 2 2>&1); rc=$?
check "resuming step 2 under step-4 and step-6: exit 2 ($rc)" test $rc -eq 2
check "the message names step-4 and how to continue" grep -q "already holds step-4, which this run resumed at step 2 would save again: resume from its last checkpoint (--resume r2), or pass --force" <<<"$out"
check "no step ran" bash -c '! grep -q "train: step 3/" <<<"$1"' _ "$out"
# 3. another flag: refused naming the saved command line and mesh
expect 2 "it was saved by: hyperpar train M --data tok.bin --seq 16 --global-batch 4 --lr 1e-3 --steps 6 --out r2 --save-every 2, on mesh dp=1,cp=1,tp=1" -- \
    "$HP" train M ${D/1e-3/2e-3} --steps 6 --resume r2 --out r2 --save-every 2
# 4. --steps: at its end the refusal says how to continue; raised, the run goes on over the new total
expect 2 "nothing is left to train: give a --steps above 6 to continue it" -- "$HP" train M $D --steps 6 --resume r2 --out r2 --save-every 2
expect 0 "train: --steps 8 where the run was saved with --steps 6: the schedule of steps 7..8 follows the new total" -- \
    "$HP" train M $D --steps 8 --resume r2 --out r2 --save-every 2
check "step-8 saved" test -f r2/step-8/state.json
check "state.json records the new total" grep -q '"steps": 8' r2/step-8/state.json
# 5. --log-json: continued by the resumed run, its later lines dropped (they are taken again); --plot draws it all
"$HP" train M $D --steps 6 --out r3 --save-every 2 --stop-after 3 --log-json l3.jsonl >/dev/null 2>&1
head -3 l3.jsonl >first3
expect 0 "train: wrote p3.html (6 steps)" -- "$HP" train M $D --steps 6 --resume r3 --out r3 --save-every 2 \
    --log-json l3.jsonl --plot p3.html
check "the log holds steps 1..6 once each ($(steps_of l3.jsonl))" test "$(steps_of l3.jsonl)" = "1 2 3 4 5 6"
check "the lines before the checkpoint are the first run's" bash -c "head -3 l3.jsonl | cmp -s - first3"
check "every line names the run" test "$(grep -c '"run_id": "' l3.jsonl)" = 6
check "the page says where its earlier steps come from" grep -q "Steps 1 to 6 of 6, taken on 1 process (steps 1 to 3 before --resume, from --log-json)" p3.html
# another run's log: refused; a new run over an existing log: refused, --force replaces it
"$HP" train M $D --steps 4 --out r4 --save-every 2 --stop-after 2 >/dev/null 2>&1
expect 2 "--log-json l3.jsonl: line 1 is of run" -- "$HP" train M $D --steps 4 --resume r4 --out r4 --save-every 2 --log-json l3.jsonl
expect 2 "--log-json l3.jsonl holds a log already" -- "$HP" train M $D --steps 2 --log-json l3.jsonl
check "the refused runs left the log as it was" test "$(steps_of l3.jsonl)" = "1 2 3 4 5 6"
expect 0 "train: step 2/2" -- "$HP" train M $D --steps 2 --log-json l3.jsonl --force
check "--force: a new log" test "$(steps_of l3.jsonl)" = "1 2"
# T8: --log-json inside --out would go with the folder's rename: refused at once, nothing made
mkdir o8
expect 2 "--log-json o8/log.jsonl is or lies inside --out o8" -- "$HP" train M $D --steps 2 --out o8 --log-json o8/log.jsonl
check "nothing written into --out" test -z "$(ls -A o8)"
# T14: messages name what a thing is, print enum names, escape what they quote
expect 2 "tok.bin is a regular file, not a folder; merge reads the folder" -- "$HP" merge tok.bin --out mm
"$HP" train M $D --steps 4 --out r5 --save-every 2 --stop-after 2 --shuffle none >/dev/null 2>&1
cp -r r5 r6 && rm r6/step-2/state.json && mkdir r6/step-2/state.json
expect 2 "r6/step-2: its state.json is a folder" -- "$HP" train M $D --steps 4 --resume r6 --out r6 --shuffle none
cp -r r5 r7 && rm r7/step-2/state.json && mkfifo r7/step-2/state.json
expect 2 "its state.json is a FIFO (named pipe), not a regular file" -- timeout 20 "$HP" merge r7 --out m7
cp -r r5 r8 && rm r8/step-2/rank-0.safetensors && mkfifo r8/step-2/rank-0.safetensors
expect 2 "rank-0.safetensors, which state.json names, is a FIFO (named pipe)" -- timeout 20 "$HP" train M $D --steps 4 --resume r8/step-2 --out r8 --shuffle none
expect 2 'the run was saved with shuffle "none", this one has "seeded"' -- "$HP" train M $D --steps 4 --resume r5 --out r5
nl=$'o\nx'
expect 0 'train: wrote o\x0Ax (' -- "$HP" train M $D --steps 2 --out "$nl"
finish

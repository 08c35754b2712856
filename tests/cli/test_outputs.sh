# test_outputs.sh — output files and folders never replace an input or a file hyperpar did not write:
# moe --output and plan -o refuse every input (links included) and names the model folder's reader would pick
# up, before any work; gen --force replaces only an earlier gen output; demo --out only an empty folder or an
# earlier demo's. Each refusal is exit 2 and leaves the inputs byte-identical.
source "$(dirname "$0")/lib.sh"
G="$TESTS/data/golden/qwen3_moe_batched_bf16"
W="$WORK"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
cp -r "$G" "$W/m" && cp "$G/moe_io.safetensors" "$W/x.st"
ln -s "$W/x.st" "$W/xsym.st" && ln "$W/x.st" "$W/xhard.st" && ln -s "$W/m/model.safetensors" "$W/msym.st"
cp "$W/x.st" "$W/ref.st"
intact() { cmp -s "$W/x.st" "$G/moe_io.safetensors" && cmp -s "$W/m/model.safetensors" "$G/model.safetensors" &&
           cmp -s "$W/m/config.json" "$G/config.json" && cmp -s "$W/ref.st" "$G/moe_io.safetensors"; }

# moe --output: refused before the layer runs (no statistics printed), exit 2.
for o in "$W/x.st" "$W/xsym.st" "$W/xhard.st" "$W/msym.st" "$W/ref.st" "$W/m/model.safetensors" "$W/m/config.json" \
         "$W/m/y.safetensors"; do
    out=$("$HP" moe "$W/m" --layer 1 --input "$W/x.st" --compare "$W/ref.st" --output "$o" 2>&1 </dev/null); rc=$?
    check "moe --output $(basename "$o"): exit 2 (rc $rc)" test "$rc" -eq 2
    check "moe --output $(basename "$o"): says it is an input" grep -q "is one of the inputs" <<<"$out"
    check "moe --output $(basename "$o"): refused before any work" bash -c "! grep -q 'tokens per expert' <<<\"\$1\"" _ "$out"
done
check "moe: every input intact" intact
check "moe: links still links" test -L "$W/xsym.st" -a -L "$W/msym.st"
expect 2 "is a folder, not a regular file" -- "$HP" moe "$W/m" --layer 1 --input "$W/x.st" --output "$W/m"
expect 2 "does not exist; create it first" -- "$HP" moe "$W/m" --layer 1 --input "$W/x.st" --output "$W/none/y.st"
expect 2 "needs a file name" -- "$HP" moe "$W/m" --layer 1 --input "$W/x.st" --output ""
expect 0 "" -- "$HP" moe "$W/m" --layer 1 --input "$W/x.st" --output "$W/y.st"
check "moe: a fresh output is written" test -s "$W/y.st"
# Under mpirun the same refusal, printed once, and nothing overwritten.
out=$($MPI -np 2 "$HP" moe "$W/m" --layer 1 --ep 2 --archetype qwen3moe_topk_router --input "$W/x.st" \
      --output "$W/m/model.safetensors" 2>&1 </dev/null); rc=$?
check "moe under mpirun: exit 2 (rc $rc)" test "$rc" -eq 2
check "moe under mpirun: the error printed once" test "$(grep -c 'hyperpar: error' <<<"$out")" -eq 1
check "moe under mpirun: every input intact" intact

# plan -o: a hard link to the config is the config.
ln "$W/m/config.json" "$W/cfg_link.json"
expect 2 "is one of the inputs" -- "$HP" plan "$W/m" --tp 2 -o "$W/cfg_link.json"
check "plan: config intact" intact

# gen --force replaces only an earlier gen output.
mkdir "$W/real" && cp "$G/model.safetensors" "$G/config.json" "$W/real/"
expect 2 "which 'hyperpar gen' did not write" -- "$HP" gen --family qwen3_moe --out "$W/real" --force
check "gen --force: a real checkpoint is untouched" cmp -s "$W/real/model.safetensors" "$G/model.safetensors"
expect 0 "wrote" -- "$HP" gen --family qwen3_moe --out "$W/g"
echo note > "$W/g/notes.txt"
expect 2 "holds 'notes.txt'" -- "$HP" gen --family qwen3_moe --out "$W/g" --force --seed 3
check "gen --force: the user's file is kept" test -f "$W/g/notes.txt"
rm "$W/g/notes.txt"
expect 0 "seed 3" -- "$HP" gen --family qwen3_moe --out "$W/g" --force --seed 3
expect 2 "is not empty" -- "$HP" gen --family qwen3_moe --out "$W/g"

# demo --out: a new, empty or earlier demo folder only.
mkdir "$W/d" && echo keep > "$W/d/x.safetensors"
expect 2 "is not empty and is not an earlier demo's folder" -- "$HP" demo --out "$W/d"
check "demo: the user's file is kept" test "$(cat "$W/d/x.safetensors")" = keep
finish

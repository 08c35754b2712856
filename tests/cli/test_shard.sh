# shard / merge: round trips through the CLI, --plan files, dp links, atomic outputs, every error message.
source "$(dirname "$0")/lib.sh"
G="$TESTS/data/golden"
W="$WORK"

# no_leftovers DIR: the failed command left neither DIR nor a temporary sibling behind.
no_leftovers() { [ ! -e "$1" ] && ! ls -d "$1".tmp.* >/dev/null 2>&1; }

# Round trip: shard, merge, and re-shard the merged checkpoint: the rank files must be byte-identical.
roundtrip() {
    local name="$1"; shift
    local d="$W/rt_$name$RANDOM"
    expect 0 "sharded into" -- "$HP" shard "$G/$name" --out "$d/a" --threads 2 "$@"
    expect 0 "merged into" -- "$HP" merge "$d/a" --out "$d/m"
    expect 0 "sharded into" -- "$HP" shard "$d/m" --out "$d/b" "$@"
    local same=1
    for f in "$d"/a/rank-*.safetensors; do cmp -s "$f" "$d/b/$(basename "$f")" || same=0; done
    check "$name $*: re-sharding the merged checkpoint gives identical rank files" test "$same" -eq 1
    "$HP" inspect "$G/$name" --tensors > "$d/src.txt" 2>&1
    "$HP" inspect "$d/m" --tensors > "$d/dst.txt" 2>&1
    check "$name $*: same tensors after merge" cmp -s <(grep -v '^path\|^  path' "$d/src.txt" | sed 1d) <(grep -v '^path\|^  path' "$d/dst.txt" | sed 1d)
}
roundtrip mixtral_per_expert_f32 --tp 2 --ep 2
roundtrip qwen3_moe_batched_bf16 --tp 2 --packed-fused
roundtrip gpt_oss_batched_f32 --dp 2 --tp 2 --ep 4
roundtrip qwen2_moe_per_expert_f32 --mesh tp=2,ep=2
roundtrip deepseek_v3_per_expert_f32 --cp 2

# World = product of the mesh (dp included); the manifest lists every rank; dp replicas share an inode.
expect 0 "2 files + 2 replica links" -- "$HP" shard "$G/mixtral_per_expert_f32" --dp 2 --tp 2 --out "$W/dp"
check "four rank files" test "$(ls "$W"/dp/rank-*.safetensors | wc -l)" -eq 4
check "manifest lists rank 3" grep -q '"file": "rank-00003.safetensors"' "$W/dp/manifest.json"
check "dp replica is a hard link" test "$(stat -c %i "$W/dp/rank-00000.safetensors")" = "$(stat -c %i "$W/dp/rank-00002.safetensors")"
check "config.json copied" test -f "$W/dp/config.json"

# --plan: the JSON 'hyperpar plan' writes; its file name and fingerprint go into the manifest.
expect 0 "" -- "$HP" plan "$G/qwen3_moe_batched_bf16" --tp 2 --ep 2 -o "$W/plan.json"
expect 0 "sharded into" -- "$HP" shard "$G/qwen3_moe_batched_bf16" --plan "$W/plan.json" --out "$W/fromplan"
check "manifest names the plan file" grep -q '"file": "plan.json"' "$W/fromplan/manifest.json"
expect 0 "sharded into" -- "$HP" shard "$G/qwen3_moe_batched_bf16" --tp 2 --ep 2 --out "$W/derived"
check "--plan and the same flags give the same rank files" cmp -s "$W/fromplan/rank-00001.safetensors" "$W/derived/rank-00001.safetensors"

# merge --max-shard-size: an index plus numbered files.
expect 0 "merged into" -- "$HP" merge "$W/fromplan" --out "$W/split" --max-shard-size 200KB
check "index written" test -f "$W/split/model.safetensors.index.json"
check "numbered files" test -f "$W/split/model-00001-of-00005.safetensors"
expect 0 "\"num_tensors\": 25," -- "$HP" inspect "$W/split" --json

# Without --force a non-empty folder is refused (exit 2) and untouched; --force replaces only an earlier
# hyperpar output, never a folder of the user's.
mkdir -p "$W/full" && echo keep > "$W/full/keep.txt"
expect 2 "is not empty; choose another --out or pass --force" -- "$HP" shard "$G/mixtral_per_expert_f32" --tp 2 --out "$W/full"
check "non-empty folder untouched" test -f "$W/full/keep.txt"
check "no temporary folder left" test -z "$(ls -d "$W"/full.tmp.* 2>/dev/null)"
expect 2 "was not written by hyperpar; --force replaces only a folder" -- "$HP" shard "$G/mixtral_per_expert_f32" --tp 2 --out "$W/full" --force
check "--force left the user's folder alone" test -f "$W/full/keep.txt"
expect 0 "sharded into" -- "$HP" shard "$G/mixtral_per_expert_f32" --tp 2 --out "$W/ours"
expect 0 "sharded into" -- "$HP" shard "$G/mixtral_per_expert_f32" --dp 2 --tp 2 --out "$W/ours" --force
check "--force replaced an earlier output" test -f "$W/ours/rank-00003.safetensors" -a -f "$W/ours/.hyperpar-output"
expect 2 "is not empty; choose another --out or pass --force" -- "$HP" merge "$W/dp" --out "$W/full"

# A plan for another model: exit 2, the first differences listed, no output.
expect 2 "does not match the checkpoint" -- "$HP" shard "$G/mixtral_per_expert_f32" --plan "$W/plan.json" --out "$W/bad1"
expect 2 "is in the plan but not in the checkpoint" -- "$HP" shard "$G/mixtral_per_expert_f32" --plan "$W/plan.json" --out "$W/bad1"
check "no output after a plan mismatch" no_leftovers "$W/bad1"
printf '{"format": "hyperpar-hf-tp-plan", "version": 1}' > "$W/hf.json"
expect 2 "not \"hyperpar-plan\"" -- "$HP" shard "$G/mixtral_per_expert_f32" --plan "$W/hf.json" --out "$W/bad2"
sed 's/"version": 1/"version": 7/' "$W/plan.json" > "$W/v7.json"
expect 2 "plan format version 7 is not supported" -- "$HP" shard "$G/qwen3_moe_batched_bf16" --plan "$W/v7.json" --out "$W/bad2"
check "no output after a bad plan" no_leftovers "$W/bad2"

# Planner refusals and usage errors.
expect 2 "--packed-fused" -- "$HP" shard "$G/qwen3_moe_batched_bf16" --tp 2 --out "$W/bad3"
check "no output after a planner error" no_leftovers "$W/bad3"
expect 2 "give either --plan or the plan flags" -- "$HP" shard "$G/qwen3_moe_batched_bf16" --plan "$W/plan.json" --tp 2 --out "$W/bad3"
expect 2 "--out DIR is required" -- "$HP" shard "$G/qwen3_moe_batched_bf16" --tp 2
expect 2 "--max-shard-size expects a size" -- "$HP" merge "$W/dp" --out "$W/bad3" --max-shard-size lots
expect 2 "holds no weights" -- "$HP" shard "$TESTS/data/configs/llama-3-8b.json" --tp 2 --out "$W/bad3"

# merge: corrupt manifest, missing rank file, truncated rank file, foreign rank file.
cp -r "$W/dp" "$W/c1" && head -c 300 "$W/dp/manifest.json" > "$W/c1/manifest.json"
expect 2 "manifest.json" -- "$HP" merge "$W/c1" --out "$W/m1"
check "no output after a corrupt manifest" no_leftovers "$W/m1"
cp -r "$W/dp" "$W/c2" && sed -i 's/"hyperpar-shards"/"something-else"/' "$W/c2/manifest.json"
expect 2 "not a manifest written by 'hyperpar shard'" -- "$HP" merge "$W/c2" --out "$W/m2"
cp -r "$W/dp" "$W/c3" && rm "$W/c3/rank-00003.safetensors"
expect 2 "rank 3: $W/c3/rank-00003.safetensors is missing" -- "$HP" merge "$W/c3" --out "$W/m3"
check "no output after a missing rank file" no_leftovers "$W/m3"
cp -r "$W/dp" "$W/c4" && rm "$W/c4/rank-00001.safetensors" && head -c 5000 "$W/dp/rank-00001.safetensors" > "$W/c4/rank-00001.safetensors"
expect 2 "rank 1: " -- "$HP" merge "$W/c4" --out "$W/m4"
expect 2 "truncated" -- "$HP" merge "$W/c4" --out "$W/m4"
check "no output after a truncated rank file" no_leftovers "$W/m4"
cp -r "$W/dp" "$W/c5" && rm "$W/c5/rank-00001.safetensors" && cp "$W/derived/rank-00001.safetensors" "$W/c5/rank-00001.safetensors"
expect 2 "belongs to another shard folder" -- "$HP" merge "$W/c5" --out "$W/m5"
rm -f "$W/c5/manifest.json"
expect 2 "manifest.json is missing" -- "$HP" merge "$W/c5" --out "$W/m5"
expect 2 "no such folder" -- "$HP" merge "$W/nothing" --out "$W/m5"
check "no output after merge errors" no_leftovers "$W/m5"
finish

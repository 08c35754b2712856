# A checkpoint truncated by another process while a command reads it: exit 1 with "changed while reading",
# never SIGBUS (exit 135), and no output file. HP_TEST_PAUSE_BEFORE_READ=P makes the first read of a mapped
# file create P.ready and wait for P.go, so the truncation happens at exactly that point.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"

# truncated_while NAME SIZE FILE -- command... : runs the command paused before its first read, truncates FILE
# to SIZE bytes, lets it go; the exit status must be 1 with the message naming FILE. The pause is at the first
# read of FILE itself (HP_TEST_PAUSE_READ_OF), after it was opened and checked.
truncated_while() {
    local name="$1" size="$2" file="$3"
    shift 4
    rm -f "$WORK/$name".*
    HP_TEST_PAUSE_BEFORE_READ="$WORK/$name" HP_TEST_PAUSE_READ_OF="$(basename "$file")" "$@" >"$WORK/$name.log" 2>&1 </dev/null &
    local pid=$! i
    for i in $(seq 600); do [ -e "$WORK/$name.ready" ] && break; sleep 0.05; done
    check "$name: paused before reading" test -e "$WORK/$name.ready"
    truncate -s "$size" "$file"
    touch "$WORK/$name.go"
    wait "$pid"
    local rc=$?
    check "$name: exit 1, not $rc" test "$rc" -eq 1
    check "$name: the message names the file" grep -qF "$(basename "$file") changed while reading (truncated or rewritten by another process)" "$WORK/$name.log"
    grep -q "changed while reading" "$WORK/$name.log" || cat "$WORK/$name.log"
}

# run: the weight loader (sliced from the checkpoint), one process and a tensor cut (tp 1 of 1 loads whole
# tensors; the slicing path is the same hp_st_read).
for size in 0 4096 200000; do
    rm -rf "$WORK/m" && cp -r data/forward/llama "$WORK/m"
    truncated_while "run$size" $size "$WORK/m/model.safetensors" -- \
        "$HP" run "$WORK/m" --input data/forward/llama/forward_io.safetensors --output "$WORK/out$size.st"
    check "run$size: no output file" test ! -e "$WORK/out$size.st"
    check "run$size: no temporary left" bash -c "! ls '$WORK'/out$size.st.tmp.* 2>/dev/null | grep -q ."
done

# run from a shard folder: the rank file is what is truncated.
rm -rf "$WORK/m" "$WORK/s" && cp -r data/forward/llama "$WORK/m"
"$HP" shard "$WORK/m" --tp 1 --out "$WORK/s" --quiet >/dev/null 2>&1
rankfile=$(ls "$WORK"/s/*.safetensors | head -1)
truncated_while "runshard" 4096 "$rankfile" -- \
    "$HP" run "$WORK/s" --input data/forward/llama/forward_io.safetensors --output "$WORK/outs.st"
check "runshard: no output file" test ! -e "$WORK/outs.st"

# train on a safetensors token file cut by 8 bytes: inside the mapping's last page, where a read gives zeros, not
# SIGBUS (issue 36 T10: it trained on those zeros with exit 0); each read asks the file's size first and after.
python3 - "$WORK/tok.safetensors" <<'PY'
import json, struct, sys
ids = [(i * 7 + 3) % 128 for i in range(8 * 16)]
h = json.dumps({"input_ids": {"dtype": "I64", "shape": [8, 16], "data_offsets": [0, 8 * len(ids)]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%dq" % len(ids), *ids))
PY
tsize=$(stat -c %s "$WORK/tok.safetensors")
truncated_while "traintok" $((tsize - 8)) "$WORK/tok.safetensors" -- \
    "$HP" train data/forward/llama --data "$WORK/tok.safetensors" --seq 16 --global-batch 4 --shuffle none \
    --steps 2 --out "$WORK/trained"
check "traintok: no output folder" test ! -e "$WORK/trained"

# The same model untouched still runs (the hook only pauses).
rm -rf "$WORK/m" && cp -r data/forward/llama "$WORK/m"
rm -f "$WORK"/ok.*
(sleep 0.5; touch "$WORK/ok.go") &
HP_TEST_PAUSE_BEFORE_READ="$WORK/ok" "$HP" run "$WORK/m" --input data/forward/llama/forward_io.safetensors \
    --compare data/forward/llama/forward_io.safetensors >"$WORK/ok.log" 2>&1
check "untouched: exit 0" test $? -eq 0
wait

# moe: the MoE loader and the layer identity read through hp_st_read too (bf16, batched: copied, and the
# per-expert f32 checkpoint), the input x separately (the pause comes at the first read, x's; the model is
# already open then, so its truncation is seen by the loader).
for g in qwen3_moe_batched_bf16 mixtral_per_expert_f32; do
    rm -rf "$WORK/q" && cp -r "data/golden/$g" "$WORK/q" && mv "$WORK/q/moe_io.safetensors" "$WORK/io.st"
    truncated_while "moe_$g" 4096 "$WORK/q/model.safetensors" -- \
        "$HP" moe "$WORK/q" --layer 1 --input "$WORK/io.st" --output "$WORK/y.st"
    check "moe_$g: no output file" test ! -e "$WORK/y.st"
done
finish

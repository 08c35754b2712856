# hyperpar train --text: a text tokenized on the fly (tests/data/text's tokenizer, 120 ids, on the llama golden of
# vocabulary 128). Bit for bit the run of --data on the token file `hyperpar tokenize` makes of the same documents
# with EOS after each (plain text; JSON Lines with shuffle, micro-batches and --eval-data; the model's own
# tokenizer.json by default); conversations equal transformers' apply_chat_template stream; --loss-mask gives the
# same loss and gradients at 1 process, tp=2 (with loss-parallel), cp=2, dp=2, pp=2 and dp=2 x tp=2, and
# transformers' with labels -100 outside the assistant mask and num_items_in_batch (train_text_ref.py); a resume
# must see the same token stream; hostile inputs exit 2 with nothing written.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
M=data/forward/llama
T=data/text
REF="python3 cli/train_text_ref.py"
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"

# Seeded documents in the tokenizer's alphabet: docs.jsonl (60 texts), plain.txt (one of them), chat.jsonl (40
# conversations, some with a system message, one to three exchanges, one without an assistant reply).
python3 - "$WORK" <<'EOF2'
import json, random, sys
w = sys.argv[1]
random.seed(5)
V = "the cat sat on a mat and dog ran to big red sun hello world what is two plus yes no one three".split()
say = lambda a, b: " ".join(random.choice(V) for _ in range(random.randint(a, b)))
docs = [say(3, 40) + random.choice([".", "?", "!\n", ".\n\n"]) for _ in range(60)]
open(w + "/docs.jsonl", "w").write("".join(json.dumps({"text": d, "n": i}) + "\n" for i, d in enumerate(docs)))
open(w + "/plain.txt", "w").write("\n".join(docs))
for i, d in enumerate(docs):
    open("%s/doc%02d.txt" % (w, i), "w").write(d)
convs = []
for i in range(40):
    m = [{"role": "system", "content": "you are a " + say(1, 3) + "."}] if i % 4 == 0 else []
    for _ in range(random.randint(1, 3)):
        m += [{"role": "user", "content": say(2, 9) + "?"}, {"role": "assistant", "content": say(1, 14) + "."}]
    convs.append(m[:-1] if i == 7 else m)
open(w + "/chat.jsonl", "w").write("".join(json.dumps({"messages": m}) + "\n" for m in convs))
EOF2
# The token file of the same documents: `hyperpar tokenize` of each, EOS (<|im_end|>, id 2) after each.
eos_after() { python3 -c "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read() + b'\x02\x00')" "$1"; }
"$HP" tokenize $T --text "$WORK/plain.txt" --out "$WORK/plain.tok" >/dev/null 2>&1
eos_after "$WORK/plain.tok" > "$WORK/plain.bin"
: > "$WORK/docs.bin"
for f in "$WORK"/doc??.txt; do
    "$HP" tokenize $T --text "$f" --out "$WORK/one.tok" >/dev/null 2>&1 && eos_after "$WORK/one.tok" >> "$WORK/docs.bin"
done
check "the token files were made" test -s "$WORK/plain.bin" -a "$(stat -c %s "$WORK/docs.bin")" -gt 1000

same_files() { cmp -s "$1" "$2" && cmp -s "$3/model.safetensors" "$4/model.safetensors"; }
# Plain text: one document.
P="--seq 16 --global-batch 4 --steps 3 --lr 1e-2"
expect 0 "--text $WORK/plain.txt: 1 document," -- "$HP" train $M --text "$WORK/plain.txt" --tokenizer $T $P \
    --grad-out "$WORK/p1.g" --out "$WORK/p1"
expect 0 "step 3/3" -- "$HP" train $M --data "$WORK/plain.bin" $P --grad-out "$WORK/p2.g" --out "$WORK/p2"
check "plain text: the gradients and the model of --data on its token file, bit for bit" \
    same_files "$WORK/p1.g" "$WORK/p2.g" "$WORK/p1" "$WORK/p2"
# JSON Lines, seeded order, micro-batches, an evaluation of the same file.
J="--seq 12 --global-batch 4 --micro-batch 2 --steps 4 --seed 7 --lr 1e-2 --eval-every 2"
expect 0 "--text $WORK/docs.jsonl: 60 documents," -- "$HP" train $M --text "$WORK/docs.jsonl" --tokenizer $T $J \
    --eval-data "$WORK/docs.jsonl" --grad-out "$WORK/j1.g" --out "$WORK/j1" --log-json "$WORK/j1.log"
expect 0 "step 4/4" -- "$HP" train $M --data "$WORK/docs.bin" $J --eval-data "$WORK/docs.bin" \
    --grad-out "$WORK/j2.g" --out "$WORK/j2" --log-json "$WORK/j2.log"
check "JSON Lines: the gradients and the model of --data on the token file, bit for bit" \
    same_files "$WORK/j1.g" "$WORK/j2.g" "$WORK/j1" "$WORK/j2"
check "and the same losses and eval losses" python3 - "$WORK/j1.log" "$WORK/j2.log" <<'EOF2'
import json, sys
a, b = ([{k: v for k, v in json.loads(l).items() if k in ("loss", "grad_norm", "eval_loss")} for l in open(p)]
        for p in sys.argv[1:])
assert a == b and len(a) == 4 and "eval_loss" in a[1], (a, b)
EOF2
# The model's own tokenizer.json by default (a copy of the model with the tokenizer beside it).
mkdir -p "$WORK/mt" && cp $M/config.json $M/model.safetensors $T/tokenizer.json $T/tokenizer_config.json "$WORK/mt/"
expect 0 "step 3/3" -- "$HP" train "$WORK/mt" --text "$WORK/plain.txt" $P --grad-out "$WORK/p3.g"
check "the model's tokenizer by default: the same run" cmp -s "$WORK/p1.g" "$WORK/p3.g"

# Conversations without a mask: transformers' apply_chat_template stream (ids equal, so the run is bit for bit).
torch_or_skip() { # $1: the helper's exit code; 77 (no torch/transformers) is a skip unless HP_REQUIRE_TORCH=1
    [ "$1" -eq 0 ] || { [ "$1" -eq 77 ] && [ "${HP_REQUIRE_TORCH:-0}" != 1 ]; }
}
$REF stream $T "$WORK/chat.jsonl" "$WORK/chat.bin" > "$WORK/ref.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    C="--seq 16 --global-batch 4 --steps 2 --lr 1e-2 --shuffle none"
    expect 0 "step 2/2" -- "$HP" train $M --text "$WORK/chat.jsonl" --tokenizer $T $C --grad-out "$WORK/c1.g"
    expect 0 "step 2/2" -- "$HP" train $M --data "$WORK/chat.bin" $C --grad-out "$WORK/c2.g"
    check "conversations: transformers' chat-template stream, bit for bit" cmp -s "$WORK/c1.g" "$WORK/c2.g"
else
    echo "transformers' stream: $(tail -1 "$WORK/ref.log")"
    check "transformers' stream (exit $rc)" torch_or_skip $rc
fi

# --loss-mask: the same loss and gradients on every mesh (f32 reduction order), and transformers'.
L="--text $WORK/chat.jsonl --tokenizer $T --loss-mask --seq 32 --global-batch 8 --shuffle none --steps 2 --lr 1e-2"
expect 0 "3071 tokens with EOS after each (978 of them the assistant's, counted in the loss)" -- "$HP" train $M $L --grad-out "$WORK/m1.g"
close() { # the grad files $1 and $2: every tensor within 1e-5 of its largest entry, the losses within 1e-6
    python3 - "$1" "$2" <<'EOF2'
import json, struct, sys
def rd(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = rd(sys.argv[1]), rd(sys.argv[2])
assert sorted(a) == sorted(b) and len(a) == 22, sorted(a)
for k in a:
    m = max(abs(x) for x in a[k])
    d = max(abs(x - y) for x, y in zip(a[k], b[k]))
    assert d <= (1e-6 if k == "loss" else 1e-5) * m, (k, d, m)
EOF2
}
while read -r tag flags; do
    expect 0 "step 2/2" -- $MPI -np 2 "$HP" train $M $L $flags --grad-out "$WORK/m.$tag.g"
    check "--loss-mask at $flags: the loss and gradients of 1 process" close "$WORK/m1.g" "$WORK/m.$tag.g"
done <<'LIST'
tp2 --tp 2
tplp --tp 2 --loss-parallel
cp2 --cp 2
dp2 --dp 2 --micro-batch 2
pp2 --pp 2 --micro-batch 2
LIST
expect 0 "step 2/2" -- $MPI -np 4 "$HP" train $M $L --dp 2 --tp 2 --micro-batch 2 --grad-out "$WORK/m.4.g"
check "--loss-mask at dp=2 x tp=2, 2 micro-batches: the loss and gradients of 1 process" close "$WORK/m1.g" "$WORK/m.4.g"
$REF grads $M $T "$WORK/chat.jsonl" 32 8 "$WORK/m1.g" > "$WORK/ref.log" 2>&1
rc=$?
grep "torch:\|FAIL\|SKIP" "$WORK/ref.log"
check "--loss-mask: transformers' loss and gradients with labels -100 outside the assistant mask (exit $rc)" \
    torch_or_skip $rc
# --eval-data with --loss-mask: the mean over every assistant target of its windows, before any update (--steps 1
# with cosine: lr 0), as transformers computes it; the same at dp=2.
E="--text $WORK/chat.jsonl --tokenizer $T --loss-mask --seq 24 --global-batch 3 --eval-data $WORK/chat.jsonl --eval-every 1"
expect 0 "eval loss" -- "$HP" train $M $E --log-json "$WORK/e1.log"
expect 0 "eval loss" -- $MPI -np 2 "$HP" train $M $E --dp 2 --log-json "$WORK/e2.log"
ev=$(python3 -c "import json, sys; print(json.loads(open(sys.argv[1]).readline())['eval_loss'])" "$WORK/e1.log")
check "--eval-data at dp=2: the same eval loss" python3 -c "
import json, sys; a, b = (json.loads(open(p).readline())['eval_loss'] for p in sys.argv[1:])
assert abs(a - b) <= 1e-6 * abs(a), (a, b)" "$WORK/e1.log" "$WORK/e2.log"
$REF eval $M $T "$WORK/chat.jsonl" 24 "$ev" > "$WORK/ref.log" 2>&1
rc=$?
grep "torch:\|SKIP" "$WORK/ref.log"
check "--eval-data --loss-mask: transformers' mean over the assistant targets (exit $rc)" torch_or_skip $rc
# The mask changes the loss: without it (every target) step 1's loss is another.
expect 0 "step 2/2" -- "$HP" train $M ${L/--loss-mask/} --grad-out "$WORK/nm.g"
check "without --loss-mask: another loss" python3 -c "
import sys; a, b = (open(p, 'rb').read()[-8:] for p in sys.argv[1:]); sys.exit(a == b)" "$WORK/m1.g" "$WORK/nm.g"

# A checkpoint binds the token stream: a resume with another tokenizer's stream is refused; with the same text it
# continues to the uninterrupted run's model.
R="--text $WORK/docs.jsonl --tokenizer $T --seq 12 --global-batch 4 --steps 3 --lr 1e-2"
expect 0 "step 3/3" -- "$HP" train $M $R --out "$WORK/full"
expect 0 "step 2/3" -- "$HP" train $M $R --out "$WORK/run" --save-every 1 --stop-after 2
python3 -c "import sys; sys.stdout.write(open(sys.argv[1]).read().replace('what', 'who'))" "$WORK/docs.jsonl" > "$WORK/other.jsonl"
expect 2 "the run was saved training on other data" -- "$HP" train $M ${R/docs.jsonl/other.jsonl} --out "$WORK/run" \
    --save-every 1 --resume "$WORK/run"
expect 0 "step 3/3" -- "$HP" train $M $R --out "$WORK/run" --save-every 1 --resume "$WORK/run"
check "resumed: the uninterrupted run's model" cmp -s "$WORK/full/model.safetensors" "$WORK/run/step-3/model.safetensors"

# Hostile inputs: exit 2, nothing written.
printf '{"text": "the cat"}\n{"text": the dog}\n' > "$WORK/bad.jsonl"
printf '{"text": "the cat"}\n{"txt": "the dog"}\n' > "$WORK/notext.jsonl"
: > "$WORK/empty.txt"
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes."}]}\n{"text": "no"}\n' \
    > "$WORK/mixed.jsonl"
mkdir -p "$WORK/big" && python3 - "$T" "$WORK/big" <<'EOF2'
import json, sys
t = json.load(open(sys.argv[1] + "/tokenizer.json"))
t["added_tokens"].append({"id": 150, "content": "<|big|>", "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
json.dump(t, open(sys.argv[2] + "/tokenizer.json", "w"))
open(sys.argv[2] + "/tokenizer_config.json", "w").write(open(sys.argv[1] + "/tokenizer_config.json").read())
EOF2
printf 'the cat<|big|> sat on the mat and the dog ran to the sun.' > "$WORK/big.txt"
S="--seq 4 --global-batch 2 --out $WORK/never"
expect 2 "--text is tokenized with the model's tokenizer:" -- "$HP" train $M --text "$WORK/plain.txt" $S
expect 2 "bad.jsonl: line 2, column" -- "$HP" train $M --text "$WORK/bad.jsonl" --tokenizer $T $S
expect 2 "notext.jsonl: line 2: no \"text\"" -- "$HP" train $M --text "$WORK/notext.jsonl" --tokenizer $T $S
expect 2 "empty.txt is empty: there is no text to train on" -- "$HP" train $M --text "$WORK/empty.txt" --tokenizer $T $S
expect 2 "give one of --input (the same batch every step), --data (a token file) and --text" -- \
    "$HP" train $M --text "$WORK/plain.txt" --data "$WORK/plain.bin" --tokenizer $T $S
expect 2 "mixed.jsonl: line 2 has no \"messages\": --loss-mask trains on conversations" -- \
    "$HP" train $M --text "$WORK/mixed.jsonl" --tokenizer $T --loss-mask $S
expect 2 "--loss-mask: $WORK/plain.txt is not a .jsonl file" -- \
    "$HP" train $M --text "$WORK/plain.txt" --tokenizer $T --loss-mask $S
expect 2 "--loss-mask goes with --text FILE" -- "$HP" train $M --data "$WORK/plain.bin" --loss-mask $S
expect 2 "--tokenizer goes with --text FILE" -- "$HP" train $M --data "$WORK/plain.bin" --tokenizer $T $S
expect 2 "--data-dtype goes with --data" -- "$HP" train $M --text "$WORK/plain.txt" --tokenizer $T --data-dtype uint32 $S
expect 2 "--text needs --seq S" -- "$HP" train $M --text "$WORK/plain.txt" --tokenizer $T --global-batch 2
expect 2 "outside the vocabulary [0, 128) of the model; the tokenizer is not the model's" -- \
    "$HP" train $M --text "$WORK/big.txt" --tokenizer "$WORK/big" $S
expect 2 "fewer than one window of --seq 400" -- "$HP" train $M --text "$WORK/big.txt" --tokenizer $T --seq 400 \
    --global-batch 1 --out "$WORK/never"
expect 2 "hold no assistant token" -- "$HP" train $M --text "$WORK/chat.jsonl" --tokenizer $T --loss-mask --seq 4 \
    --global-batch 1 --shuffle none --out "$WORK/never"
expect 2 "bad.jsonl: line 2, column 12: not JSON" -- $MPI -np 2 "$HP" train $M --text "$WORK/bad.jsonl" --tokenizer $T $S --dp 2
# Every rank must be given the same text and tokenizer, compared by identity (mpirun's MPMD form): other files
# differ, the same bytes under another name (a copy; the tokenizer's folder or its tokenizer.json) agree.
cp "$WORK/plain.txt" "$WORK/same.txt"
mkdir -p "$WORK/tk2" && cp $T/tokenizer.json "$WORK/tk2/" && sed 's/<|im_end|>"/<|endoftext|>"/' \
    $T/tokenizer_config.json > "$WORK/tk2/tokenizer_config.json"
A="train $M --tokenizer $T --seq 4 --global-batch 2 --out $WORK/never"
expect 2 "rank 1 was given --text $WORK/docs.jsonl where rank 0 has --text $WORK/plain.txt" -- \
    $MPI -np 1 "$HP" $A --text "$WORK/plain.txt" : -np 1 "$HP" $A --text "$WORK/docs.jsonl"
expect 2 "rank 1 was given --tokenizer $WORK/tk2 where rank 0 has --tokenizer $T" -- $MPI -np 1 "$HP" train $M --text "$WORK/plain.txt" --tokenizer $T \
    --seq 4 --global-batch 2 --out "$WORK/never" : -np 1 "$HP" train $M --text "$WORK/plain.txt" --tokenizer \
    "$WORK/tk2" --seq 4 --global-batch 2 --out "$WORK/never"
expect 0 "step 1/1" -- $MPI -np 1 "$HP" train $M --text "$WORK/plain.txt" --tokenizer $T --seq 4 --global-batch 2 : \
    -np 1 "$HP" train $M --text "$WORK/same.txt" --tokenizer "$TESTS/$T/tokenizer.json" --seq 4 --global-batch 2
check "nothing was written" test ! -e "$WORK/never"
finish

# hyperpar generate: tokens stream on stdout and equal --output's rows; the default eos ends a row (and --eos none
# runs every row to --max-new-tokens); usage and input errors exit 2 and write nothing; ranks given other options
# exit 2 naming them. (tests/python/generate_check.py compares the tokens with transformers' generate.)
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
G=data/forward/llama
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
expect 0 "hyperpar generate MODEL --ids LIST" -- "$HP" generate --help
expect 0 "8 prompt tokens:" -- "$HP" generate $G --ids "82,105,40,96,82,20,104,73" -n 40 -o "$WORK/a.st"
out=$("$HP" generate $G --ids "82,105,40,96,82,20,104,73" -n 40 2>/dev/null)
check "streamed tokens = --output's row" python3 - "$WORK/a.st" "$out" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
t = h["input_ids"]; assert t["dtype"] == "I64" and t["shape"][0] == 1, t
lo, hi = t["data_offsets"]; ids = struct.unpack("<%dq" % ((hi - lo) // 8), b[8 + n + lo:8 + n + hi])
streamed = [int(x) for x in sys.argv[2].split(":")[1].split()]
assert list(ids[:8]) == [82, 105, 40, 96, 82, 20, 104, 73], ids
assert list(ids[8:8 + len(streamed)]) == streamed, (ids, streamed)
# llama's eos is 2: the stream ends at it (or at 40 tokens)
assert streamed[-1] == 2 or len(streamed) == 40, streamed
assert 2 not in streamed[:-1], streamed
PY
check "--eos none: every row runs --max-new-tokens" test "$("$HP" generate $G --ids "82,105,40,96,82,20,104,73" -n 40 --eos none 2>/dev/null | wc -w)" = 43
check "-n 0: the prompt alone" test "$("$HP" generate $G --ids "1,2,3" -n 0 2>/dev/null | wc -w)" = 3
expect 0 "0: " -- "$HP" generate $G --ids "1,2,3;4,5,6" -n 3 --eos none
expect 2 "--top-k and --top-p filter a sampled pick" -- "$HP" generate $G --ids 1,2 --top-k 5
expect 2 "--eos expects 'none' or at most 8" -- "$HP" generate $G --ids 1,2 --eos 1,x
expect 2 "--eos expects 'none' or at most 8" -- "$HP" generate $G --ids 1,2 --eos 100000
expect 2 "--top-p expects" -- "$HP" generate $G --ids 1,2 --temperature 1 --top-p 0
expect 2 "--temperature expects" -- "$HP" generate $G --ids 1,2 --temperature -1
expect 2 "missing the input" -- "$HP" generate $G
expect 2 "missing MODEL" -- "$HP" generate --ids 1,2
expect 2 "" -- "$HP" generate $G --ids 1,999999
expect 2 "" -- "$HP" generate "$WORK/nothing" --ids 1,2
mkdir "$WORK/d"
expect 2 "--output" -- "$HP" generate $G --ids 1,2 -o "$WORK/d"
check "a refused run writes no output" test ! -e "$WORK/none.st"
expect 2 "" -- "$HP" generate $G --ids 1,2 --eos bad -o "$WORK/none.st"
check "still no output" test ! -e "$WORK/none.st"
printf '{"eos_token_id": "x"}' > "$WORK/gc.json"
mkdir "$WORK/m" && cp $G/config.json $G/model.safetensors "$WORK/m/" && cp "$WORK/gc.json" "$WORK/m/generation_config.json"
expect 2 "eos_token_id is not an id" -- "$HP" generate "$WORK/m" --ids 1,2
printf '{"eos_token_id": [5, 7]}' > "$WORK/m/generation_config.json"
check "generation_config.json's eos ends the row" python3 - "$HP" "$WORK/m" <<'PY'
import subprocess, sys
out = subprocess.run([sys.argv[1], "generate", sys.argv[2], "--ids", "82,105,40,96,82,20,104,73", "-n", "60"],
                     capture_output=True, text=True).stdout
toks = [int(x) for x in out.split(":")[1].split()]
assert len(toks) == 60 or toks[-1] in (5, 7), toks
assert not any(t in (5, 7) for t in toks[:-1]), toks
PY
# a config.json whose eos_token_id is not an id: plan and run take it, generate refuses it unless --eos is given
mkdir "$WORK/e" && cp $G/model.safetensors "$WORK/e/" && sed 's/"eos_token_id": 2/"eos_token_id": "two"/' $G/config.json > "$WORK/e/config.json"
expect 0 "" -- "$HP" plan "$WORK/e"
expect 2 "eos_token_id is not an id or a list of at most 8 ids (give --eos)" -- "$HP" generate "$WORK/e" --ids 1,2
expect 0 "2 prompt tokens:" -- "$HP" generate "$WORK/e" --ids 1,2 --eos 2 -n 3
# text prompts: the refusals (tests/python/generate_check.py runs SmolLM2's text and chat)
expect 2 "--prompt and --ids are two prompts" -- "$HP" generate $G --prompt hi --ids 1,2
expect 2 "--chat, --system and --tokenizer belong to --prompt TEXT" -- "$HP" generate $G --ids 1,2 --chat
expect 2 "--system is a chat's: give --chat too" -- "$HP" generate $G --prompt hi --system x
expect 2 "the folder has no tokenizer.json" -- "$HP" generate $G --prompt hi
# a tiny byte-level tokenizer beside the model: the prompt encodes, and --chat without a chat template is refused
python3 - "$WORK/m" <<'PY'
import json, sys
d = sys.argv[1]
byte = {}
n = 0
for b in list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256)):
    byte[b] = chr(b)
for b in range(256):
    if b not in byte:
        byte[b] = chr(256 + n); n += 1
vocab = {byte[b]: i for i, b in enumerate(range(128))}
tok = {"version": "1.0", "added_tokens": [], "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                             "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                 "vocab": vocab, "merges": []}}
json.dump(tok, open(d + "/tokenizer.json", "w"))
json.dump({"eos_token_id": 2}, open(d + "/generation_config.json", "w"))
PY
expect 0 "hello" -- "$HP" generate "$WORK/m" --prompt "hello" -n 4
expect 2 "the tokenizer has no chat_template" -- "$HP" generate "$WORK/m" --prompt "hello" --chat
printf '{"chat_template": "{{ messages }}"}' > "$WORK/m/tokenizer_config.json"
expect 2 "not a ChatML one" -- "$HP" generate "$WORK/m" --prompt "hello" --chat
expect 2 "rank 1 was given --max-new-tokens 5 where rank 0 has --max-new-tokens 4" -- \
    $MPI -np 1 "$HP" generate $G --ids 1,2,3 -n 4 : -np 1 "$HP" generate $G --ids 1,2,3 -n 5
finish

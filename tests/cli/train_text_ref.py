"""train_text_ref.py — Hugging Face's side of `hyperpar train --text` (tests/cli/test_train_text.sh).

usage:
  python3 train_text_ref.py stream TOKDIR FILE.jsonl OUT.bin
      the token stream transformers makes of FILE.jsonl with the tokenizer in TOKDIR, written as a uint16 token
      file: each {"text"} line tokenizer(text).input_ids, each {"messages"} line apply_chat_template(messages,
      tokenize=True), and the tokenizer's eos_token_id after each document
  python3 train_text_ref.py grads MODEL TOKDIR FILE.jsonl SEQ GB GRAD_OUT
      the first step of `train MODEL --text FILE.jsonl --tokenizer TOKDIR --loss-mask --seq SEQ --global-batch GB
      --shuffle none` in PyTorch: windows 0..GB-1 of the stream (SEQ + 1 tokens each, one token shared), labels the
      ids where apply_chat_template's assistant mask (return_assistant_tokens_mask, the template's {% generation %}
      blocks) is 1 and -100 elsewhere, the model's loss with num_items_in_batch = the labelled targets of the whole
      batch (transformers' ForCausalLMLoss: the sum over them / their number); its loss and every gradient against
      GRAD_OUT (hyperpar's --grad-out): per tensor max|d| <= 1e-4 * max|ref| + 1e-7 (train_check.py's bar), the
      loss within 1e-5 relative.
  python3 train_text_ref.py eval MODEL TOKDIR FILE.jsonl SEQ LOSS
      the mean loss over every labelled target of every window of FILE.jsonl's stream (the assistant mask), as
      `--eval-data FILE.jsonl --loss-mask` evaluates it before any update, against LOSS within 1e-5 relative.
Prints what it compared; exits 1 on a difference, 77 (skipped) when transformers or torch do not import.
"""
import json
import struct
import sys


def hf_tokenizer(tokdir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tokdir)


def stream(tok, path, masked):
    """ids and (masked) the assistant mask of FILE.jsonl, EOS after each document."""
    ids, mask = [], []
    for line in open(path, encoding="utf-8"):
        if not line.strip():
            continue
        doc = json.loads(line)
        if "messages" in doc:
            out = tok.apply_chat_template(doc["messages"], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=masked)
            ids += list(out["input_ids"])
            mask += list(out["assistant_masks"]) if masked else [1] * len(out["input_ids"])
        else:
            t = tok(doc["text"])["input_ids"]
            ids += t
            mask += [1] * len(t)
        ids.append(tok.eos_token_id)
        mask.append(0)
    return ids, mask


def read_st(path):
    import torch
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        lo, hi = v["data_offsets"]
        vals = struct.unpack("<%df" % ((hi - lo) // 4), b[8 + n + lo:8 + n + hi])
        out[k] = torch.tensor(vals, dtype=torch.float32).reshape(v["shape"])
    return out


def grads(model_dir, tokdir, path, seq, gb, grad_out):
    import torch
    from transformers import AutoModelForCausalLM
    tok = hf_tokenizer(tokdir)
    ids, mask = stream(tok, path, True)
    x = torch.tensor([ids[w * seq:w * seq + seq + 1] for w in range(gb)])
    m = torch.tensor([mask[w * seq:w * seq + seq + 1] for w in range(gb)])
    labels = torch.where(m.bool(), x, torch.full_like(x, -100))
    n_items = int((labels[:, 1:] != -100).sum())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    loss = model(input_ids=x, labels=labels, num_items_in_batch=torch.tensor(n_items)).loss
    loss.backward()
    got = read_st(grad_out)
    bad = 0
    hl = got["loss"][0].item()
    print("torch: %d targets of %d labelled (%d assistant tokens in the stream of %d), loss %.7f; hyperpar %.7f"
          % (n_items, gb * seq, sum(mask), len(ids), loss.item(), hl))
    if abs(hl - loss.item()) > 1e-5 * abs(loss.item()):
        print("FAIL: the loss differs")
        bad += 1
    worst, n = 0.0, 0
    for name, p in model.named_parameters():
        g = got.get("grad." + name)
        if g is None:
            print("FAIL: no grad.%s in %s" % (name, grad_out))
            bad += 1
            continue
        d = (g - p.grad.reshape(g.shape)).abs().max().item()
        tol = 1e-4 * p.grad.abs().max().item() + 1e-7
        worst, n = max(worst, d / tol), n + 1
        if d > tol:
            print("FAIL: %s max|d| %.3g > %.3g" % (name, d, tol))
            bad += 1
    print("torch: %d gradients, worst max|d| / tolerance %.3f" % (n, worst))
    return 1 if bad else 0


def evaluate(model_dir, tokdir, path, seq, want):
    import torch
    from transformers import AutoModelForCausalLM
    ids, mask = stream(hf_tokenizer(tokdir), path, True)
    W = (len(ids) - 1) // seq
    x = torch.tensor([ids[w * seq:w * seq + seq + 1] for w in range(W)])
    m = torch.tensor([mask[w * seq:w * seq + seq + 1] for w in range(W)])
    labels = torch.where(m.bool(), x, torch.full_like(x, -100))
    n_items = int((labels[:, 1:] != -100).sum())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        loss = model(input_ids=x, labels=labels, num_items_in_batch=torch.tensor(n_items)).loss.item()
    print("torch: eval over %d windows, %d targets: %.7f; hyperpar %.7f" % (W, n_items, loss, want))
    return 0 if abs(loss - want) <= 1e-5 * abs(loss) else 1


def main():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print("SKIP: torch/transformers do not import: %s" % e)
        return 77
    if sys.argv[1] == "stream":
        tokdir, path, out = sys.argv[2:5]
        ids, _ = stream(hf_tokenizer(tokdir), path, False)
        open(out, "wb").write(struct.pack("<%dH" % len(ids), *ids))
        print("transformers: %d tokens" % len(ids))
        return 0
    if sys.argv[1] == "eval":
        model_dir, tokdir, path, seq, want = sys.argv[2:7]
        return evaluate(model_dir, tokdir, path, int(seq), float(want))
    model_dir, tokdir, path, seq, gb, grad_out = sys.argv[2:8]
    return grads(model_dir, tokdir, path, int(seq), int(gb), grad_out)


if __name__ == "__main__":
    sys.exit(main())

"""What the torchrun tests of tests/python share (torch_parallel.py, torch_moe_parallel.py, torch_ep.py,
torch_hf_plan.py, torch_runtimes.py), so that each script holds only its cases:

    import hp_torchtest as tt
    tt.need("torch_parallel")          # skip (exit 77, hp_skip.py) unless torch, torch.distributed, transformers import
    import torch ...                   # then the script's own imports
    ...
    def main():
        tt.start()                     # gloo process group, one thread, transformers' warnings off
        return tt.run_cases("torch_parallel", [(label, fn), ...])
    if __name__ == "__main__":
        tt.end(main())

- need(who, *modules): the import check and its skip;
- start(): the process group;
- run_cases(who, cases): the main loop with a verdict all ranks agree on, ending the process group;
- Failure / NotApplicable / check, rank(), say(), allmax(), full(), max_abs_diff(), ce(): small shared pieces;
- tiny_model(config, seed, ...), perturb_vectors(model, seed), redraw(model, seed): the tiny float64 models built
  alike on every rank from tests/data/forward/<family>/config.json.
- st_tensors(path), read_st(path), write_ids(path, ids): safetensors files read and written without the
  safetensors package (also used by generate_check.py and train_variant.py, which run hyperpar, not torchrun).

Importing this module also puts this tree's Python package (ROOT/python) first on sys.path.
"""
import datetime
import importlib
import json
import os
import struct
import sys
import traceback

from hp_skip import end, skip  # noqa: F401  (end: the scripts leave through it)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FORWARD = os.path.join(ROOT, "tests", "data", "forward")
if os.path.join(ROOT, "python") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "python"))


def need(who, *modules):
    """Imports torch, torch.distributed, transformers and modules (names); when one does not import (ImportError,
    or a broken install that fails while importing) the test cannot run here: hp_skip.skip exits 77."""
    for name in ("torch", "torch.distributed", "transformers") + modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure means "cannot run here"
            skip(who, "%s does not import: %s" % (name, e))


def start():
    """The gloo process group torchrun's environment describes (if not made yet), one CPU thread per process,
    transformers' warnings off."""
    import torch
    import torch.distributed as dist
    import transformers
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()


class Failure(Exception):
    """A case's check failed: the message says what (run_cases reports it and goes on with the next case)."""


class NotApplicable(Exception):
    """The case does not apply (e.g. the planner refuses the mesh for this family): reported, counted as neither
    passed nor failed."""


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def rank():
    import torch.distributed as dist
    return dist.get_rank()


def say(msg):
    """Prints msg on rank 0."""
    if rank() == 0:
        print(msg, flush=True)


def allmax(v):
    """The largest v over the ranks."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(v)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _agree(values):
    """The elementwise minimum of values (ints) over the ranks."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.tolist()


def full(t):
    """A DTensor's whole value; any other tensor as it is."""
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def max_abs_diff(a, b):
    """max |a - b| in float64 (0 for empty tensors; NaN where either holds one, which fails every <= bar)."""
    return (a.detach().double() - b.detach().double()).abs().max().item() if a.numel() else 0.0


def ce(logits, ids):
    """transformers' causal LM loss, the mean cross-entropy of every position against the next id, in the logits'
    dtype (transformers itself upcasts to float32, which would hide float64 differences)."""
    import torch.nn.functional as F
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))


def run_cases(who, cases):
    """The main loop: runs every (label, fn) of cases on every rank, in order, and returns the exit code (0 when
    every case passed on every rank, else 1). fn() returns a line to report (or None) when the case passed here;
    raises Failure for a failed check, NotApplicable for a case that does not apply, or any other exception for an
    error (reported with its traceback; the loop then stops, as the ranks may be out of step in their collectives).
    After each case the ranks agree on its verdict (an all-reduce of MIN), so that every rank counts the same
    failures and exits alike; rank 0 prints each outcome, a rank that failed its own message. The process group is
    destroyed at the end."""
    import torch.distributed as dist
    me = rank()
    passed, failed, na = 0, [], 0
    for label, fn in cases:
        ok, go_on, applies, msg = 1, 1, 1, None
        try:
            msg = fn()
        except Failure as e:
            ok, msg = 0, str(e)
        except NotApplicable as e:
            applies, msg = 0, str(e)
        except Exception:  # noqa: BLE001 - report it with the case, then stop
            ok, go_on, msg = 0, 0, "(rank %d)\n%s" % (me, traceback.format_exc())
        all_ok, all_go_on, all_apply = _agree([ok, go_on, applies])
        if not ok:
            print("%s: FAIL %s: %s" % (who, label, msg), flush=True)
        elif not all_ok:
            say("%s: FAIL %s (on another rank)" % (who, label))
        elif not all_apply:
            na += 1
            say("%s: n/a  %s%s" % (who, label, ": " + msg if msg else ""))
        else:
            say("%s: PASS %s%s" % (who, label, ": " + msg if msg else ""))
        if all_ok and all_apply:
            passed += 1
        elif not all_ok:
            failed.append(label)
        if not all_go_on:
            say("%s: stopped after an error in %s" % (who, label))
            break
    dist.barrier()
    dist.destroy_process_group()
    if me == 0:
        print("%s: %d passed, %d failed%s%s" % (who, passed, len(failed), ", %d n/a" % na if na else "",
                                                 "".join("\n  FAIL " + f for f in failed)), flush=True)
    return 1 if failed or passed + na < len(cases) else 0


def tiny_model(config, seed, attn="sdpa", experts=None):
    """A random transformers causal LM of config (an AutoConfig, or the path of a folder or config.json under
    tests/data/forward), in float64, the same on every rank (torch.manual_seed(seed) before it is built). attn is
    transformers' attention implementation: "sdpa" falls back to "eager" for a family without an SDPA path
    (gpt-oss); experts, when given, its experts_implementation ("eager", "batched_mm")."""
    import torch
    import transformers
    cfg = transformers.AutoConfig.from_pretrained(config) if isinstance(config, str) else config
    kw = {} if experts is None else {"experts_implementation": experts}
    torch.manual_seed(seed)
    try:
        m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, **kw)
    except ValueError:
        if attn == "eager":
            raise
        torch.manual_seed(seed)
        m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", **kw)
    return m.to(torch.float64)


def perturb_vectors(model, seed):
    """Adds 0.1 randn (a generator seeded with seed) to every 1-D parameter, so that a bias added twice or a norm
    weight taken from the wrong rank shows (transformers initialises them to 0 and 1). Returns model."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
    return model


def redraw(model, seed):
    """Draws every parameter anew from a generator seeded with seed: norm weights 1 + 0.1 randn, everything else
    0.15 randn, and DeepSeek/GLM's e_score_correction_bias buffers 0.05 randn (the MoE tests' scales: routing
    that is neither uniform nor saturated). Returns model."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or "layernorm" in n:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g, dtype=b.dtype))
    return model


# ---- safetensors files ----

_ST_FORMATS = {"F32": "f", "I32": "i", "I64": "q"}  # the dtypes st_tensors unpacks, as struct formats


def st_tensors(path):
    """The tensors of a safetensors file whose dtype is F32, I32 or I64, by name: (dtype, shape, the flat tuple of
    values); tensors of other dtypes and the __metadata__ are left out."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        fmt = _ST_FORMATS.get(v["dtype"])
        if fmt is None:
            continue
        lo, hi = v["data_offsets"]
        vals = struct.unpack("<%d%s" % ((hi - lo) // struct.calcsize(fmt), fmt), b[8 + n + lo:8 + n + hi])
        out[k] = (v["dtype"], v["shape"], vals)
    return out


def read_st(path):
    """The F32 tensors of a safetensors file, by name, as float32 torch tensors of their shapes."""
    import torch
    return {k: torch.tensor(vals, dtype=torch.float32).reshape(shape)
            for k, (dtype, shape, vals) in st_tensors(path).items() if dtype == "F32"}


def write_ids(path, ids):
    """Writes the int64 tensor ids as a safetensors file holding input_ids alone (hyperpar's --ids input)."""
    raw = struct.pack("<%dq" % ids.numel(), *ids.flatten().tolist())
    head = json.dumps({"input_ids": {"dtype": "I64", "shape": list(ids.shape), "data_offsets": [0, len(raw)]}})
    head = head.encode() + b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + raw)

"""train_check.py — checks `hyperpar train` outputs against a golden train_io.safetensors (no numpy: struct).

usage: python3 train_check.py GOLDEN MODEL_DIR GRAD_OUT OUT_DIR

  every grad.<name> of GRAD_OUT against GOLDEN's grad.<name>: per tensor max|d| <= 1e-4*max|ref| + 1e-7;
  every adamw.<name> of GOLDEN against OUT_DIR/model.safetensors <name> (F32), per entry
  |p - ref| <= 1e-6 + lr*max(|u(g+d)-u(g)|, |u(g-d)-u(g)|), u(x) = x/(|x|+eps), g the golden gradient entry,
  d = 1e-4*max|grad| + 1e-7 (the end-to-end bar of golden/README.md); OUT_DIR/config.json has torch_dtype
  float32; GRAD_OUT's loss is F32 [1] and equals the golden's forward loss within 1e-5 relative.
Prints one line per failure and exits 1 on any.
"""
import json
import struct
import sys


def read_st(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8 : 8 + n])
    meta = h.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for k, v in h.items():
        lo, hi = v["data_offsets"]
        raw = b[base + lo : base + hi]
        if v["dtype"] == "F32":
            vals = struct.unpack("<%df" % (len(raw) // 4), raw)
        elif v["dtype"] == "BF16":
            vals = [struct.unpack("<f", b"\0\0" + raw[i : i + 2])[0] for i in range(0, len(raw), 2)]
        elif v["dtype"] == "I64":
            vals = struct.unpack("<%dq" % (len(raw) // 8), raw)
        else:
            vals = None
        out[k] = (v["dtype"], v["shape"], vals)
    return out, meta


def main():
    golden, model_dir, grad_out, out_dir = sys.argv[1:5]
    gold, meta = read_st(golden)
    hp = json.loads(meta["hparams"])
    lr, eps = hp["lr"], hp["eps"]
    grads, _ = read_st(grad_out)
    params, _ = read_st(out_dir + "/model.safetensors")
    bad = 0
    n_grad = n_param = 0
    for k, (dt, shape, ref) in gold.items():
        if not k.startswith("grad."):
            continue
        name = k[5:]
        if k not in grads:
            print("missing %s in %s" % (k, grad_out)); bad += 1; continue
        gdt, gshape, got = grads[k]
        if gdt != "F32" or gshape != shape:
            print("%s: %s %s, expected F32 %s" % (k, gdt, gshape, shape)); bad += 1; continue
        mref = max(abs(x) for x in ref)
        md = max(abs(a - b) for a, b in zip(got, ref))
        if md > 1e-4 * mref + 1e-7:
            print("%s: max|d| %.3g > 1e-4 * %.3g" % (k, md, mref)); bad += 1
        n_grad += 1
        # the parameter after one step
        ak = "adamw." + name
        if ak not in gold:
            continue
        if name not in params:
            print("missing %s in %s/model.safetensors" % (name, out_dir)); bad += 1; continue
        pdt, pshape, p = params[name]
        _, _, pref = gold[ak]
        if pdt != "F32" or pshape != shape:
            print("%s: %s %s, expected F32 %s" % (name, pdt, pshape, shape)); bad += 1; continue
        d = 1e-4 * mref + 1e-7
        u = lambda x: x / (abs(x) + eps)
        worst = 0
        for i, (a, b, g) in enumerate(zip(p, pref, ref)):
            tol = 1e-6 + lr * max(abs(u(g + d) - u(g)), abs(u(g - d) - u(g)))
            if abs(a - b) > tol:
                worst += 1
                if worst == 1:
                    print("%s[%d]: %.9g vs %.9g (tol %.3g)" % (name, i, a, b, tol))
        if worst:
            print("%s: %d entries outside the AdamW bar" % (name, worst)); bad += 1
        n_param += 1
    if n_grad == 0 or n_param == 0:
        print("nothing compared (%d gradients, %d parameters)" % (n_grad, n_param)); bad += 1
    if set(grads) - set(gold) - {"loss"}:
        print("unexpected tensors in %s: %s" % (grad_out, sorted(set(grads) - set(gold) - {"loss"})[:5])); bad += 1
    if "loss" not in grads or grads["loss"][0] != "F32" or len(grads["loss"][2]) < 1:
        print("no loss F32 [N] in %s" % grad_out); bad += 1
    with open(out_dir + "/config.json") as f:
        cfg = json.load(f)
    with open(model_dir + "/config.json") as f:
        cfg0 = json.load(f)
    if cfg.get("torch_dtype") != "float32":
        print("config.json: torch_dtype %r, expected float32" % cfg.get("torch_dtype")); bad += 1
    cfg.pop("torch_dtype", None); cfg0.pop("torch_dtype", None)
    if cfg != cfg0:
        print("config.json differs from the model's beyond torch_dtype"); bad += 1
    print("%d gradients, %d parameters compared, %d failures" % (n_grad, n_param, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

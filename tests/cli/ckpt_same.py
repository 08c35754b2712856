"""ckpt_same.py A B [FILE...]: exit 0 when the checkpoint files of folders A and B (default: every file of A but
the output marker) are the same except for what names the run that wrote them: a rank file's "run_id" metadata,
state.json's "run_id", the sizes and hashes it records of the rank files (which hold the run id) and the command
line that saved it (a resumed run's differs). Every tensor
byte, every other metadata value and every other state.json field must be equal; on a difference it prints it."""
import json
import os
import struct
import sys


def st_parts(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    head.get("__metadata__", {}).pop("run_id", None)
    return head, raw[8 + n:]


def state(path):
    with open(path) as f:
        s = json.load(f)
    s.pop("run_id", None)
    s.pop("command", None)
    for k in [k for k in s.get("sums", {}) if k.startswith("rank-")]:
        s["sums"].pop(k)
    return s


a, b = sys.argv[1], sys.argv[2]
names = sys.argv[3:] or sorted(n for n in os.listdir(a) if n != ".hyperpar-output")
for name in names:
    pa, pb = os.path.join(a, name), os.path.join(b, name)
    if name.endswith(".safetensors"):
        same = st_parts(pa) == st_parts(pb)
    elif name == "state.json":
        same = state(pa) == state(pb)
    else:
        same = open(pa, "rb").read() == open(pb, "rb").read()
    if not same:
        print("ckpt_same: %s differs between %s and %s" % (name, a, b))
        sys.exit(1)

#!/usr/bin/env python3
"""grad_stats.py GRADS.safetensors REF.json — how far `hyperpar train --grad-out`'s gradients are from a reference's.

REF.json is bench/train_ref.py --grad-stats: step 1's loss and, per parameter, [‖g‖, Σ g_i·u_i] with u_i = ±1 by
the top bit of i·2654435761 mod 2^32. For each parameter the distance is |Σ g·u − ref| / ‖g_ref‖, which is about
‖g − g_ref‖ / ‖g_ref‖ (the signs make the sum of the differences a random walk). Prints "LOSS MEAN MAX": the
gradients' loss entry is not stored, so LOSS is read by the caller; MEAN and MAX are over the parameters.
Plain python3, no numpy.
"""
import json
import math
import struct
import sys

g = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", g[:8])[0]
head = json.loads(g[8:8 + n])
ref = json.load(open(sys.argv[2]))
d = []
for name, (norm, dot) in ref["grads"].items():
    e = head.get("grad." + name)
    if e is None:
        sys.exit(f"grad_stats.py: {sys.argv[1]} has no grad.{name}")
    lo, hi = e["data_offsets"]
    if e["dtype"] != "F32":
        sys.exit(f"grad_stats.py: grad.{name} is {e['dtype']}, not F32")
    v = struct.unpack("<%df" % ((hi - lo) // 4), g[8 + n + lo:8 + n + hi])
    s = 0.0
    for i, x in enumerate(v):
        s += x if ((i * 2654435761) % (1 << 32)) >> 31 else -x
    d.append(abs(s - dot) / norm if norm > 0 else abs(s))
print("%.3e %.3e" % (sum(d) / len(d), max(d)))

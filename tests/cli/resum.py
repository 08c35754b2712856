"""resum.py DIR: rewrites DIR/state.json's record ("sums") of every file it lists: the size and XXH64 (seed 0) of
the bytes now there, as `hyperpar train` would have written them. Tests use it to tamper with a checkpoint's
tensors past the hash check, to reach the checks behind it (the values a resume loads). XXH64 in plain Python
(the reference algorithm, Yann Collet's xxHash), checked against its published empty-input value."""
import json
import os
import struct
import sys

M = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                      0x27D4EB2F165667C5)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def rnd(acc, v):
    return (rotl((acc + v * P2) & M, 31) * P1) & M


def merge(acc, v):
    return ((acc ^ rnd(0, v)) * P1 + P4) & M


def xxh64(data, seed=0):
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        lanes = struct.unpack_from("<%dQ" % (n // 32 * 4), data)
        for k in range(0, len(lanes), 4):
            v = [rnd(v[j], lanes[k + j]) for j in range(4)]
        i = n // 32 * 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v:
            h = merge(h, x)
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (struct.unpack_from("<I", data, i)[0] * P1 & M), 23) * P2 + P3) & M
        i += 4
    while i < n:
        h = (rotl(h ^ (data[i] * P5 & M), 11) * P1) & M
        i += 1
    h ^= h >> 33
    h = h * P2 & M
    h ^= h >> 29
    h = h * P3 & M
    return h ^ (h >> 32)


assert xxh64(b"") == 0xEF46DB3751D8E999
d = sys.argv[1]
s = json.load(open(os.path.join(d, "state.json")))
for name in s["files"]:
    raw = open(os.path.join(d, name), "rb").read()
    s["sums"][name] = {"bytes": len(raw), "xxh64": "%016x" % xxh64(raw)}
json.dump(s, open(os.path.join(d, "state.json"), "w"), indent=2)

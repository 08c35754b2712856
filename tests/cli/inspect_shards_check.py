# Checks `hyperpar inspect SHARDS --json` (argv[1]) against the folder (argv[2]) independently: every rank's tensor
# names, dtypes and local shapes against its rank file's own safetensors header, global shapes against the
# manifest's tensor list, slices, experts, coordinates and file_rank against the manifest's rank entry, and each
# local shape against the slices (the length of a cut dim, the global length of a whole one).
import json, struct, sys

out, folder = json.load(open(sys.argv[1])), sys.argv[2]
man = json.load(open(folder + "/manifest.json"))
globals_ = {t["name"]: t["shape"] for t in man["tensors"]}
bad = []
def fail(msg):
    bad.append(msg)
def header(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    # safetensors keeps no order in JSON; the data offsets give the file's order
    return meta, sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0])
if out["world"] != man["mesh"]["world"]:
    fail("world %s != manifest %s" % (out["world"], man["mesh"]["world"]))
for r in out["ranks"]:
    mr = man["ranks"][r["rank"]]
    coords = ",".join("%s=%d" % (k, v) for k, v in mr["coords"].items())
    if r["coords"] != coords: fail("rank %d: coords %s != manifest %s" % (r["rank"], r["coords"], coords))
    if r["file_rank"] != mr["file_rank"]: fail("rank %d: file_rank" % r["rank"])
    if r["file"] != mr["file"]: fail("rank %d: file" % r["rank"])
    meta, tensors = header(folder + "/" + r["file"])
    names = [t["name"] for t in r["tensors"]]
    if sorted(names) != sorted(n for n, _ in tensors):
        fail("rank %d: tensor names differ from its file's" % r["rank"])
    hdr = dict(tensors)
    if len(r["tensors"]) != len(mr["tensors"]): fail("rank %d: tensor count vs manifest" % r["rank"])
    for t, mt in zip(r["tensors"], mr["tensors"]):
        h = hdr.get(t["name"])
        if not h: continue
        if t["shape"] != h["shape"] or t["dtype"] != h["dtype"]:
            fail("rank %d: %s %s %s, the file says %s %s" % (r["rank"], t["name"], t["dtype"], t["shape"], h["dtype"], h["shape"]))
        if t["name"] != mt["name"] or t["global_shape"] != mt["global_shape"] or t["slices"] != mt["slices"]:
            fail("rank %d: %s differs from the manifest" % (r["rank"], t["name"]))
        if "experts" in mt and t.get("experts") != mt["experts"]:
            fail("rank %d: %s experts %s vs manifest %s" % (r["rank"], t["name"], t.get("experts"), mt["experts"]))
        g = mt.get("global")
        if isinstance(g, list):  # a stack of per-expert tensors: [n, per-expert shape...], its members named
            if t["global_shape"] != [len(g)] + globals_.get(g[0], []) or t.get("globals") != g:
                fail("rank %d: stack %s vs the manifest's tensor list" % (r["rank"], t["name"]))
        elif t["global_shape"] != globals_.get(g):
            fail("rank %d: %s global shape vs the manifest's tensor list" % (r["rank"], t["name"]))
        want = list(t["global_shape"])
        for s in t["slices"]: want[s["dim"]] = 0
        for s in t["slices"]: want[s["dim"]] += s["length"]
        if t["shape"] != want: fail("rank %d: %s local %s, slices give %s" % (r["rank"], t["name"], t["shape"], want))
for m in bad[:20]: print("FAIL:", m)
print("%d ranks, %d tensors checked" % (len(out["ranks"]), sum(len(r["tensors"]) for r in out["ranks"])))
sys.exit(1 if bad else 0)

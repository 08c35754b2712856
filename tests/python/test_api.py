"""The Python package against the CLI (no torch needed): hp.plan / hp.cost / hp.advise / hp.inspect give the bytes
`hyperpar ... --format json` prints, for every config in tests/data/configs and a few meshes and settings; bad
requests raise hyperpar.Error with the CLI's message. Run from tests/: python3 python/test_api.py HYPERPAR_BIN."""
import json
import os
import re
import subprocess
import sys

import hyperpar as hp
from hyperpar import _native

BIN = sys.argv[1]
CONFIGS = sorted(os.path.join("data/configs", f) for f in os.listdir("data/configs") if f.endswith(".json"))
failures = []


def cli(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def check(what, ok, detail=""):
    print("%s %s%s" % ("ok  " if ok else "FAIL", what, (": " + detail) if detail and not ok else ""))
    if not ok:
        failures.append(what)


def cli_message(stderr):
    """The CLI's message without its 'hyperpar: error: [cmd: ]' prefix and the usage hint."""
    first = stderr.strip().split("\nRun 'hyperpar")[0]
    first = re.sub(r"^hyperpar: error: ", "", first)
    return re.sub(r"^(plan|cost|advise|inspect): ", "", first)


def refuses_alike(what, fn, args):
    rc, _, err = cli(*args)
    try:
        fn()
    except hp.Error as e:
        check(what, rc == 2 and e.code == 2 and str(e) == cli_message(err), "CLI %d %r vs %r" % (rc, err, str(e)))
        return
    check(what, False, "no error raised (CLI rc %d)" % rc)


def mesh_args(mesh):
    out = []
    for k, v in mesh.items():
        out += ["--" + k, str(v)]
    return out


for cfg in CONFIGS:
    name = os.path.basename(cfg)
    moe = hp.inspect(cfg)["experts"] > 0
    # inspect
    rc, out, _ = cli("inspect", cfg, "--json")
    check("inspect %s" % name, rc == 0 and _native.call({"command": "inspect", "model": {"path": cfg}}) == out)
    meshes = [{}, {"tp": 2}, {"dp": 2, "tp": 4}]
    if moe:
        meshes += [{"tp": 2, "ep": 2}, {"dp": 2, "ep": 4}]
    for mesh in meshes:
        rc, out, err = cli("plan", cfg, *mesh_args(mesh))
        try:
            p = hp.plan(cfg, mesh=mesh)
            check("plan %s %s" % (name, mesh), rc == 0 and p.json == out)
        except hp.Error as e:
            check("plan %s %s refused alike" % (name, mesh), rc == 2 and str(e) == cli_message(err), str(e))
            continue
        for settings, flags in [({}, []), ({"mode": "train", "seq": 2048}, ["--mode", "train", "--seq", "2048"]),
                                ({"mode": "decode", "batch": 8, "context": 4096, "hardware": "H100"},
                                 ["--mode", "decode", "--batch", "8", "--context", "4096", "--hardware", "H100"])]:
            rc, out, err = cli("cost", cfg, *mesh_args(mesh), *flags, "--format", "json")
            text = _native.call(hp._cost_request(cfg, mesh, **settings))
            check("cost %s %s %s" % (name, mesh, settings), rc == 0 and text == out)
    # advise: the same bytes but the search's own wall time
    rc, out, err = cli("advise", cfg, "--world", "8", "--hardware", "H100", "--seq", "4096", "--format", "json")
    try:
        text = _native.call(hp._advise_request(cfg, 8, hardware="H100", seq=4096))
    except hp.Error as e:
        text = json.dumps(e.report) if isinstance(e.report, dict) else None
        check("advise %s refused alike" % name, rc == 2 and str(e) == cli_message(err), str(e))
        continue
    strip = lambda s: re.sub(r'"seconds": [0-9.e+-]+', '"seconds": 0', s)
    check("advise %s" % name, rc == 0 and strip(text) == strip(out))

# advise's max_pp: the same bytes as --max-pp, every candidate within it
l8 = "data/configs/llama-3-8b.json"
for mp in (1, 2):
    rc, out, err = cli("advise", l8, "--world", "8", "--hardware", "H100", "--mode", "train", "--seq", "4096",
                       "--max-pp", str(mp), "--format", "json")
    text = _native.call(hp._advise_request(l8, 8, max_pp=mp, hardware="H100", mode="train", seq=4096))
    strip = lambda s: re.sub(r'"seconds": [0-9.e+-]+', '"seconds": 0', s)
    d = json.loads(text)
    check("advise max_pp=%d = --max-pp %d" % (mp, mp), rc == 0 and strip(text) == strip(out))
    check("advise max_pp=%d: no candidate has more stages" % mp,
          all(c["pp"] <= mp for c in d["candidates"]) and any(c["pp"] == mp for c in d["candidates"]))
refuses_alike("advise max_pp 0", lambda: hp.advise(l8, 8, max_pp=0, hardware="H100"),
              ["advise", l8, "--world", "8", "--hardware", "H100", "--max-pp", "0"])

# every plan option against its flag
q3 = "data/configs/qwen3-30b-a3b.json"
ov = "data/overrides/mlp_replicated.yaml"
for kw, args in [(dict(mesh={"tp": 2}, sequence_parallel=False), ["--tp", "2", "--no-sequence-parallel"]),
                 (dict(mesh={"tp": 2}, loss_parallel=True), ["--tp", "2", "--loss-parallel"]),
                 (dict(mesh="dp=1,tp=2,ep=2", ep_axis=True), ["--mesh", "dp=1,tp=2,ep=2", "--ep-axis"]),
                 (dict(mesh={"tp": 2, "ep": 2}, ep_compute="suggested"), ["--tp", "2", "--ep", "2", "--ep-compute", "suggested"]),
                 (dict(mesh={"tp": 2}, freeze="model.embed_tokens.*"), ["--tp", "2", "--freeze", "model.embed_tokens.*"]),
                 (dict(mesh={"tp": 2}, packed_fused=True), ["--tp", "2", "--packed-fused"])]:
    check("plan option %s" % " ".join(args), hp.plan(q3, **kw).json == cli("plan", q3, *args)[1])
check("plan --overrides FILE", hp.plan("data/forward/llama", mesh={"tp": 2}, overrides=ov).json ==
      cli("plan", "data/forward/llama", "--tp", "2", "--overrides", ov)[1])
check("overrides as YAML text", hp.plan("data/forward/llama", mesh={"tp": 2}, overrides=open(ov).read()).data["boundaries"]
      == hp.plan("data/forward/llama", mesh={"tp": 2}, overrides=ov).data["boundaries"])

llama = "data/configs/llama-3-8b.json"
refuses_alike("tp=3 on 32 heads", lambda: hp.plan(llama, mesh={"tp": 3}), ["plan", llama, "--tp", "3"])
refuses_alike("ep on a dense model", lambda: hp.plan(llama, mesh={"tp": 2, "ep": 2}), ["plan", llama, "--tp", "2", "--ep", "2"])
refuses_alike("ep not dividing the experts", lambda: hp.plan("data/configs/mixtral-8x7b.json", mesh={"ep": 3}),
              ["plan", "data/configs/mixtral-8x7b.json", "--ep", "3"])
refuses_alike("tp 0", lambda: hp.plan(llama, mesh={"tp": 0}), ["plan", llama, "--tp", "0"])
refuses_alike("ep past the largest mesh", lambda: hp.plan(llama, ep=10 ** 9), ["plan", llama, "--ep", str(10 ** 9)])
refuses_alike("a bad --mesh string", lambda: hp.plan(llama, mesh="tp=x"), ["plan", llama, "--mesh", "tp=x"])
refuses_alike("a mesh whose world is too large", lambda: hp.plan(llama, mesh={"dp": 65536, "tp": 65536}),
              ["plan", llama, "--dp", "65536", "--tp", "65536"])
refuses_alike("bad mode", lambda: hp.cost(llama, mode="bogus"), ["cost", llama, "--mode", "bogus"])
refuses_alike("bare size", lambda: hp.cost(llama, mem_per_rank="80"), ["cost", llama, "--mem-per-rank", "80"])
refuses_alike("recompute on cpu", lambda: hp.cost(llama, mode="train", recompute="full"),
              ["cost", llama, "--mode", "train", "--recompute", "full"])
refuses_alike("advise without a budget", lambda: hp.advise(llama, 8), ["advise", llama, "--world", "8"])
refuses_alike("a missing model", lambda: hp.plan("data/configs/nope.json"), ["plan", "data/configs/nope.json"])
refuses_alike("a bad overrides file", lambda: hp.plan(llama, mesh={"tp": 2}, overrides="data/configs/README.md"),
              ["plan", llama, "--tp", "2", "--overrides", "data/configs/README.md"])
for bad, what in [({"command": "fly"}, "unknown command"), ({"command": "plan", "model": {"path": 3}}, "bad path"),
                  ({"command": "plan", "model": {"path": llama}, "options": {"mesh": {"xp": 2}}}, "bad axis"),
                  ({"command": "plan", "model": {"path": llama}, "options": {"mesh": {"tp": 0}}}, "tp 0"),
                  ({"command": "cost", "model": {"path": llama}, "cost": {"bogus": 1}}, "unknown setting")]:
    try:
        _native.call(bad)
        check("request refused: " + what, False, "accepted")
    except hp.Error as e:
        check("request refused: " + what, e.code == 2 and len(str(e)) > 10, str(e))
import ctypes
o, e = ctypes.c_void_p(), ctypes.c_void_p()
code = _native.lib().hp_api_call(b"{not json", ctypes.byref(o), ctypes.byref(e))
check("a request that is not JSON: exit 2 and a message", code == 2 and not o.value and e.value and
      b"not a JSON object" in ctypes.string_at(e.value))
_native.lib().hp_api_free(e.value)

# a config dict is read as the file is (the label differs: 'config' for a dict)
cfgd = json.load(open(llama))
p1, p2 = hp.plan(cfgd, mesh={"tp": 2}), hp.plan(llama, mesh={"tp": 2})
check("a config dict plans as its file", p1.data["boundaries"] == p2.data["boundaries"])
pl = p2.placements
check("placements", pl["model.layers.0.self_attn.q_proj.weight"] == {"tp": "S(0)"} and
      pl["model.layers.0.self_attn.o_proj.weight"] == {"tp": "S(1)"}, str(pl.get("model.layers.0.self_attn.q_proj.weight")))
check("explain", "model.layers.0.self_attn" in p2.explain("model.layers.0.self_attn"))

# a live transformers model: its config and its parameters' names and shapes are what the planner reads
try:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError:
    torch = None
    if os.environ.get("HP_REQUIRE_TORCH") == "1":
        check("torch and transformers importable (HP_REQUIRE_TORCH=1)", False)
if torch is not None:
    for fam, mesh in [("llama", {"tp": 2}), ("qwen3", {"tp": 2}), ("gpt_oss", {"tp": 2}),
                      ("qwen3_moe", {"tp": 2, "ep": 2}), ("mixtral", {"dp": 2, "ep": 2}),
                      ("deepseek_v3", {"tp": 2, "ep": 2})]:
        folder = "data/forward/" + fam
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
        live = hp.plan(model, mesh=mesh)
        ref = hp.plan(folder, mesh=mesh)
        names = dict(model.named_parameters())
        pl = live.placements
        # every parameter the live plan places is the module's own, with the module's shape
        check("live %s %s: placements name the module's parameters" % (fam, mesh),
              set(pl) <= set(names) and len(pl) > 0, str(sorted(set(pl) - set(names))[:3]))
        dense = [k for k in pl if ".experts." not in k]
        # transformers 5 names Mixtral's block `mlp` where its checkpoints say `block_sparse_moe`
        on_disk = {k.replace(".block_sparse_moe.", ".mlp."): v for k, v in ref.placements.items()}
        check("live %s %s: dense placements equal the checkpoint's plan" % (fam, mesh),
              all(pl[k] == on_disk.get(k) for k in dense), str([(k, pl[k], on_disk.get(k)) for k in dense if pl[k] != on_disk.get(k)][:3]))
        check("live %s: inspect counts the module's parameters" % fam,
              hp.inspect(model)["num_params"] == sum(p.numel() for p in model.parameters()))
    # a module that is not what its config says is refused, naming the difference
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained("data/forward/llama"))
    cfg = model.config.to_dict()
    cfg["num_hidden_layers"] = cfg["num_hidden_layers"] + 1
    try:
        _native.call({"command": "plan", "model": dict(hp.model_source(model), config=cfg)})
        check("a module unlike its config is refused", False, "accepted")
    except hp.Error as e:
        check("a module unlike its config is refused", "num_hidden_layers" in str(e), str(e))

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)

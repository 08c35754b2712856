# shard --plan with hand-edited plans (issue 10, item 15): every field the reader accepts must be one the writer
# can produce and agree with the rest of the plan; otherwise exit 2 naming the JSON path, and no output.
source "$(dirname "$0")/lib.sh"
G="$TESTS/data/golden"
M="$G/mixtral_per_expert_f32"
"$HP" plan "$M" --tp 2 -o "$WORK/p.json"
"$HP" plan "$M" --tp 2 --ep 2 -o "$WORK/pe.json"
# bad NAME SED-SCRIPT [FILE]: a copy of the plan edited by sed.
bad() { sed -e "$2" "${3:-$WORK/p.json}" > "$WORK/$1.json"; }
refused() { # refused NAME NEEDLE
    expect 2 "$2" -- "$HP" shard "$M" --plan "$WORK/$1.json" --out "$WORK/out_$1"
    check "$1: no output folder" test ! -e "$WORK/out_$1"
}
expect 0 "sharded into" -- "$HP" shard "$M" --plan "$WORK/p.json" --out "$WORK/ok"
expect 0 "sharded into" -- "$HP" shard "$M" --plan "$WORK/pe.json" --out "$WORK/ok_ep"

bad world 's/"world": 2/"world": 7/'
refused world 'mesh.world: 7, but the product of mesh.dims sizes is 2'
bad axis '0,/"tp": "S(0)"/s//"xx": "S(0)"/'
refused axis "boundaries[0].params.weight: unknown axis 'xx' in a placement map"
bad ep_noep '0,/"tp": "S(0)"/s//"tp": "S(0)", "ep": "S(0)"/'
refused ep_noep "boundaries[0].params.weight: an 'ep' placement, but the plan has no expert parallelism"
bad ep_unmarked '0,/"tp": "S(0)"/s//"tp": "S(0)", "ep": "S(0)"/' "$WORK/pe.json"
refused ep_unmarked "an 'ep' Shard on a boundary whose ep_size is 0"
bad ep_mode 's/"ep_mode": "tp-extend-ep"/"ep_mode": "none"/' "$WORK/pe.json"
refused ep_mode 'mesh.ep_mode: "none" with ep 2 and no ep axis'
bad mdn '/"mesh_dim_names"/,/]/s/"tp"/"cp"/'
refused mdn "mesh_dim_names: [cp], but the mesh's tp/cp/ep axes of size > 1, in mesh order, are [tp]"
bad dim 's/"S(1)"/"S(4)"/'
refused dim "placement S(4) is out of range for a 2-dim tensor"

# What finalisation derives (TP-local head counts, tp_divide_attrs, deferred biases, terminal) must be exactly
# what hyperpar plan writes for this model and mesh; shard and cost refuse anything else, naming the JSON path.
edit() { # edit NAME PYTHON [FILE]: a copy of the plan edited by a Python statement on q (the parsed plan)
    python3 - "${3:-$WORK/p.json}" "$WORK/$1.json" "$2" <<'PY'
import json, sys
q = json.load(open(sys.argv[1]))
attn = [b for b in q["boundaries"] if b.get("tp_local_attrs")]
exec(sys.argv[3])
json.dump(q, open(sys.argv[2], "w"))
PY
}
refused_cost() { # refused_cost NAME NEEDLE: cost --plan refuses what shard refuses
    refused "$1" "$2"
    expect 2 "$2" -- "$HP" cost "$M" --plan "$WORK/$1.json"
}
HEADS='tp_local_attrs.num_attention_heads: {global 4, local'
edit neg 'attn[0]["tp_local_attrs"]["num_attention_heads"]["local"] = -2'
refused_cost neg "boundaries[1].$HEADS -2}, but hyperpar plan writes {global 4, local 2} for this model at tp=2"
edit zero 'attn[1]["tp_local_attrs"]["num_attention_heads"]["local"] = 0'
refused_cost zero "$HEADS 0}, but hyperpar plan writes {global 4, local 2}"
edit global 'attn[0]["tp_local_attrs"]["num_attention_heads"]["global"] = 1000'
refused_cost global "num_attention_heads: {global 1000, local 2}, but hyperpar plan writes {global 4, local 2}"
edit kv 'attn[0]["tp_local_attrs"]["num_key_value_heads"] = {"global": 2, "local": 2, "source": "auto"}'
refused_cost kv "num_key_value_heads: {global 2, local 2}, but hyperpar plan writes {global 2, local 1}"
edit missing 'del attn[0]["tp_local_attrs"]["num_key_value_heads"]'
refused_cost missing "tp_local_attrs: 'num_key_value_heads' is missing; hyperpar plan writes {global 2, local 1}"
edit extra 'q["boundaries"][0]["tp_local_attrs"] = {"num_attention_heads": {"global": 4, "local": 2, "source": "auto"}}'
refused_cost extra "boundaries[0].tp_local_attrs.num_attention_heads: {global 4, local 2}, but hyperpar plan writes no"
edit user 'attn[0]["tp_local_attrs"]["vocab_size"] = {"global": 128, "local": 7, "source": "user"}'
refused_cost user "tp_local_attrs.vocab_size: {global 128, local 7}, but hyperpar plan writes {global 128, local 64}"
edit user_auto 'attn[0]["tp_local_attrs"]["num_attention_heads"]["source"] = "user"'
refused_cost user_auto "names 'num_attention_heads', which the planner already divides"
edit source 'attn[0]["tp_local_attrs"]["num_attention_heads"]["source"] = "guess"'
refused_cost source 'expected {"global": N, "local": N, "source": "auto" or "user"}'
edit deferred 'attn[0]["deferred_biases"] = ["o_proj.bias"]'
refused_cost deferred "deferred_biases: 'o_proj.bias' is not a bias hyperpar plan defers here"
edit terminal 'q["boundaries"][0]["terminal"] = True'
refused_cost terminal "boundaries[0].terminal: true, but a later boundary has is_boundary true"
# Leaving the derived keys out is allowed: they take what hyperpar plan derives, so the layout is the same.
edit omitted 'for b in q["boundaries"]: b.pop("tp_local_attrs", None); b.pop("deferred_biases", None); b.pop("terminal", None)'
expect 0 "sharded into" -- "$HP" shard "$M" --plan "$WORK/omitted.json" --out "$WORK/ok_omitted"
check "omitted keys: the same rank files" cmp "$WORK/ok/rank-00001.safetensors" "$WORK/ok_omitted/rank-00001.safetensors"

# Small hand-written plans for lm_head.
plan() { # plan NAME BOUNDARIES-JSON
    printf '{"format": "hyperpar-plan", "version": 1, "mesh": {"dims": [{"name": "tp", "size": 2}], "world": 2, "ep": 1, "ep_mode": "none"}, "mesh_dim_names": ["tp"], "boundaries": [%s]}\n' "$2" > "$WORK/$1.json"
}
LM='{"fqn": "lm_head", "type": "lm_head", "params": {"weight": {"tp": "S(0)"}}}'
plan ok_small "$LM"
expect 0 "sharded into" -- "$HP" shard "$M" --plan "$WORK/ok_small.json" --out "$WORK/ok_small_out"
plan empty ""
refused empty "boundaries: empty; a plan without boundaries shards nothing"
plan dup "$LM, $LM"
refused dup "boundaries[1]: fqn 'lm_head' is also the fqn of boundaries[0]"
plan twice "$LM, {\"fqn\": \"\", \"params\": {\"lm_head.weight\": {\"tp\": \"R\"}}}"
refused twice "parameter 'lm_head.weight' is declared by this boundary ('') and by boundaries[0] ('lm_head')"
plan noparams '{"fqn": "lm_head", "params": {}}'
refused noparams "no boundary declares a parameter"
plan type '{"fqn": "lm_head", "type": "head", "params": {"weight": {"tp": "S(0)"}}}'
refused type "boundaries[0].type: not a boundary type"
finish

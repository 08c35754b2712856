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

# A config.json whose layer layout contradicts the weights beside it (issue 20, item 11), checkpoints and shard
# folders without config.json (item 15), and shard folders whose manifest or config.json were tampered with
# (item 16): every command refuses with exit 2 and the true diagnosis, once.
source "$(dirname "$0")/lib.sh"
IN="$TESTS/data/forward/llama/forward_io.safetensors" # token ids below 128: every generated model's vocabulary
# variant NAME FAMILY PYTHON: a generated checkpoint whose config.json is edited by a Python statement on c.
variant() {
    "$HP" gen --family "$2" --layers 3 --out "$WORK/$1" > /dev/null 2>&1 || { echo "FAIL: gen $2"; FAILED=$((FAILED + 1)); }
    python3 - "$WORK/$1/config.json" "$3" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
}
# every_command NAME NEEDLE: inspect, plan, shard, cost and run all refuse the model with NEEDLE.
every_command() {
    local d="$WORK/$1" why="does not describe the weights beside it"
    expect 2 "$why" -- "$HP" inspect "$d"
    expect 2 "$2" -- "$HP" inspect "$d"
    expect 2 "$why" -- "$HP" plan "$d" --tp 1
    expect 2 "$why" -- "$HP" shard "$d" --tp 1 --out "$WORK/out_$1"
    check "$1: no output folder" test ! -e "$WORK/out_$1"
    expect 2 "$why" -- "$HP" cost "$d" --tp 1
    expect 2 "$why" -- "$HP" run "$d" --input "$IN"
}
variant step qwen3_moe 'c["decoder_sparse_step"] = 2'
every_command step "layer 0 is dense by config.json (decoder_sparse_step 2) but the weights hold experts for it"
variant mlp_only qwen3_moe 'c["mlp_only_layers"] = [1]'
every_command mlp_only "layer 1 is dense by config.json (decoder_sparse_step 1, mlp_only_layers [1])"
variant first_k deepseek_v3 'c["first_k_dense_replace"] = 5'
every_command first_k "layer 1 is dense by config.json (first_k_dense_replace 5)"
variant first_k0 glm4_moe 'c["first_k_dense_replace"] = 0'
every_command first_k0 "layer 0 is sparse by config.json (first_k_dense_replace 0) but the weights hold no experts"
variant bias llama 'c["attention_bias"] = True'
every_command bias "attention_bias is true, but the weights hold no '*.self_attn.q_proj.bias' tensor"
variant bias_mla deepseek_v3 'c["attention_bias"] = True'
every_command bias_mla "attention_bias is true, but the weights hold no '*.self_attn.q_a_proj.bias' tensor"
variant qkv qwen2_moe 'c["qkv_bias"] = False'
every_command qkv "the weights hold 'model.layers.0.self_attn.q_proj.bias', but qkv_bias is false"
variant tied mixtral 'c["tie_word_embeddings"] = True'
every_command tied "tie_word_embeddings is true (lm_head shares model.embed_tokens.weight) but the weights hold a separate lm_head.weight"
variant tied2 qwen2 'c["tie_word_embeddings"] = True'
every_command tied2 "but the weights hold a separate lm_head.weight"
# The unedited generated models pass (qwen2's q/k/v biases need no flag).
for fam in llama qwen2 qwen3_moe deepseek_v3 mixtral; do
    variant ok_$fam $fam 'pass'
    expect 0 "" -- "$HP" inspect "$WORK/ok_$fam"
done

# Item 15: no config.json.
mkdir -p "$WORK/nocfg" && cp "$WORK/ok_llama/model.safetensors" "$WORK/nocfg/"
expect 2 "nocfg: config.json is missing; the runtime needs the model's hyperparameters" -- "$HP" run "$WORK/nocfg" --input "$IN"
# cost still gives the weights of a model run refuses, and says why run refuses it.
expect 0 "nocfg: config.json is missing; the runtime needs" -- "$HP" cost "$WORK/nocfg" --tp 1
"$HP" shard "$WORK/ok_llama" --tp 1 --out "$WORK/s" > /dev/null 2>&1
expect 0 "loss" -- "$HP" run "$WORK/s" --input "$IN"
cp -r "$WORK/s" "$WORK/s_nocfg" && rm "$WORK/s_nocfg/config.json"
expect 2 "s_nocfg: config.json is missing from this shard folder" -- "$HP" run "$WORK/s_nocfg" --input "$IN"
check "a dense shard folder is not told about MoE layers" \
    bash -c "! '$HP' run '$WORK/s_nocfg' --input '$IN' 2>&1 | grep -q 'MoE'"

# Item 16: a FIFO manifest, an edited config.json, a zeroed or edited manifest identity.
cp -r "$WORK/s" "$WORK/s_fifo" && rm "$WORK/s_fifo/manifest.json" && mkfifo "$WORK/s_fifo/manifest.json"
expect 2 "manifest.json: cannot open: the path is a FIFO" -- timeout 20 "$HP" run "$WORK/s_fifo" --input "$IN"
expect 2 "is a FIFO" -- timeout 20 "$HP" merge "$WORK/s_fifo" --out "$WORK/m_fifo"
for edit in 'c["rms_norm_eps"] = 0.001' 'c["num_attention_heads"] = 8; c["num_key_value_heads"] = 8; c["head_dim"] = 8'; do
    rm -rf "$WORK/s_cfg" && cp -r "$WORK/s" "$WORK/s_cfg"
    python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); $edit; json.dump(c, open(p,'w'))" "$WORK/s_cfg/config.json"
    expect 2 "s_cfg/config.json was changed after sharding (it no longer matches the config.json the folder was written with" \
        -- "$HP" run "$WORK/s_cfg" --input "$IN"
done
ID=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['identity'])" "$WORK/s/manifest.json")
for bad in 00000000000000000000000000000000 0123456789abcdef0123456789abcdef; do
    rm -rf "$WORK/s_id" && cp -r "$WORK/s" "$WORK/s_id"
    sed -i "s/$ID/$bad/" "$WORK/s_id/manifest.json"
    how=$([ $bad = 00000000000000000000000000000000 ] && echo zeroed || echo edited)
    expect 2 "s_id/manifest.json's identity is $bad ($how), but the rank files it lists carry $ID" \
        -- "$HP" run "$WORK/s_id" --input "$IN"
    expect 2 "the manifest was edited after 'hyperpar shard' wrote it" -- "$HP" merge "$WORK/s_id" --out "$WORK/m_id"
done
# With several rank files, the manifest is blamed once, not every rank file.
"$HP" shard "$WORK/ok_llama" --tp 2 --out "$WORK/s2" > /dev/null 2>&1
sed -i "s/$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['identity'])" "$WORK/s2/manifest.json")/00000000000000000000000000000000/" "$WORK/s2/manifest.json"
check "merge names the manifest once" \
    bash -c "[ \"\$('$HP' merge '$WORK/s2' --out '$WORK/m2' 2>&1 | grep -c 'identity is')\" = 1 ]"
check "and blames no rank file" bash -c "! '$HP' merge '$WORK/s2' --out '$WORK/m2' 2>&1 | grep -q 'belongs to another shard folder'"
finish

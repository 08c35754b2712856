# inspect: the eight real configs (meta mode), golden checkpoints, JSON keys, corrupt inputs.
source "$(dirname "$0")/lib.sh"
D="$TESTS/data"
while read -r file total; do
    for layout in per-expert batched; do
        expect 0 "\"num_params\": $total," -- "$HP" inspect "$D/configs/$file" --json --expert-layout "$layout"
    done
done <<'LIST'
mixtral-8x7b.json 46702792704
qwen1.5-moe-a2.7b.json 14315784192
qwen3-30b-a3b.json 30532122624
deepseek-v3.json 671026419200
glm-4.5-air.json 106852251264
llama-3-8b.json 8030261248
qwen2.5-7b.json 7615616512
gpt-oss-20b.json 20914757184
LIST

# Golden checkpoints: tensor counts and a few exact lines of --tensors.
while read -r dir count; do
    expect 0 "\"num_tensors\": $count," -- "$HP" inspect "$D/golden/$dir" --json
    n=$("$HP" inspect "$D/golden/$dir" --tensors | grep -c '^model\.\|^lm_head')
    check "$dir lists $count tensors (got $n)" test "$n" -eq "$count"
done <<'LIST'
deepseek_v3_per_expert_f32 139
glm4_moe_batched_bf16 31
gpt_oss_batched_f32 20
mixtral_batched_bf16 21
mixtral_per_expert_f32 65
qwen2_moe_per_expert_f32 79
qwen3_moe_batched_bf16 25
LIST
expect 0 "model.layers.1.mlp.experts.gate_up_proj BF16 [16, 96, 64]" -- "$HP" inspect "$D/golden/qwen3_moe_batched_bf16" --tensors
expect 0 "model.layers.1.mlp.gate.e_score_correction_bias F32 [8]" -- "$HP" inspect "$D/golden/glm4_moe_batched_bf16" --tensors
expect 0 "model.layers.0.mlp.experts.gate_up_proj F32 [8, 64, 96]" -- "$HP" inspect "$D/golden/gpt_oss_batched_f32" --tensors
expect 0 "model.layers.1.block_sparse_moe.experts.7.w2.weight F32 [64, 96]" -- "$HP" inspect "$D/golden/mixtral_per_expert_f32" --tensors
expect 0 "\"BF16\": " -- "$HP" inspect "$D/golden/glm4_moe_batched_bf16" --json
expect 0 "\"total_bytes\": " -- "$HP" inspect "$D/golden/glm4_moe_batched_bf16/model.safetensors" --json
expect 0 "shared_expert_gate.weight" -- "$HP" inspect "$D/golden/qwen2_moe_per_expert_f32" --tree
expect 0 "experts       16 routed, top-4" -- "$HP" inspect "$D/golden/qwen3_moe_batched_bf16"

# Bad input: exit 2 with a message naming the problem.
expect 2 "--depth limits the --tree listing; add --tree" -- "$HP" inspect "$D/golden/mixtral_batched_bf16" --depth 2
expect 2 "no such file or folder" -- "$HP" inspect "$WORK/nothing"
printf 'PK\003\004 this is a zip' > "$WORK/zip.safetensors"
expect 2 "zip" -- "$HP" inspect "$WORK/zip.safetensors"
printf '\200\002ctorch' > "$WORK/pickle.safetensors"
expect 2 "pickle" -- "$HP" inspect "$WORK/pickle.safetensors"
head -c 100 "$D/golden/qwen3_moe_batched_bf16/model.safetensors" > "$WORK/trunc.safetensors"
expect 2 "trunc.safetensors" -- "$HP" inspect "$WORK/trunc.safetensors"
printf '{\n  "model_type": "llama",\n  "hidden_size": [64]\n}\n' > "$WORK/config.json"
expect 2 "config.json:3:18: field \"hidden_size\" must be a non-negative integer no larger than 2^40, found an array" -- "$HP" inspect "$WORK/config.json"
printf '{"model_type": "gpt2", "n_embd": 64}' > "$WORK/gpt2.json"
expect 2 "known families: llama" -- "$HP" inspect "$WORK/gpt2.json"
mkdir "$WORK/empty"
expect 2 "neither *.safetensors files nor a config.json" -- "$HP" inspect "$WORK/empty"
# A real checkpoint with a broken config.json beside it is refused too.
mkdir "$WORK/ck" && cp "$D/golden/mixtral_batched_bf16/model.safetensors" "$WORK/ck/" && printf '{"model_type": 3}' > "$WORK/ck/config.json"
expect 2 "\"model_type\" must be a string" -- "$HP" inspect "$WORK/ck"

# Tensor names are shown, never obeyed: control characters, DEL, C1 controls and bidi overrides are escaped
# in every text output (--tensors, --tree); JSON output is escaped by jansson.
mkdir "$WORK/esc"
python3 - "$WORK/esc/esc.safetensors" <<'PY'
import json, struct, sys
names = ["model.\x1b[31mred\x1b[0m.weight", "bell\x07\x7f", "back\\slash", "bidi\u202eevil", "c1\u009b2J", "ok.\u00e9"]
hdr = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
h = json.dumps(hdr).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"\0" * 4 * len(names))
PY
"$HP" inspect "$WORK/esc/esc.safetensors" --tensors --tree > "$WORK/esc.txt" 2>&1
check "inspect prints no raw control byte" test "$(LC_ALL=C tr -d '\n\t -~\200-\377' < "$WORK/esc.txt" | wc -c)" -eq 0
check "inspect shows no raw C1 or bidi control" test "$(grep -c $'\xc2\x9b\|\xe2\x80\xae' "$WORK/esc.txt")" -eq 0
expect 0 'model.\x1B[31mred\x1B[0m.weight F32 [1]' -- "$HP" inspect "$WORK/esc/esc.safetensors" --tensors
expect 0 'bell\x07\x7F F32 [1]' -- "$HP" inspect "$WORK/esc/esc.safetensors" --tensors
expect 0 'back\\slash F32 [1]' -- "$HP" inspect "$WORK/esc/esc.safetensors" --tensors
expect 0 'bidi\xE2\x80\xAEevil' -- "$HP" inspect "$WORK/esc/esc.safetensors" --tensors
expect 0 'c1\xC2\x9B2J' -- "$HP" inspect "$WORK/esc/esc.safetensors" --tree
expect 0 'ok.é F32 [1]' -- "$HP" inspect "$WORK/esc/esc.safetensors" --tensors
expect 0 '"name": "model.\u001B[31mred\u001B[0m.weight"' -- "$HP" inspect "$WORK/esc/esc.safetensors" --json --tensors

# A folder holding model.safetensors and an index reads model.safetensors (as transformers does) and says so.
G="$D/golden/qwen3_moe_batched_bf16"
mkdir "$WORK/both" && cp "$G/model.safetensors" "$G/config.json" "$WORK/both/"
printf '{"weight_map": {"x": "other.safetensors"}}' > "$WORK/both/model.safetensors.index.json"
expect 0 "model.safetensors.index.json ignored, as transformers does" -- "$HP" inspect "$WORK/both"
expect 0 "using model.safetensors as transformers does" -- "$HP" inspect "$WORK/both"
expect 0 "weights       model.safetensors (1 file)" -- "$HP" inspect "$G"
expect 0 '"weights_ignored": ' -- "$HP" inspect "$WORK/both" --json

# Paths that are not files are named for what they are, and a FIFO never hangs.
mkfifo "$WORK/pipe.json" "$WORK/pipe.safetensors"
expect 2 "is a FIFO (named pipe)" -- timeout 10 "$HP" inspect "$WORK/pipe.json"
expect 2 "is a FIFO (named pipe)" -- timeout 10 "$HP" inspect "$WORK/pipe.safetensors"
mkdir "$WORK/fifo_ck" && mkfifo "$WORK/fifo_ck/model.safetensors"
expect 2 "model.safetensors: cannot open: the path is a FIFO" -- timeout 10 "$HP" inspect "$WORK/fifo_ck"
mkdir "$WORK/fifo_cfg" && cp "$G/model.safetensors" "$WORK/fifo_cfg/" && mkfifo "$WORK/fifo_cfg/config.json"
expect 2 "config.json: cannot open: the path is a FIFO" -- timeout 10 "$HP" inspect "$WORK/fifo_cfg"
ln -s "$WORK/loop_b" "$WORK/loop_a" && ln -s "$WORK/loop_a" "$WORK/loop_b"
expect 2 "is a symbolic-link loop" -- "$HP" inspect "$WORK/loop_a"
ln -s "$WORK/gone" "$WORK/dangling"
expect 2 "is a dangling symbolic link" -- "$HP" inspect "$WORK/dangling"
expect 2 "/dev/null: the path is a character device" -- "$HP" inspect /dev/null
expect 2 "/dev/stdin: the path is a" -- "$HP" inspect /dev/stdin

# config.json that contradicts the weights beside it, and checkpoints without tensors.
mkdir "$WORK/e16" && cp "$G/model.safetensors" "$G/config.json" "$WORK/e16/"
sed -i 's/"num_experts": [0-9]*/"num_experts": 32/' "$WORK/e16/config.json"
expect 2 "it says 32 routed experts (num_experts) but the weights hold 16" -- "$HP" inspect "$WORK/e16"
mkdir "$WORK/l5" && cp "$G/model.safetensors" "$G/config.json" "$WORK/l5/"
sed -i 's/"num_hidden_layers": [0-9]*/"num_hidden_layers": 5/' "$WORK/l5/config.json"
expect 2 "it says num_hidden_layers 5 but the weights hold layers 0..1" -- "$HP" inspect "$WORK/l5"
mkdir "$WORK/noweights" && printf '{"metadata": {}, "weight_map": {}}' > "$WORK/noweights/model.safetensors.index.json"
expect 2 '"weight_map" is empty' -- "$HP" inspect "$WORK/noweights"

# config.json values transformers would refuse or silently replace.
printf '{"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,\n "num_key_value_heads": 0, "vocab_size": 32, "intermediate_size": 8}' > "$WORK/kv0.json"
expect 2 'kv0.json:2:25: field "num_key_value_heads" is 0' -- "$HP" inspect "$WORK/kv0.json"
printf '{"architectures": ["MixtralForCausalLM"], "model_type": "llama", "hidden_size": 64}' > "$WORK/mix.json"
expect 2 'contradicts architectures[0] "MixtralForCausalLM"' -- "$HP" inspect "$WORK/mix.json"
printf '{"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32, "intermediate_size": 8}' > "$WORK/q3.json"
expect 0 "head_dim 128" -- "$HP" inspect "$WORK/q3.json"
# MLA: head_dim is only the rope part of a q/k head; the summary gives the q/k and v head dims
expect 0 "q/k head dim 192 (nope 128 + rope 64), v head dim 128, kv_lora_rank 512, q_lora_rank 1536" -- "$HP" inspect "$D/configs/deepseek-v3.json"
finish

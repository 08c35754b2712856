"""make_reference.py [MODEL.gguf] — writes reference.safetensors beside it: SmolLM2-135M-Instruct's logits at the
last position of fixed token ids, computed once by transformers from the GGUF file WITHOUT hyperpar: the gguf
package dequantizes every tensor (gguf.quants.dequantize), this script undoes llama.cpp's Q/K row permutation and
builds the LlamaConfig from the GGUF metadata itself, the weights are rounded to bf16 (what `hyperpar convert` writes
by default) and the forward runs in float32. tests/python/test_smollm2.py compares `hyperpar run` and transformers on
the converted folder with it. Run it again only on purpose (the file is the test's reference).

  input_ids  I64 [1, S]  "The capital of France is" as SmolLM2's tokenizer splits it, then fixed ids
  logits     F32 [V]     the last position's logits
"""
import os
import sys

import gguf
import numpy as np
import torch
import transformers
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
PATH = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
# "The capital of France is" (5 tokens), then ids spread over the vocabulary (special tokens included)
IDS = [504, 3575, 282, 4649, 314, 2, 1, 17, 1000, 12345, 49151, 30000, 7]

r = gguf.GGUFReader(PATH)


def field(key):
    return r.fields[key].contents()


n_head, n_kv = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
cfg = transformers.LlamaConfig(
    vocab_size=len(r.fields["tokenizer.ggml.tokens"].data), hidden_size=field("llama.embedding_length"),
    intermediate_size=field("llama.feed_forward_length"), num_hidden_layers=field("llama.block_count"),
    num_attention_heads=n_head, num_key_value_heads=n_kv, max_position_embeddings=field("llama.context_length"),
    rms_norm_eps=float(np.float32(field("llama.attention.layer_norm_rms_epsilon"))),
    rope_theta=float(field("llama.rope.freq_base")), tie_word_embeddings="output.weight" not in
    [t.name for t in r.tensors], bos_token_id=1, eos_token_id=2)
NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def unpermute(w, heads):
    """llama.cpp wrote rows as reshape(heads, 2, d/2, ...).swapaxes(1, 2); this puts them back."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


sd = {}
for t in r.tensors:
    w = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
    if t.name == "token_embd.weight":
        name = "model.embed_tokens.weight"
    elif t.name == "output_norm.weight":
        name = "model.norm.weight"
    elif t.name == "output.weight":
        name = "lm_head.weight"
    else:
        _, layer, kind, _ = t.name.split(".")
        name = "model.layers.%s.%s.weight" % (layer, NAMES[kind])
        if kind in ("attn_q", "attn_k"):
            w = unpermute(w, n_head if kind == "attn_q" else n_kv)
    sd[name] = torch.from_numpy(np.ascontiguousarray(w)).to(torch.bfloat16).float()
model = transformers.LlamaForCausalLM(cfg).float().eval()
missing, unexpected = model.load_state_dict(sd, strict=False)
assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
model.tie_weights()
ids = torch.tensor([IDS])
with torch.no_grad():
    logits = model(ids).logits[0, -1].float().contiguous()
out = os.path.join(HERE, "reference.safetensors")
save_file({"input_ids": ids, "logits": logits}, out)
print("wrote %s: argmax %d, max %.6f" % (out, logits.argmax().item(), logits.max().item()))

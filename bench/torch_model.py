"""torch_model.py — the PyTorch models that bench/train_ref.py and bench/torch_step.py run.

load(folder) gives transformers' AutoModelForCausalLM in float32 with eager attention when transformers is
importable and builds the family; otherwise (or with plain=True) the plain-torch model below, which covers the
dense llama, mistral, qwen2 and qwen3 families (llama3 rope scaling, sliding window, q/k/v biases, per-head q/k
norms, tied embeddings) and the softmax-routed MoE families qwen3_moe, qwen2_moe and mixtral (a loop over the
experts, as transformers' eager code runs them). Weights are read from the folder's *.safetensors, widened to
float32. Nothing here needs numpy or the safetensors package. spread(times) is the timing summary both bench
scripts print (min_s, median_s, max_s).
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

def spread(times):
    """(min, median, max) of the timed calls' seconds; the median of an even count is the mean of the two middle
    values, as hyperpar's benches take theirs (cli_bench_spread_sort in tools/bench_run.c)."""
    t = sorted(times)
    n = len(t)
    return t[0], t[n // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2]), t[-1]


_DT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
       "F64": torch.float64}


def read_safetensors(path, names=None):
    """{name: tensor} of a safetensors file (all tensors, or those in names)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for k, v in head.items():
            if k == "__metadata__" or (names is not None and k not in names):
                continue
            b, e = v["data_offsets"]
            f.seek(base + b)
            buf = bytearray(f.read(e - b))
            t = torch.frombuffer(buf, dtype=_DT[v["dtype"]]) if e > b else torch.empty(0, dtype=_DT[v["dtype"]])
            out[k] = t.reshape(v["shape"])
    return out


def _transformers_model(folder):
    try:
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM
    except Exception:
        return None
    try:
        m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    except Exception:
        return None
    return m.float()


def load(folder, plain=False):
    """(model in float32, a word saying which) for a checkpoint folder."""
    if not plain:
        m = _transformers_model(folder)
        if m is not None:
            import transformers
            return m, f"transformers {transformers.__version__} {type(m).__name__} (eager attention, float32)"
    cfg = json.load(open(os.path.join(folder, "config.json")))
    m = PlainCausalLM(cfg)
    sd = {}
    for fn in sorted(os.listdir(folder)):
        if fn.endswith(".safetensors"):
            sd.update(read_safetensors(os.path.join(folder, fn)))
    m.load_hf(sd)
    return m, f"plain torch {cfg.get('model_type')} (bench/torch_model.py, float32)"


def logits(model, ids):
    if isinstance(model, PlainCausalLM):
        return model(ids)
    return model(input_ids=ids, use_cache=False).logits


# ---- the plain-torch model ----

class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):  # in float32, cast back, then the weight (transformers' LlamaRMSNorm)
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def _inv_freq(cfg, hd):
    theta = cfg.get("rope_theta", 10000.0)
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "llama3":
        f, lo, hi, orig = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], \
            rs["original_max_position_embeddings"]
        wl = 2 * math.pi / inv
        out = torch.where(wl > orig / lo, inv / f, inv)
        sm = (orig / wl - lo) / (hi - lo)
        smoothed = (1 - sm) * out / f + sm * out
        med = ~(wl < orig / hi) * ~(wl > orig / lo)
        inv = torch.where(med, smoothed, out)
    elif kind not in ("default", None):
        raise ValueError(f"rope_scaling {kind} is not in the plain-torch model; install transformers")
    return inv


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg, window):
        super().__init__()
        H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg.get("num_key_value_heads") or \
            cfg["num_attention_heads"]
        hd = cfg.get("head_dim") or H // nh
        bias = cfg.get("attention_bias", cfg.get("model_type") in ("qwen2", "qwen2_moe"))
        self.nh, self.nkv, self.hd, self.window = nh, nkv, hd, window
        self.q_proj = nn.Linear(H, nh * hd, bias=bias)
        self.k_proj = nn.Linear(H, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(H, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        qk = cfg.get("model_type") in ("qwen3", "qwen3_moe")
        self.q_norm = RMSNorm(hd, cfg["rms_norm_eps"]) if qk else None
        self.k_norm = RMSNorm(hd, cfg["rms_norm_eps"]) if qk else None

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.nh, self.hd)
        k = self.k_proj(x).view(B, S, self.nkv, self.hd)
        v = self.v_proj(x).view(B, S, self.nkv, self.hd).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        i = torch.arange(S)
        mask = i[None, :] > i[:, None]
        if self.window:
            mask = mask | (i[:, None] - i[None, :] >= self.window)
        s = s.masked_fill(mask, float("-inf"))
        o = torch.softmax(s.float(), -1).to(v.dtype) @ v  # softmax in float32, cast to the values' dtype
        return self.o_proj(o.transpose(1, 2).reshape(B, S, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Softmax router -> top-k (renormalised if norm_topk_prob; mixtral always) -> experts, looped."""

    def __init__(self, cfg):
        super().__init__()
        H, E = cfg["hidden_size"], cfg.get("num_experts") or cfg.get("num_local_experts")
        I = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
        self.k = cfg["num_experts_per_tok"]
        self.norm = cfg.get("norm_topk_prob", cfg.get("model_type") == "mixtral")
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = nn.ModuleList([MLP(H, I) for _ in range(E)])
        shared = cfg.get("shared_expert_intermediate_size") if cfg.get("model_type") == "qwen2_moe" else 0
        self.shared_expert = MLP(H, shared) if shared else None
        self.shared_expert_gate = nn.Linear(H, 1, bias=False) if shared else None

    def forward(self, x):
        B, S, H = x.shape
        h = x.reshape(-1, H)
        p = torch.softmax(self.gate(h).float(), -1)
        w, idx = torch.topk(p, self.k, -1)
        if self.norm:
            w = w / w.sum(-1, keepdim=True)
        w = w.to(h.dtype)  # routing weights in the activations' dtype, as transformers casts them
        y = torch.zeros_like(h)
        for e, ex in enumerate(self.experts):
            rows, slot = torch.where(idx == e)
            if rows.numel():
                y = y.index_add(0, rows, ex(h[rows]) * w[rows, slot, None])
        if self.shared_expert is not None:
            y = y + torch.sigmoid(self.shared_expert_gate(h)) * self.shared_expert(h)
        return y.view(B, S, H)


class Layer(nn.Module):
    def __init__(self, cfg, l):
        super().__init__()
        H = cfg["hidden_size"]
        win = cfg.get("sliding_window") if cfg.get("model_type") == "mistral" or cfg.get("use_sliding_window") else None
        self.self_attn = Attention(cfg, win)
        self.input_layernorm = RMSNorm(H, cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(H, cfg["rms_norm_eps"])
        E = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
        sparse = E > 0 and l not in (cfg.get("mlp_only_layers") or []) and \
            (l + 1) % cfg.get("decoder_sparse_step", 1) == 0
        self.mlp = MoE(cfg) if sparse else MLP(H, cfg["intermediate_size"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class PlainCausalLM(nn.Module):
    FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral")

    def __init__(self, cfg):
        super().__init__()
        if cfg.get("model_type") not in self.FAMILIES:
            raise ValueError(f"model_type {cfg.get('model_type')} is not in the plain-torch model "
                             f"({', '.join(self.FAMILIES)}); install transformers")
        self.cfg = cfg
        H, V = cfg["hidden_size"], cfg["vocab_size"]
        self.hd = cfg.get("head_dim") or H // cfg["num_attention_heads"]
        self.embed_tokens = nn.Embedding(V, H)
        self.layers = nn.ModuleList([Layer(cfg, l) for l in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.lm_head = None if self.tied else nn.Linear(H, V, bias=False)
        self.register_buffer("inv_freq", _inv_freq(cfg, self.hd), persistent=False)

    def forward(self, ids):
        S = ids.shape[1]
        f = torch.arange(S, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((f, f), -1)
        x = self.embed_tokens(ids)
        cos, sin = emb.cos()[None, None].to(x.dtype), emb.sin()[None, None].to(x.dtype)  # as transformers' rope
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        return x @ self.embed_tokens.weight.t() if self.tied else self.lm_head(x)

    def load_hf(self, sd):
        """Hub checkpoint names -> this model's (the same but for the 'model.' prefix and MoE layouts)."""
        own = dict(self.named_parameters())
        got = {}
        for k, v in sd.items():
            n = k[len("model."):] if k.startswith("model.") else k
            n = n.replace("block_sparse_moe.", "mlp.").replace(".w1.", ".gate_proj.").replace(".w3.", ".up_proj.") \
                .replace(".w2.", ".down_proj.")
            if n.endswith("mlp.experts.gate_up_proj"):  # batched [E, 2I, H], gate rows first
                I = v.shape[1] // 2
                for e in range(v.shape[0]):
                    got[n.replace("gate_up_proj", f"{e}.gate_proj.weight")] = v[e, :I]
                    got[n.replace("gate_up_proj", f"{e}.up_proj.weight")] = v[e, I:]
                continue
            if n.endswith("mlp.experts.down_proj"):  # [E, H, I]
                for e in range(v.shape[0]):
                    got[n.replace("down_proj", f"{e}.down_proj.weight")] = v[e]
                continue
            got[n] = v
        missing = [n for n in own if n not in got]
        if missing:
            raise ValueError(f"the checkpoint lacks {missing[:3]}")
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(got[n].to(torch.float32).reshape(p.shape))

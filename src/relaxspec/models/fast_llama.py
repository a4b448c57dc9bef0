"""A lean inference path for Llama-architecture `transformers` models.

Same weights, same math as `LlamaForCausalLM` (tested to match its logits and
hidden states), minus the per-call framework overhead (mask builders, output
records, hooks) that dominates the latency of a small model on a CPU: a
1-layer drafter costs ~1 ms per step through `model(...)` and a fraction of
that here. Speculative decoding lives on the drafter/verifier cost ratio, so
this is what makes speed-ups measurable on a laptop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class KVCache:
    """Per-layer key/value tensors [B, H, L, D]; the few cache calls the engine makes."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def get_seq_length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = k, v
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]

    def crop(self, tokens_to_remove: int) -> None:
        """Same convention as transformers' DynamicCache.crop: a negative count from the end."""
        if tokens_to_remove < 0 and self.keys[0] is not None:
            keep = self.get_seq_length() + tokens_to_remove
            self.keys = [k[:, :, :keep] for k in self.keys]
            self.values = [v[:, :, :keep] for v in self.values]

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        if self.keys[0] is not None:
            self.keys = [k[rows] for k in self.keys]
            self.values = [v[rows] for v in self.values]


def _rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class FastLlama:
    SUPPORTED = ("LlamaForCausalLM",)

    def __init__(self, model):
        cfg = model.config
        self.num_layers = cfg.num_hidden_layers
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        inner = model.model
        rotary = inner.rotary_emb
        self.inv_freq = rotary.inv_freq.float()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        self.lm_head = model.lm_head.weight
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            if any(getattr(p, "bias", None) is not None for p in (a.q_proj, a.k_proj, a.v_proj, a.o_proj)):
                raise ValueError("FastLlama does not support attention biases")
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], dim=0)
            gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight], dim=0)
            self.layers.append((layer.input_layernorm.weight, qkv, a.o_proj.weight,
                                layer.post_attention_layernorm.weight, gate_up, m.down_proj.weight))

    @classmethod
    def supports(cls, model) -> bool:
        cfg = model.config
        return (type(model).__name__ in cls.SUPPORTED and getattr(cfg, "hidden_act", "silu") == "silu"
                and (getattr(cfg, "rope_scaling", None) or {}).get("rope_type", "default") == "default"
                and not getattr(cfg, "mlp_bias", False)
                and getattr(cfg, "sliding_window", None) is None)

    def new_cache(self) -> KVCache:
        return KVCache(self.num_layers)

    @torch.inference_mode()
    def forward(self, input_ids, cache: KVCache, attention_mask, position_ids, hidden_layer=None):
        B, T = input_ids.shape
        past = cache.get_seq_length()
        x = F.embedding(input_ids, self.embed)
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, T, D]
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        # Key j is visible to query t iff it is a real slot of the row and not in the future (by cache index).
        causal = torch.arange(past + T)[None, :] <= (past + torch.arange(T))[:, None]  # [T, L]
        allowed = causal[None, None] & attention_mask[:, None, None, :].bool()  # [B, 1, T, L]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        hidden = None
        wanted = None if hidden_layer is None else hidden_layer % self.num_layers
        for i, (w_in, qkv, w_o, w_post, gate_up, w_down) in enumerate(self.layers):
            h = _rms_norm(x, w_in, self.eps)
            q, k, v = F.linear(h, qkv).split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k, v = cache.update(i, k, v)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=self.kv_heads != self.heads)
            x = x + F.linear(o.transpose(1, 2).reshape(B, T, q_size), w_o)
            gate, up = F.linear(_rms_norm(x, w_post, self.eps), gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w_down)
            if i == wanted and i < self.num_layers - 1:
                hidden = x
        x = _rms_norm(x, self.final_norm, self.eps)
        if wanted == self.num_layers - 1:
            hidden = x  # as transformers reports it: the last hidden state is after the final norm
        return F.linear(x, self.lm_head).float(), None if hidden is None else hidden.float()

"""A lean inference path for Llama-architecture `transformers` models.

Same weights, same math as `LlamaForCausalLM` (tested to match its logits and
hidden states), minus the per-call framework overhead (mask builders, output
records, hooks) that dominates the latency of a small model on a CPU.
Speculative decoding lives on the drafter/verifier cost ratio, and a tiny
drafter is almost all per-op overhead, so every op per layer counts:

* the KV cache is a preallocated buffer per layer: appending writes only the
  new slots, rollback moves a length pointer (gpt-fast style), no copy of the past;
* RoPE is one complex multiply, in place, on q and k together: the q/k
  projection rows of each head are permuted once so that HF's half-split pairs
  (j, j + D/2) sit side by side. q·k is unchanged by a permutation applied to both;
* the attention mask is built once per call (not per layer), into a buffer kept across calls, and skipped
  for a single new token that may see every slot;
* every large matrix is stored once, in the weight format asked for (`models/quant.py`: float32 through
  oneDNN on a copy reordered once into its blocked layout, for one row and for a block alike; bfloat16;
  int4 weight-only, group-wise), so that a block of several rows (a verifier's N+1 tokens, a prefill) reads
  each weight once, as a one-token step does. Through MKL's sgemm a block repacked the whole weight on every
  call (3.9-5.9x a step at 6 rows on SmolLM2-135M);
* on a CPU, RMSNorm and attention are one native call each (models/f32_kernels.py; torch's RMSNorm is a
  composite of ~8 operations, and sdpa plus the transpose of its output cost 2x the kernel at a decode step),
  and the embedding and RoPE table are read by index_select: a small model's step is made of few operations.

The decoder layers and their per-layer step are `DecoderLayers` (FastLlama adds the embedding, final norm and LM
head); an MTP drafter head's layer is the same layer and drafts through it (drafters/mtp.py).

Every tensor it makes (KV buffers, the RoPE table, masks) lives on the weights' device. On a CPU it computes
in float32 whatever the weights' format (norms, RoPE, attention, the residual stream and the logits are
float32; the bfloat16 and int4 kernels round a linear layer's input to bfloat16). Elsewhere it computes in
the weights' dtype, except RoPE, which is applied in float32 (bfloat16 has no complex type).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from relaxspec.models import f32_kernels
from relaxspec.models.device import inference
from relaxspec.models.quant import Int4Codes, Linear, cat_weights

_MASKED = -1e30  # additive mask: finite, so a row with no visible slot (padding) stays NaN-free (capped by the dtype)


class KVCache:
    """Per-layer buffers [B, 2 * KV heads, capacity, D] (keys, then values, along the head axis), of
    which the first `length` slots are in use."""

    def __init__(self, num_layers: int):
        self.kv: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def write(self, layer: int, start: int, kv: torch.Tensor) -> torch.Tensor:
        """Store kv [B, 2 * KV heads, T, D] at slots start..start+T; the keys and values of slots 0..start+T."""
        end = start + kv.shape[2]
        buf = self.buffer(layer, start, end, kv)
        buf[:, :, start:end] = kv
        return buf[:, :, :end]

    def buffer(self, layer: int, start: int, end: int, like: torch.Tensor) -> torch.Tensor:
        """The layer's buffer with room for slots 0..end, grown (by doubling, slots 0..start kept) when it has
        not; `like` [B, 2 * KV heads, *, D] gives the shape, dtype and device of a new one."""
        buf = self.kv[layer]
        if buf is None or buf.shape[2] < end:
            B, H, _, D = like.shape
            grown = like.new_empty((B, H, max(2 * (0 if buf is None else buf.shape[2]), end + 64), D))
            if buf is not None and start:
                grown[:, :, :start] = buf[:, :, :start]
            buf = self.kv[layer] = grown
        return buf

    def crop(self, tokens_to_remove: int) -> None:
        """Same convention as transformers' DynamicCache.crop: a negative count from the end."""
        if tokens_to_remove < 0:
            self.length = max(0, self.length + tokens_to_remove)

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        self.kv = [None if kv is None else kv[rows] for kv in self.kv]


def _interleave_rope_pairs(weight, heads: int, head_dim: int, inverse: bool = False):
    """Rows of a q/k projection (a weight [heads * D, in], its bias [heads * D], quant.Int4Codes or
    gguf_block.BlockCodes) reordered per head from [0..D/2-1 | D/2..D-1] to (0, D/2, 1, D/2+1, ...) (`inverse`:
    back)."""
    half = head_dim // 2
    device = weight.codes.device if isinstance(weight, Int4Codes) else weight.device
    first = torch.arange(half, device=device)
    order = torch.stack([first, first + half], dim=1).reshape(-1)
    order = order.argsort() if inverse else order
    rows = (torch.arange(heads, device=device)[:, None] * head_dim + order).reshape(-1)
    return weight[rows]


class BuiltLayer(NamedTuple):
    """A decoder layer already in its format, as `DecoderLayers.layers` holds it (weights: input norm, qkv, o,
    post-attention norm, gate_up, down) with its q/k/v bias (or None): what models/weight_cache.py reads back."""

    weights: tuple
    qkv_bias: torch.Tensor | None


class DecoderLayers:
    """Llama decoder layers run lean over a `KVCache` (pre-norm attention with RoPE, SwiGLU MLP; the module
    docstring's choices): FastLlama's layers, and those of the MTP drafter head (drafters/mtp.py), which are the
    same layer fed the head's own entries. On a CPU it computes in float32 whatever the weights' format; elsewhere
    in the weights' dtype."""

    linear_options: dict = {}  # passed to every quant.Linear (a subclass may ask for another layout)

    def __init__(self, layers, heads: int, kv_heads: int, head_dim: int, eps: float, inv_freq: torch.Tensor,
                 rope_scale: float, device: torch.device, weights_dtype: torch.dtype, weight_format: str = "float32"):
        """`layers`: an iterable (read once, layer by layer: a generator keeps one layer's source weights at a time)
        of, per layer, the weights (input norm, q, k, v, o, post-attention norm, gate, up, down) in
        transformers' layout (q and k rows half-split per head: interleaved here), optionally followed by the q, k,
        v biases (Qwen2; None each where absent). A matrix is a tensor, a quant.Int4Codes (a GGUF file's own 4-bit
        codes) or a gguf_block.BlockCodes (a GGUF file's own types). `weight_format` applies on a CPU (float32,
        bfloat16, int4, "auto": Int4Codes kept in int4, every other matrix in bfloat16; or "file": BlockCodes kept in
        their types, every other matrix in float32); elsewhere the weights keep `weights_dtype`. Every matrix is
        copied into its format, but for a layer given as a `BuiltLayer` (already in it: kept as it is)."""
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps
        self.device = device
        self.dtype = torch.float32 if device.type == "cpu" else weights_dtype  # compute dtype
        self.weight_format = weight_format if device.type == "cpu" else str(self.dtype).removeprefix("torch.")
        self.inv_freq = inv_freq.float().to(device)
        self.rope_scale = rope_scale
        self._rotations = torch.empty((0, head_dim // 2), dtype=torch.complex64, device=device)
        self.masked = max(_MASKED, torch.finfo(self.dtype).min)
        self._bias = torch.empty(0, dtype=self.dtype, device=device)  # storage of the attention bias
        self._future: dict[int, torch.Tensor] = {}  # T -> [T, T] True above the diagonal (a later query's slot)
        # RMSNorm, RoPE with the cache write, and attention in one native call each on a CPU (models/f32_kernels.py;
        # None: torch's ops)
        self._native = f32_kernels.library() if self.dtype == torch.float32 and device.type == "cpu" else None
        self._scratch = torch.empty(0, dtype=torch.float32, device=device)  # the attention kernel's scores
        self.layers = []
        dt, fmt, kw = self.dtype, self.weight_format, self.linear_options
        self.qkv_bias: list[torch.Tensor | None] = []  # per layer [q + 2 kv] in the compute dtype, or None
        for parts in layers:
            if isinstance(parts, BuiltLayer):  # already in its format (the converted-weight cache)
                self.layers.append(parts.weights)
                self.qkv_bias.append(parts.qkv_bias)
                continue
            w_in, q, k, v, o, w_post, gate, up, down, *bias = parts
            qkv = cat_weights([_interleave_rope_pairs(q, heads, head_dim),
                               _interleave_rope_pairs(k, kv_heads, head_dim), v])
            self.layers.append((w_in.detach().to(dt), self._linear(qkv), self._linear(o), w_post.detach().to(dt),
                                self._linear(cat_weights([gate, up])), self._linear(down)))
            bq, bk, bv = bias[0] if bias and bias[0] is not None else (None, None, None)
            self.qkv_bias.append(None if bq is None else torch.cat([
                _interleave_rope_pairs(bq.detach(), heads, head_dim), _interleave_rope_pairs(bk.detach(), kv_heads,
                                                                                             head_dim),
                bv.detach()]).to(device=device, dtype=dt))
        self.num_layers = len(self.layers)

    def _linear(self, weight) -> Linear:
        """A matrix in the layers' format ("auto": a GGUF file's own 4-bit codes in int4, anything else in bfloat16;
        "file": quant.Linear keeps a GGUF file's types, anything else in float32)."""
        if isinstance(weight, Linear):  # already in its format (the converted-weight cache)
            return weight
        fmt = self.weight_format
        if fmt == "auto":
            fmt = "int4" if isinstance(weight, Int4Codes) else "bfloat16"
        return Linear(weight, fmt, **self.linear_options)

    def new_cache(self) -> KVCache:
        return KVCache(self.num_layers)

    def _rotation(self, position_ids: torch.Tensor, needed: int) -> torch.Tensor:
        """e^{i·pos·inv_freq} (times HF's attention scaling) [B, T, 1, D/2], from a table grown on demand
        to `needed` positions: the cache length bounds the engine's positions without a device sync;
        any other position ids still work, through the IndexError of a too-short table."""
        if needed > self._rotations.shape[0]:
            size = max(2 * self._rotations.shape[0], needed, 256)
            angles = torch.arange(size, dtype=torch.float32, device=self.device)[:, None] * self.inv_freq
            self._rotations = torch.polar(torch.full_like(angles, self.rope_scale), angles)
        try:
            return self._rotations.index_select(0, position_ids.reshape(-1)).view(*position_ids.shape, 1, -1)
        except IndexError:
            return self._rotation(position_ids, int(position_ids.max()) + 1)

    def _attention_bias(self, attention_mask, past: int, B: int, T: int):
        """Additive mask [B, 1, T, L]: key j is visible to query t iff it is a real slot of the row and
        not in the future (by cache index); attention_mask None: every slot is real. None when a single new token
        may see every slot, as known without a device sync (a mask off the CPU is not read: its bias is built).
        Written into a storage kept across calls (grown by doubling), so a call allocates no [B, 1, T, L] tensor."""
        if T == 1 and (attention_mask is None or (attention_mask.device.type == "cpu" and bool(attention_mask.all()))):
            return None
        L = past + T
        if self._bias.numel() < B * T * L:
            self._bias = self._bias.new_empty(2 * B * T * L)
        bias = self._bias[:B * T * L].view(B, 1, T, L)
        bias.zero_()
        if attention_mask is not None:
            bias.masked_fill_(attention_mask[:, None, None, :] == 0, self.masked)  # broadcast over T
        if T not in self._future:
            self._future[T] = torch.ones((T, T), dtype=torch.bool, device=self.device).triu_(1)
        bias[..., past:].masked_fill_(self._future[T], self.masked)
        return bias

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self._native is not None:
            return f32_kernels.rms_norm(self._native, x, weight, self.eps)
        return torch.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def _rope_and_cache(self, qkv: torch.Tensor, rotation: torch.Tensor, cache: KVCache, layer: int, past: int,
                        B: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE on q and k, the new keys and values stored in the cache: (the queries' source for `_attention`,
        the keys and values of every slot [B, 2 KVH, L, D]). On a CPU one native call (the queries stay in qkv,
        rotated in place), elsewhere torch's ops (the queries in a heads' view [B, H + 2 KVH, T, D])."""
        H, KVH, D = self.heads, self.kv_heads, self.head_dim
        if self._native is not None:
            like = qkv.view(B, T, H + 2 * KVH, D)[:, :, H:].transpose(1, 2)  # (shape only)
            buf = cache.buffer(layer, past, past + T, like)
            return qkv, f32_kernels.rope_write(self._native, qkv, rotation, buf, past, H, KVH, D)
        pairs = torch.view_as_complex(qkv.float().view(B, T, H + 2 * KVH, D // 2, 2))
        pairs[:, :, :H + KVH].mul_(rotation)  # q and k rotated in place; v as it is
        heads = torch.view_as_real(pairs).to(qkv.dtype).view(B, T, H + 2 * KVH, D).transpose(1, 2)
        return heads, cache.write(layer, past, heads[:, H:])

    def _attention(self, queries: torch.Tensor, kv: torch.Tensor, bias, B: int, T: int) -> torch.Tensor:
        """softmax(q k^T / sqrt(D) + bias) v: [B * T, H * D], from `_rope_and_cache`'s queries and keys and values."""
        H, KVH, D = self.heads, self.kv_heads, self.head_dim
        if self._native is not None:  # (queries: `_rope_and_cache`'s qkv)
            if self._scratch.numel() < kv.shape[2] + 16:
                self._scratch = self._scratch.new_empty(2 * kv.shape[2] + 16)
            return f32_kernels.attention(self._native, queries.view(B, T, -1), kv, bias, H, KVH, D,
                                         self._scratch)
        o = F.scaled_dot_product_attention(queries[:, :H], kv[:, :KVH], kv[:, KVH:], attn_mask=bias,
                                           enable_gqa=KVH != H)
        return o.transpose(1, 2).reshape(B * T, H * D)

    def run_layers(self, x: torch.Tensor, cache: KVCache, attention_mask, position_ids: torch.Tensor,
                   hidden_blocks=()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """x [B * T, C] (compute dtype) through every layer, its keys and values appended to `cache` (positions
        position_ids [B, T]; attention_mask [B, past + T], 1: a real slot, or None when every slot is real). Returns
        the last layer's output [B * T, C] and {block: its output} for the blocks in `hidden_blocks`."""
        B, T = position_ids.shape
        past = cache.get_seq_length()
        rotation = self._rotation(position_ids, past + T)  # [B, T, 1, D/2], every head alike
        bias = self._attention_bias(attention_mask, past, B, T)
        hidden = {}
        for i, (w_in, qkv_proj, o_proj, w_post, gate_up_proj, down_proj) in enumerate(self.layers):
            qkv = qkv_proj(self._rms_norm(x, w_in))
            if self.qkv_bias[i] is not None:
                qkv.add_(self.qkv_bias[i])
            queries, kv = self._rope_and_cache(qkv, rotation, cache, i, past, B, T)
            x = o_proj(self._attention(queries, kv, bias, B, T), residual=x)
            gate, up = gate_up_proj(self._rms_norm(x, w_post)).chunk(2, dim=-1)
            x = down_proj(F.silu(gate) * up, residual=x)
            if i in hidden_blocks:
                hidden[i] = x
        cache.length = past + T
        return x, hidden


class FastLlama(DecoderLayers):
    """Llama and Qwen2 (q/k/v biases, an untied head) decoders run lean."""

    SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM")

    def __init__(self, model, weight_format: str = "float32", source=None):
        """`weight_format` (float32, bfloat16, int4; "auto" and "file" with `source`) applies on a CPU; elsewhere the
        weights keep their dtype. The transformers model's linear weights are copied (its own stay usable:
        `release_weights` drops them, `linear_weights` reads them back). `source(name)`: the weight of that
        transformers state_dict name (a tensor, a quant.Int4Codes or a gguf_block.BlockCodes), read one at a time (a
        GGUF file's tensors, models/gguf_weights.py); default: the model's own parameters. (A converted-weight cache's
        entry is read by `from_stored`, without a model.)"""
        cfg = model.config
        inner = model.model
        rotary = inner.rotary_emb
        if source is None:
            params = dict(model.named_parameters())
            source = params.get
        self.embed = source("model.embed_tokens.weight")
        self.num_parameters = sum(p.numel() for p in model.parameters())
        if any(getattr(layer.self_attn.o_proj, "bias", None) is not None for layer in inner.layers) or getattr(
                cfg, "mlp_bias", False):
            raise ValueError("FastLlama supports q/k/v biases only (not the output projection's or the MLP's)")

        def weights():  # one layer's source weights at a time
            for i, layer in enumerate(inner.layers):
                name = f"model.layers.{i}."
                w = [source(name + n + ".weight") for n in ("input_layernorm", "self_attn.q_proj",
                                                             "self_attn.k_proj", "self_attn.v_proj",
                                                             "self_attn.o_proj", "post_attention_layernorm",
                                                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
                bias = tuple(source(name + f"self_attn.{n}_proj.bias")
                             if getattr(layer.self_attn, f"{n}_proj").bias is not None else None for n in "qkv")
                yield (*w, bias if bias[0] is not None else None)

        self._assemble(cfg, weights(), rotary.inv_freq, float(getattr(rotary, "attention_scaling", 1.0)), source,
                       weight_format)
        tied = getattr(cfg, "tie_word_embeddings", False) and not getattr(source, "tied_head", False)
        head = self.embed if tied else source("lm_head.weight")  # (`tied_head`: the source gives a tied head)
        self.lm_head = self._linear(head)

    @classmethod
    def from_stored(cls, config, weight_format: str, source) -> "FastLlama":
        """A FastLlama over a converted-weight cache entry, with no transformers model (`config`: the model's).
        `source` (models/weight_cache.py's StoredWeights) gives the layers (BuiltLayer each) and LM head already in
        the format, the RoPE frequencies and scale, the parameter count, and the embedding and final norm by name."""
        fast = cls.__new__(cls)
        fast.embed = source("model.embed_tokens.weight")
        fast.num_parameters = source.num_parameters
        fast._assemble(config, source.built.layers, source.inv_freq, source.rope_scale, source, weight_format)
        fast.lm_head = source.built.lm_head
        return fast

    def _assemble(self, cfg, layers, inv_freq: torch.Tensor, rope_scale: float, source, weight_format: str) -> None:
        """The decoder layers in `cfg`'s shape and the final norm, on the embedding's device (read first)."""
        super().__init__(layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                         getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                         cfg.rms_norm_eps, inv_freq, rope_scale, self.embed.device, self.embed.dtype, weight_format)
        self.final_norm = source("model.norm.weight").detach().to(self.dtype)

    _LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                "mlp.up_proj", "mlp.down_proj")

    @classmethod
    def release_weights(cls, model) -> None:
        """Drop the transformers model's decoder-layer linear weights once a FastLlama holds them in its
        format (one resident copy, in every format); the model then runs only through FastLlama, and
        `linear_weights` gives the dropped weights back on demand. Its embedding and LM head stay (the embedding
        table is read by FastLlama; MTP heads borrow both)."""
        for layer in model.model.layers:
            for name in cls._LINEARS:
                linear = layer.get_submodule(name)
                linear.weight = torch.nn.Parameter(linear.weight.new_empty((0, linear.in_features)),
                                                   requires_grad=False)

    def linear_weights(self, head: bool = False) -> dict[str, torch.Tensor]:
        """The decoder layers' linear weights under the transformers model's state_dict names, in float32, read
        back from the copies it multiplies by (`quant.Linear.dense`: exact in float32 and bfloat16); `head`: the
        LM head's too (a model loaded from a GGUF file keeps no other copy of it)."""
        out = {"lm_head.weight": self.lm_head.dense()} if head else {}
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for i, (_, qkv, o, _, gate_up, down) in enumerate(self.layers):
            w = qkv.dense()
            gate, up = gate_up.dense().split(gate_up.shape[0] // 2)
            weights = (_interleave_rope_pairs(w[:q], self.heads, self.head_dim, inverse=True),
                       _interleave_rope_pairs(w[q:q + kv], self.kv_heads, self.head_dim, inverse=True),
                       w[q + kv:], o.dense(), gate, up, down.dense())
            out.update({f"model.layers.{i}.{name}.weight": t.contiguous() for name, t in zip(self._LINEARS, weights)})
        return out

    def weight_bytes(self) -> int:
        """Bytes of the matrices it keeps (in their format), plus the norms and the embedding table."""
        mats = [lin for layer in self.layers for lin in (layer[1], layer[2], layer[4], layer[5])] + [self.lm_head]
        norms = [t for layer in self.layers for t in (layer[0], layer[3])] + [self.final_norm, self.embed]
        return sum(lin.nbytes for lin in mats) + sum(t.numel() * t.element_size() for t in norms)

    @classmethod
    def supports(cls, model) -> bool:
        cfg = model.config
        return (type(model).__name__ in cls.SUPPORTED and getattr(cfg, "hidden_act", "silu") == "silu"
                and (getattr(cfg, "rope_scaling", None) or {}).get("rope_type", "default") == "default"
                and not getattr(cfg, "mlp_bias", False)
                and getattr(cfg, "sliding_window", None) is None)

    @inference
    def forward(self, input_ids, cache: KVCache, attention_mask, position_ids, hidden_blocks=(), logits: bool = True):
        """Logits [B, T, V] (None with `logits` False: the LM head is skipped, e.g. in a prefill whose logits nobody
        reads) and the hidden states after `hidden_blocks` (0-based; the last one after the final norm) concatenated
        [B, T, k * H], or None when none is asked for. attention_mask [B, past + T] (1: a real slot), or None when
        every slot is real."""
        B, T = input_ids.shape
        x = self.embed.index_select(0, input_ids.reshape(-1)).to(self.dtype)  # [B*T, C]: every matmul is one mm
        x, hidden = self.run_layers(x, cache, attention_mask, position_ids, hidden_blocks)
        x = self._rms_norm(x, self.final_norm)
        hidden[self.num_layers - 1] = x  # as transformers reports it: the last hidden state is after the final norm
        logits = self.lm_head(x).view(B, T, -1) if logits else None
        if not hidden_blocks:
            return logits, None
        return logits, torch.cat([hidden[i] for i in hidden_blocks], dim=-1).view(B, T, -1)

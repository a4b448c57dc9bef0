"""Compiled steps (`load_model(..., compile=True)`, `--compile`): the engine's small forwards through
`torch.compile` over a static KV cache, in fixed shapes, as gpt-fast does.

On small models the time between kernels (Python, dispatch, one launch per op) decides a step's cost;
a compiled step fuses the per-layer ops (inductor on a CPU) and, on CUDA, replays them as one CUDA graph
(`mode="reduce-overhead"`). That needs every compiled call to have the same shapes, and no Python value that
changes per round inside the graph:

* the cache is a preallocated buffer per layer [B, 2 * KV heads, capacity, D] plus a mask [B, capacity] of
  the slots each row may see (`StaticKVCache`); a step writes its keys and values at the slots given by a
  tensor, so the cache length is data, not a shape;
* a step of T tokens runs at a fixed width: 1, or the smallest planned block >= T (the engine plans the
  verifier's N + 1 and an LM drafter's 2, `plan_static_shapes`), the extra columns padded and masked out;
  unplanned widths up to `MAX_COMPILED_BLOCK` run at their own width;
* the capacity is known up front (prompt + max_new_tokens + N + 1, rounded up to `CAPACITY_QUANTUM` so that
  calls with other prompt lengths reuse the graphs; a cache that still runs out grows, at one recompile);
* rows that leave the batch stay in the buffers (their results are dropped): the batch size, a shape, stays
  that of the call;
* RoPE is cos/sin arithmetic on tables indexed by the positions tensor.

The prefill (a cache's first feed, any length) runs the same step function eagerly. The math is FastLlama's
(same weights, same layout; RoPE in real arithmetic instead of one complex multiply), in float32 on a CPU.
Compiled and eager steps agree to float rounding (inductor fuses differently): token for token at T=0 on
the built-in pair and tiny Llamas (tests/models/test_compiled.py), and strict stays lossless.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from relaxspec.models.fast_llama import FastLlama

CAPACITY_QUANTUM = 256  # cache capacities are multiples of this: fewer distinct shapes, fewer compiles
MAX_COMPILED_BLOCK = 16  # an unplanned step of up to this many tokens is compiled at its own width
RECOMPILE_LIMIT = 64  # graphs per step function: (model, width, batch, capacity) combinations


def _round_up(n: int, quantum: int) -> int:
    return -(-n // quantum) * quantum


class StaticKVCache:
    """Per-layer buffers [B, 2 * KV heads, capacity, D] (keys, then values), the mask [B, capacity] of each
    row's real slots, and `length`, the slots in use. `rows`: the buffer rows of the rows still in the batch
    (None: all of them). The buffers come from the model's pool (`CompiledLlama.buffers_for`): a later cache of
    the same shape reuses them once this one is gone, so CUDA graphs keep their addresses from call to call."""

    def __init__(self, model: "CompiledLlama", capacity: int):
        self.model = model
        self.planned = capacity
        self.kv: list[torch.Tensor] | None = None
        self.mask: torch.Tensor | None = None
        self.length = 0
        self.rows: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Same convention as transformers' DynamicCache.crop: a negative count from the end."""
        if tokens_to_remove < 0:
            self.length = max(0, self.length + tokens_to_remove)

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        """Rows leave the batch: only the map from batch rows to buffer rows changes (no new shapes)."""
        self.rows = rows if self.rows is None else self.rows[rows.to(self.rows.device)]

    def reserve(self, batch: int, needed: int) -> None:
        """Buffers for `batch` rows and at least `needed` slots (allocated on the first feed; grown, keeping
        the content, when a step would run past the capacity)."""
        if self.mask is not None and needed <= self.capacity:
            return
        capacity = _round_up(max(needed, self.planned, 2 * self.capacity), CAPACITY_QUANTUM)
        kv, mask = self.model.buffers_for(self, batch, capacity)
        if self.mask is not None:
            for new, old in zip(kv, self.kv):
                new[:, :, :self.capacity] = old[:, :, :self.capacity]
        self.kv, self.mask = kv, mask


class CompiledLlama(FastLlama):
    """FastLlama's weights and math with `forward` through compiled fixed-shape steps on a StaticKVCache."""

    linear_options = {"transposed": True}  # the compiled step multiplies by W^T itself (inductor picks the kernel)

    def __init__(self, model):
        super().__init__(model)
        self.weights = [(w_in, qkv.t, o.t, w_post, gate_up.t, down.t)
                        for w_in, qkv, o, w_post, gate_up, down in self.layers]
        self.head = self.lm_head.t
        positions = 2 * max(getattr(model.config, "max_position_embeddings", 0) or 0, 2048)
        angles = torch.arange(positions, dtype=torch.float32, device=self.device)[:, None] * self.inv_freq
        self.cos, self.sin = self.rope_scale * angles.cos(), self.rope_scale * angles.sin()
        self.capacity = 0  # planned slots for the next caches (0: as the first feed needs)
        self.blocks: tuple[int, ...] = ()  # planned step widths above 1
        self._pool: dict = {}  # (batch, capacity) -> (kv buffers, mask, weakref to the cache using them)
        self.cuda_graphs = self.device.type == "cuda"
        if self.cuda_graphs:
            for t in (*[w for layer in self.weights for w in layer], self.embed, self.final_norm, self.head,
                      self.cos, self.sin):
                torch._dynamo.mark_static_address(t)
        config = torch._dynamo.config  # the names since torch 2.7 (cache_size_limit before)
        for name, limit in (("recompile_limit", RECOMPILE_LIMIT), ("accumulated_recompile_limit", 4 * RECOMPILE_LIMIT)):
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), limit))
        self.compiled_step = torch.compile(self.step, fullgraph=True, dynamic=False,
                                           mode="reduce-overhead" if self.cuda_graphs else None)

    def buffers_for(self, cache: StaticKVCache, batch: int, capacity: int):
        """(kv buffers, mask) for `cache`: the pooled ones of this shape unless another live cache holds them
        (then fresh ones, e.g. a model drafting for itself). Stale content is harmless: every forward rewrites
        the whole mask, and a slot is only read where the mask allows it."""
        key = (batch, capacity)
        pooled = self._pool.get(key)
        holder = None if pooled is None else pooled[2]()
        if pooled is not None and holder is None:
            self._pool[key] = (pooled[0], pooled[1], weakref.ref(cache))
            return pooled[0], pooled[1]
        kv = [torch.zeros((batch, 2 * self.kv_heads, capacity, self.head_dim), dtype=self.dtype, device=self.device)
              for _ in range(self.num_layers)]
        mask = torch.zeros((batch, capacity), dtype=torch.bool, device=self.device)
        if self.cuda_graphs:  # CUDA graphs read and write these in place instead of copying them
            for t in (*kv, mask):
                torch._dynamo.mark_static_address(t)
        if pooled is None:
            self._pool[key] = (kv, mask, weakref.ref(cache))
        return kv, mask

    def plan(self, capacity: int, blocks: tuple[int, ...]) -> None:
        """Shapes of the next caches: `capacity` slots, steps of more than one token padded to `blocks`."""
        self.capacity = _round_up(capacity, CAPACITY_QUANTUM)
        self.blocks = tuple(sorted(set(blocks)))

    def new_cache(self) -> StaticKVCache:
        return StaticKVCache(self, self.capacity)

    def width(self, T: int) -> int | None:
        """The compiled width of a step of T tokens; None: run it eagerly."""
        if T == 1:
            return 1
        return next((b for b in self.blocks if b >= T), T if T <= MAX_COMPILED_BLOCK else None)

    @torch.inference_mode()
    def forward(self, input_ids, cache: StaticKVCache, attention_mask, position_ids, hidden_blocks=(),
                logits: bool = True):
        """As FastLlama.forward; the step is compiled unless it is the cache's first feed (the prefill). (Its steps
        always compute the logits, fixed graphs; with `logits` False they are dropped.)"""
        B, T = input_ids.shape
        past = cache.length
        width = self.width(T) if past else None
        W = T if width is None else width
        cache.reserve(B, past + W)
        rows = cache.rows
        at = slice(None) if rows is None else rows
        # Fresh contiguous inputs (a graph guards on strides), padded to the buffers' rows and the step's
        # width: padding is token 0 at position 0, in a slot no query sees.
        Bp = cache.mask.shape[0]
        ids = torch.zeros((Bp, W), dtype=torch.long, device=self.device)
        positions = torch.zeros((Bp, W), dtype=torch.long, device=self.device)
        ids[at, :T], positions[at, :T] = input_ids, position_ids.expand(B, T)
        L = past + T  # the caller's mask covers every slot in use, this step's included (None: all real)
        real = True if attention_mask is None else attention_mask.bool()
        if rows is None:
            cache.mask[:, :L] = real
            cache.mask[:, L:] = False
        else:
            cache.mask.zero_()
            cache.mask[rows, :L] = real
        slots = torch.arange(past, past + W, device=self.device)
        if width is None:
            out, hidden = self.step(ids, positions, slots, cache.mask, cache.kv, tuple(hidden_blocks))
        else:
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            out, hidden = self.compiled_step(ids, positions, slots, cache.mask, cache.kv, tuple(hidden_blocks))
        cache.length = L
        logits = out[at, :T] if logits else None
        hidden = None if hidden is None else hidden[at, :T]
        if self.cuda_graphs and width is not None:  # a graph's outputs are overwritten by its next replay
            logits = None if logits is None else logits.clone()
            hidden = None if hidden is None else hidden.clone()
        return logits, hidden

    def step(self, ids, positions, slots, mask, kv, hidden_blocks):
        """Logits [B, W, V] (and the hidden states of `hidden_blocks`, concatenated) of ids [B, W] at
        `positions` [B, W], written to cache slots `slots` [W]; slot j is visible to query t iff mask[:, j]
        and j <= slots[t]. Fixed shapes, no data-dependent control flow: one graph per width."""
        B, W = ids.shape
        H, KVH, D = self.heads, self.kv_heads, self.head_dim
        x = F.embedding(ids.reshape(-1), self.embed).to(self.dtype)  # [B*W, C]
        C = (x.shape[-1],)
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # [B, W, 1, D/2]
        capacity = mask.shape[1]
        visible = mask[:, None, None, :] & (torch.arange(capacity, device=ids.device) <= slots[:, None])
        bias = torch.zeros(visible.shape, dtype=self.dtype, device=ids.device).masked_fill(~visible, self.masked)
        hidden = {}
        for i, (w_in, qkv_t, o_t, w_post, gate_up_t, down_t) in enumerate(self.weights):
            qkv = torch.mm(F.rms_norm(x, C, w_in, self.eps), qkv_t).view(B, W, H + 2 * KVH, D)
            pairs = qkv[:, :, :H + KVH].float().view(B, W, H + KVH, D // 2, 2)
            a, b = pairs[..., 0], pairs[..., 1]  # HF's (j, j + D/2) pairs, interleaved by FastLlama's weights
            rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).view(B, W, H + KVH, D)
            heads = torch.cat([rotated.to(x.dtype), qkv[:, :, H + KVH:]], dim=2).transpose(1, 2)
            buf = kv[i]
            buf[:, :, slots] = heads[:, H:]
            o = F.scaled_dot_product_attention(heads[:, :H], buf[:, :KVH], buf[:, KVH:], attn_mask=bias,
                                               enable_gqa=KVH != H)
            x = torch.addmm(x, o.transpose(1, 2).reshape(B * W, H * D), o_t)
            gate, up = torch.mm(F.rms_norm(x, C, w_post, self.eps), gate_up_t).chunk(2, dim=-1)
            x = torch.addmm(x, F.silu(gate) * up, down_t)
            if i in hidden_blocks:
                hidden[i] = x
        x = F.rms_norm(x, C, self.final_norm, self.eps)
        hidden[self.num_layers - 1] = x
        logits = torch.mm(x, self.head).view(B, W, -1)
        if not hidden_blocks:
            return logits, None
        return logits, torch.cat([hidden[i] for i in hidden_blocks], dim=-1).view(B, W, -1)


def plan_static_shapes(verifier, drafter_lm, capacity: int, block: int) -> None:
    """Tell compiled models the shapes of a generate call: the verifier steps 1 token (AR) or `block`
    (N + 1) at a time, an LM drafter 1 or 2 (its catch-up token and the last one); both caches hold
    `capacity` slots. Models that are not compiled are left alone."""
    plans = {}  # one plan per model: a model drafting for itself steps all of these widths
    for lm, width in ((verifier, block), (drafter_lm, 2)):
        fast = getattr(lm, "fast", None)
        if isinstance(fast, CompiledLlama):
            plans.setdefault(id(fast), (fast, set()))[1].add(width)
    for fast, widths in plans.values():
        fast.plan(capacity, tuple(widths))

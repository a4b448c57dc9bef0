"""An MTP / EAGLE-style drafter head: drafts from the verifier's own hidden states.

EAGLE-1 shape. Entry k of a sequence is (f_{k-1}, E[t_k]): the verifier's last hidden state (after
its final norm, where its LM head W applies) of the token before t_k, and t_k's embedding in the
verifier's own embedding E. A linear projection of the pair, ONE decoder layer (causal attention
over the entries so far, RoPE, SwiGLU MLP) and an RMS norm give g_k, a feature in the verifier's
space: q = softmax(g_k W^T) drafts t_{k+1}, and within a round g_k stands in for the verifier's
f_k in the next entry (drafting autoregressively on its own outputs). E and W are the verifier's,
read at load time, so only the head's own weights are stored (492k for the built-in verifier).

Fused features (`HeadConfig.feature_layers`, EAGLE-3): the head may read several verifier blocks (a low,
a middle and the last); their hidden states, each RMS-normed, are mapped by one linear layer (`fuse`,
starting as the last block alone) to the feature f of the entries the verifier's states make. Within a
round g_k still stands in for f, so a drafted token costs what it costs without fusion. Measured on the
built-in verifier (1, 3, -1): no gain in greedy tau over the last block alone (docs/models.md, "Training a drafter").

Rollback: the head's cache keeps only entries made from the verifier's features; after a verify
step the accepted drafts' entries are re-fed with the verifier's features of that block (its
guesses are dropped), so the state equals that of a fresh run on the accepted prefix (tested).

Inference (`HeadLayers`): the head's decoder layer is a Llama layer, so drafting runs it through FastLlama's layer
step (`models.fast_llama.DecoderLayers`: a KV buffer per layer with a length pointer, on a float32 CPU one native
call each for RMSNorm, RoPE with the cache write, and attention), fed by a `Stream` (the per-row mask in a buffer,
none while every slot is real, as at batch 1): a draft step copies nothing of the past, dropping the guesses is a
pointer move, and a round reads nothing back from the device beyond the engine's `longest`. `MTPHead.forward` (the
training path) is the same math in plain torch ops; the drafter's logits equal it within float32 rounding (tested).

LM head: the verifier's full one, or a truncated vocabulary (FR-Spec; `HeadConfig.draft_vocab` = K):
the K tokens most frequent in the verifier's own training answers, whose ids are stored with the
weights (their rows still come from the verifier at load time); q is exactly zero outside them, so
strict stays lossless (a token the head cannot propose is reached through the residual). The
built-in `drafter-mtp` keeps the full head: on its verifier (vocab 714, hidden 128) the LM-head
matmul is ~12 us of a ~0.3 ms draft step (~4%, per-op overhead bound). `smollm2-drafter` truncates:
SmolLM2's 49152 x 576 head costs more than the decoder layer itself; see its config.json for the
measured cost and coverage behind K.

Training: `relaxspec.training.mtp` (self-distillation on the verifier's own answers).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from relaxspec.drafters.base import Drafter, Proposal
from relaxspec.models.family import BUILTIN_HEADS, KIND, head_directory, is_mtp  # noqa: F401 - a head's file format
from relaxspec.models.device import inference
from relaxspec.models.fast_llama import DecoderLayers
from relaxspec.models.gguf import gguf_fingerprint
from relaxspec.models.hf import CausalLM
from relaxspec.models.quant import (Linear, check_format, convert_linears, dequantize_int4, int4_problem,
                                    quantize_int4)
from relaxspec.models.stream import Stream


@dataclass(frozen=True)
class HeadConfig:
    hidden: int  # the verifier's hidden size
    heads: int = 4
    ffn: int = 512
    layers: int = 1  # decoder layers (EAGLE: one)
    eps: float = 1e-6
    rope_theta: float = 10000.0
    draft_vocab: int = 0  # K > 0: q over the K token ids in the head's `draft_vocab` buffer only; 0: full vocabulary
    # The verifier blocks the head reads, the last (-1, after the final norm) last: (-1,) is EAGLE-1; several
    # are fused into one feature (EAGLE-3: a low, a middle and the top block).
    feature_layers: tuple[int, ...] = (-1,)

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(self.feature_layers))  # a list from JSON or the CLI
        if not self.feature_layers or self.feature_layers[-1] != -1:
            raise ValueError(f"feature_layers must end with -1 (the verifier's last hidden state, the space the "
                             f"head drafts in), got {list(self.feature_layers)}")


_MASKED = -1e30  # additive mask: finite, so a query with no visible key stays NaN-free


class _DecoderLayer(torch.nn.Module):
    """Pre-norm causal self-attention (RoPE) + SwiGLU MLP, with an explicit KV cache."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        self.attn_norm = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.qkv = torch.nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)
        self.o = torch.nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.mlp_norm = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.gate_up = torch.nn.Linear(cfg.hidden, 2 * cfg.ffn, bias=False)
        self.down = torch.nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x, rotation, bias, kv):
        # Functional calls on the weights: a draft step is per-op overhead bound, module calls add up.
        B, T, H = x.shape
        heads, eps = self.cfg.heads, self.cfg.eps
        qkv = _apply(self.qkv, F.rms_norm(x, (H,), self.attn_norm, eps)).view(B, T, 3 * heads, H // heads)
        qk = _rotate(qkv[:, :, :2 * heads], rotation).transpose(1, 2)  # q and k in one rotation
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, :, 2 * heads:].transpose(1, 2)
        if kv is not None:
            k, v = torch.cat([kv[0], k], dim=2), torch.cat([kv[1], v], dim=2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + _apply(self.o, o.transpose(1, 2).reshape(B, T, H))
        gate, up = _apply(self.gate_up, F.rms_norm(x, (H,), self.mlp_norm, eps)).chunk(2, dim=-1)
        return x + _apply(self.down, F.silu(gate) * up), (k, v)


def _apply(linear, x):
    """x @ W^T of an nn.Linear (functionally), or of a FormatLinear (a weight stored in a format, models/quant.py)."""
    return F.linear(x, linear.weight) if isinstance(linear, torch.nn.Linear) else linear.forward(x)


def _inv_freq(cfg: HeadConfig, device: torch.device) -> torch.Tensor:
    """RoPE's frequencies [D/2] (float32) of a head of dimension D = hidden / heads."""
    head_dim = cfg.hidden // cfg.heads
    return 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)


def _rotate(x, rotation):
    """RoPE on x [B, T, heads, D] with rotation (cos, sin) [B, T, 1, D/2] (half-split pairs)."""
    cos, sin = rotation
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class MTPHead(torch.nn.Module):
    """Entry k of a sequence is (f_{k-1}, E[t_k]): the feature of the token before t_k and t_k's
    embedding. Its output g_k is a feature in the verifier's final space: g_k W^T predicts t_{k+1},
    and g_k stands in for f_k in the next entry while drafting."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        if len(cfg.feature_layers) > 1:  # EAGLE-3 fusion; it starts as the top block alone (EAGLE-1)
            self.fuse = torch.nn.Linear(len(cfg.feature_layers) * cfg.hidden, cfg.hidden, bias=False)
            with torch.no_grad():
                self.fuse.weight.zero_()[:, -cfg.hidden:] = torch.eye(cfg.hidden)
        self.norm_feature = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.norm_embed = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.fc = torch.nn.Linear(2 * cfg.hidden, cfg.hidden, bias=False)
        self.layers = torch.nn.ModuleList(_DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm_out = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.register_buffer("inv_freq", _inv_freq(cfg, torch.device("cpu")), persistent=False)
        if cfg.draft_vocab:  # the kept token ids (stored with the weights; their LM-head rows are the verifier's)
            self.register_buffer("draft_vocab", torch.zeros(cfg.draft_vocab, dtype=torch.long))

    def _rotation(self, positions, dtype, needed: int):
        """(cos, sin) [B, T, 1, D/2] of the positions (all below `needed`, a bound the caller knows on the host:
        reading positions.max() would be a device sync per draft step), from a table grown on demand (the same
        values as computing them: a table row is cos / sin of position * inv_freq)."""
        table = getattr(self, "_table", None)
        if table is None or table[0].shape[0] < needed or table[0].dtype != dtype:
            angles = torch.arange(max(2 * needed, 256), device=positions.device, dtype=dtype)[:, None] * self.inv_freq
            table = self._table = (angles.cos()[:, None], angles.sin()[:, None])
        return table[0][positions], table[1][positions]

    def verifier_features(self, hidden):
        """The head's input feature [..., H] for the verifier's hidden states [..., k H] of `feature_layers`:
        the last block's as it is, or several fused (each block's state RMS-normed, one linear map)."""
        if len(self.cfg.feature_layers) == 1:
            return hidden
        H = self.cfg.hidden
        return F.linear(F.rms_norm(hidden.unflatten(-1, (-1, H)), (H,), None, self.cfg.eps).flatten(-2),
                        self.fuse.weight)

    def entries(self, features, embeddings):
        """The input of the decoder layer for entries (features, embeddings) [B, T, H]."""
        H, eps = self.cfg.hidden, self.cfg.eps
        return F.linear(torch.cat([F.rms_norm(features, (H,), self.norm_feature, eps),
                                   F.rms_norm(embeddings, (H,), self.norm_embed, eps)], dim=-1), self.fc.weight)

    def forward(self, x, mask, positions, cache=None):
        """x [B, T, H]: `entries` of T new entries at `positions` [B, T]; mask [B, L] says which of
        the L = past + T entries are real; cache: the past's keys and values per layer (None: no past).
        Returns the output features [B, T, H] and the cache extended by the new entries."""
        H, eps = self.cfg.hidden, self.cfg.eps
        T, L = x.shape[1], mask.shape[1]
        rotation = self._rotation(positions, x.dtype, L)  # (a row's position counts its real entries before: < L)
        visible = mask[:, None, None, :].bool()
        if T > 1:  # (one new entry sees every real one: no causal part)
            visible = visible & (torch.arange(L, device=x.device) <= L - T + torch.arange(T, device=x.device)[:, None])
        bias = torch.where(visible, 0.0, _MASKED).to(x.dtype)
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer.forward(x, rotation, bias, None if cache is None else cache[i])
            new_cache.append(kv)
        return F.rms_norm(x, (H,), self.norm_out, eps), new_cache


# ---------------------------------------------------------------- the verifier it belongs to


def verifier_weights(verifier: CausalLM, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding [V, H], LM head [V, H]) of the verifier: what the head borrows; `rows` (an index tensor):
    the LM head's rows alone (a head's draft vocabulary: `scored_rows`), made without the others where the weight's
    format allows (`quant.Linear.dense`). A verifier loaded from a GGUF file with its own LM head keeps that head in
    FastLlama only (the transformers model's is empty, [0, H]): it is read back from there (float32; int4: the
    dequantized codes it multiplies by). One whose transformers model is not built yet (a GGUF file mapped from the
    weight cache) is read from FastLlama alone, as that model would give them (its embedding is FastLlama's table; a
    tied head, that table): nothing builds it."""
    fast = getattr(verifier, "fast", None)
    if "model" not in vars(verifier) and fast is not None:
        embed = fast.embed
        lm_head = embed if getattr(verifier.config, "tie_word_embeddings", False) else None
    else:
        embed, lm_head = verifier.model.get_input_embeddings().weight, verifier.model.get_output_embeddings().weight
        lm_head = None if lm_head.numel() == 0 and fast is not None else lm_head
    if lm_head is None:
        return embed, fast.lm_head.dense(rows)
    return embed, lm_head if rows is None else lm_head[rows.to(lm_head.device)]


def scored_rows(head: MTPHead) -> torch.Tensor | None:
    """The LM-head rows the head scores: its draft vocabulary's, or None (the whole LM head)."""
    return head.draft_vocab if head.cfg.draft_vocab else None


def head_rows(head: MTPHead, lm_head: torch.Tensor) -> torch.Tensor:
    """The rows of the verifier's whole LM head that the head scores (`scored_rows`)."""
    rows = scored_rows(head)
    return lm_head if rows is None else lm_head[rows.to(lm_head.device)]


def _model_class(verifier: CausalLM) -> str:
    """The name of the verifier's transformers model class, without building a model not built yet (the class
    transformers' auto mapping gives its config, as when it is built)."""
    if "model" in vars(verifier) or getattr(verifier, "build_model", None) is None:
        return type(verifier.model).__name__
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[verifier.config.model_type]


def verifier_fingerprint(verifier: CausalLM) -> str:
    """sha256 of the verifier's architecture (type, vocab, hidden size, layers) and of its embedding
    and LM head rounded to bfloat16 (the same whether it is loaded in float32, float16 or bfloat16)."""
    digest = hashlib.sha256(json.dumps([_model_class(verifier), verifier.vocab_size, verifier.config.hidden_size,
                                        verifier.num_layers]).encode())
    for weight in verifier_weights(verifier):
        digest.update(weight.detach().to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
    return digest.hexdigest()[:24]


# ---------------------------------------------------------------- drafting


TABLE_SLICE = 8192  # rows of the entry table made at once (HeadLayers)


class HeadLayers(DecoderLayers):
    """The head's inference path: its decoder layers run as FastLlama runs its own (`DecoderLayers`: a KV buffer
    per layer with a length pointer, the q/k rows interleaved for RoPE, on a float32 CPU one native call each for
    RMSNorm, RoPE with the cache write and attention), then its output norm. Its input is the head's entries
    (`entries`), so that a `Stream` feeds it as it feeds a causal LM: the per-row mask over the slots (a buffer
    grown by doubling, none while every slot is real), each row's next position, rollback as a pointer move.
    Same math as `MTPHead.forward` (tested)."""

    max_position_embeddings = None  # (read by Stream: RoPE positions are not capped)

    def __init__(self, head: MTPHead, embed: torch.Tensor, weight_format: str):
        cfg = head.cfg
        H, device = cfg.hidden, embed.device
        layers = [(layer.attn_norm, *layer.qkv.weight.split(H), layer.o.weight, layer.mlp_norm,
                   *layer.gate_up.weight.split(cfg.ffn), layer.down.weight) for layer in head.layers]
        super().__init__(layers, cfg.heads, cfg.heads, H // cfg.heads, cfg.eps, _inv_freq(cfg, device), 1.0, device,
                         embed.dtype, weight_format)
        self.norm_out = head.norm_out.detach().to(self.dtype)
        # `MTPHead.entries` split in two (same math): the embedding half a per-token table, the feature half one
        # matmul with its norm weight folded in (kept in float32 on a CPU, as the table), the table's row added to it.
        # On a CPU the table's rows are made when a token first needs one (`filled`): the whole table of a 1.5B's
        # 152k tokens is 0.93 GB and 3.8 s of CPU time, a generation reads a few hundred rows, and pages never
        # written take no memory. Elsewhere it is made whole here, so that a round reads nothing back. Rows are made
        # in slices, each normed in float32 (torch's RMSNorm of a bfloat16 [V, H] took 4.3 s on 2 CPU cores).
        with torch.no_grad():
            fc = head.fc.weight.detach()
            self.embed, self.embed_half, self.embed_norm = embed, fc[:, H:].t(), head.norm_embed.detach().float()
            self.entry_table = torch.empty((embed.shape[0], H), dtype=self.dtype, device=device)
            self.filled = torch.zeros(embed.shape[0], dtype=torch.bool, device=device) if device.type == "cpu" \
                else None
            if self.filled is None:
                self._fill_rows(torch.arange(embed.shape[0], device=device))
            self.feature_proj = Linear(fc[:, :H] * head.norm_feature,
                                       "float32" if self.dtype == torch.float32 else self.weight_format)
        self.unit = torch.ones(H, dtype=self.dtype, device=device)  # the feature norm's weight (folded in above)

    def _fill_rows(self, tokens: torch.Tensor) -> None:
        """Make the entry table's rows of `tokens` (distinct ids), TABLE_SLICE at a time."""
        H = self.embed.shape[1]
        for start in range(0, tokens.shape[0], TABLE_SLICE):
            ids = tokens[start:start + TABLE_SLICE]
            rows = F.rms_norm(self.embed[ids].float(), (H,), self.embed_norm, self.eps).to(self.embed_half.dtype)
            self.entry_table[ids] = (rows @ self.embed_half).to(self.dtype)

    def entries(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The entries [B, T, H] of (features [B, T, H] in the verifier's final space, tokens [B, T])."""
        B, T, H = features.shape
        tokens = tokens.reshape(-1)
        if self.filled is not None:
            new = tokens.unique()
            new = new[~self.filled[new]]
            if new.numel():
                with torch.no_grad():
                    self._fill_rows(new)
                self.filled[new] = True
        x = self._rms_norm(features.reshape(B * T, H).to(self.dtype), self.unit)
        return self.feature_proj(x, residual=self.entry_table.index_select(0, tokens)).view(B, T, H)

    def forward(self, entries, cache, attention_mask, position_ids, hidden_layer=None, logits=True):
        """The output features [B, T, H] of entries [B, T, H] (a Stream's call; no hidden states: None). It has no LM
        head: the features come back whatever `logits` says."""
        B, T, H = entries.shape
        x, _ = self.run_layers(entries.view(B * T, H), cache, attention_mask, position_ids)
        return self._rms_norm(x, self.norm_out).view(B, T, H), None


class MTPDrafter(Drafter):
    """Drafting state per row: the head's cache over the entries of the accepted prefix (all made with
    the verifier's own features; a `Stream` over `HeadLayers`), and the entries still to feed: those of the
    tokens accepted last round (with their true features, replacing the head's guesses) and the one of `last`.
    A round allocates nothing that grows with the context and reads nothing back from the device."""

    kind = KIND

    def __init__(self, head: MTPHead, verifier: CausalLM, name: str = "mtp"):
        self.head, self.name = head.eval(), name
        self.hidden_layers = head.cfg.feature_layers
        embed, lm_head = verifier_weights(verifier, scored_rows(head))
        self.embed = embed.detach()
        # x @ W^T with a row-major right operand; a truncated head's W is the rows of its draft vocabulary.
        # Stored in the verifier's weight format, as are the head's layers (models/quant.py).
        self.lm_head = Linear(lm_head.detach(), verifier.weight_format)
        self.vocab_size = verifier.vocab_size
        self.draft_vocab = head.draft_vocab.to(self.embed.device) if head.cfg.draft_vocab else None
        self.head.to(device=self.embed.device, dtype=self.embed.dtype)
        what = f"MTP drafter {name!r}"
        check_format(self.head.layers, verifier.weight_format, what)  # (one line, before any copy)
        self.fast = HeadLayers(self.head, self.embed, verifier.weight_format)  # what drafts
        # The head module keeps its layers too, in the same format, for `MTPHead.forward` on the drafter's head
        # (teacher-forced measurements: benchmarks/mtp_agreement.py); a small second copy.
        convert_linears(self.head.layers, verifier.weight_format, what)
        self.stream = None

    @inference
    def prefill(self, ids, mask, hidden=None) -> None:
        B, H = ids.shape[0], self.embed.shape[1]
        self.stream = Stream(self.fast)
        if hidden is not None:
            hidden = self.head.verifier_features(hidden.to(self.embed.dtype))
        if hidden is not None and ids.shape[1] >= 2:  # entries (f_{k-1}, t_k) of the prompt
            self.stream.prefill(self.fast.entries(hidden[:, :-1], ids[:, 1:]), mask[:, 1:] * mask[:, :-1])
        else:
            self.stream.prefill(ids[:, :0], mask[:, :0])  # no entry yet
        if hidden is None or ids.shape[1] == 0:  # a one-token prompt: no feature before `last`
            self.pending = torch.zeros((B, 1, H), dtype=self.embed.dtype, device=ids.device)
        else:
            self.pending = hidden[:, -1:] * mask[:, -1:, None]
        self.pending_tokens = ids[:, :0]  # the tokens of the pending entries before `last`'s
        self.pending_valid = None  # [B, width] which pending entries are real (None: all)

    @inference
    def propose(self, last, n, extra, sample, stop=None) -> Proposal:
        tokens_in = last[:, None]
        if self.pending_tokens.shape[1]:  # the accepted drafts' tokens come before it
            tokens_in = torch.cat([self.pending_tokens, tokens_in], dim=1)
        feature = self.stream.feed(self.fast.entries(self.pending, tokens_in), self.pending_valid)[0][:, -1]
        tokens, logits_rows, probs = [], [], []
        i = 0
        while i < n + extra:
            if i:  # the head's own feature stands in for the verifier's
                feature = self.stream.feed(self.fast.entries(feature[:, None], token[:, None]))[0][:, 0]
            logits = self._logits(feature)
            logits_rows.append(logits)
            if i < n:
                token, p = sample(logits, i)
                tokens.append(token)
                probs.append(p)
                if stop is not None and i + 1 < n and stop(i, logits, token, p):
                    n = i + 1  # every row has stopped drafting
            i += 1
        self._drafts, self._guessed = torch.stack(tokens, dim=1), n - 1 + extra
        return Proposal(self._drafts, torch.stack(logits_rows, dim=1),
                        None if probs[0] is None else torch.stack(probs, dim=1), forwards=n + extra)

    def _logits(self, feature):
        """Float32 logits [B, V] of features [B, H]; -inf outside a truncated head's draft vocabulary,
        so that q is exactly zero there (strict sampling stays lossless: q only ever proposes)."""
        logits = self.lm_head(feature).float()
        if self.draft_vocab is None:
            return logits
        full = torch.full((logits.shape[0], self.vocab_size), float("-inf"), device=logits.device)
        return full.index_copy_(1, self.draft_vocab, logits)

    @inference
    def rollback(self, accepted, hidden=None, longest=None, rounds=None) -> None:
        # Drop the entries made from the head's guesses (a pointer move); queue the accepted drafts' entries with
        # the verifier's features (hidden [B, n+1, k H] of [last, x_1..x_n]) plus the next `last`'s entry,
        # right-aligned so every row's entry for `last` is in the final column.
        hidden = self.head.verifier_features(hidden.to(self.embed.dtype))
        if self._guessed:
            self.stream.invalidate_tail(None, self._guessed, longest=0)
        if longest is not None and accepted.shape[0] == 1:  # one row: entries 0..longest, every one real
            self.pending, self.pending_tokens, self.pending_valid = (
                hidden[:, :longest + 1], self._drafts[:, :longest], None)
            return
        accepted = accepted.to(self.stream.device)
        width = (int(accepted.max()) if longest is None else longest) + 1  # (the engine's host copy: no sync)
        entry = torch.arange(width, device=accepted.device)[None, :] - (width - 1 - accepted)[:, None]
        self.pending_valid = (entry >= 0).long()
        entry = entry.clamp(min=0)  # entry e: (feature of [last, x_1..][e], x_{e+1}); the last one's token comes later
        self.pending = hidden.gather(1, entry[..., None].expand(-1, -1, hidden.shape[-1]))
        self.pending_tokens = self._drafts.gather(1, entry[:, :-1])

    @inference
    def select(self, rows) -> None:
        rows = rows.to(self.stream.device)
        self.stream.select(rows)
        self.pending, self.pending_tokens = self.pending[rows], self.pending_tokens[rows]
        if self.pending_valid is not None:
            self.pending_valid = self.pending_valid[rows]


# ---------------------------------------------------------------- files


SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "int4": torch.float16}
INT4_CODES, INT4_SCALES = ".int4", ".scale_zero"  # a matrix saved in int4: its packed codes and its (scale, zero)


def _saved_tensors(head: MTPHead, dtype: str) -> dict[str, torch.Tensor]:
    """The head's tensors as saved: in `dtype` (a truncated head's token ids as int64); "int4" stores each matrix
    whose rows split into groups of 32 as the int4 runtime format holds it (models/quant.quantize_int4: min-max
    4-bit codes, two to a byte, and a bfloat16 (scale, zero) per group), the rest (norms) in float16."""
    tensors = {}
    for key, value in head.state_dict().items():
        value = value.detach().to("cpu")
        if key == "draft_vocab":
            tensors[key] = value
        elif dtype == "int4" and value.dim() == 2 and int4_problem(value.shape) is None:
            codes, scale_zero = quantize_int4(value)
            tensors[key + INT4_CODES] = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8)
            tensors[key + INT4_SCALES] = scale_zero
        else:
            tensors[key] = value.to(SAVE_DTYPES[dtype])
    return {k: v.contiguous() for k, v in tensors.items()}


def _loaded_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The head's state dict out of saved tensors (int4 matrices dequantized to float32: a verifier loaded in int4
    quantizes them back to the same codes)."""
    state = {}
    for key, value in tensors.items():
        if key.endswith(INT4_CODES):
            name = key.removesuffix(INT4_CODES)
            codes = torch.stack([value & 15, value >> 4], dim=-1).reshape(value.shape[0], -1)
            state[name] = dequantize_int4(codes, tensors[name + INT4_SCALES])
        elif not key.endswith(INT4_SCALES):
            state[key] = value
    return state


def save_head(head: MTPHead, verifier: CausalLM, out: Path, training: dict, dtype: str = "float32") -> None:
    """config.json + model.safetensors (weights in `dtype`, `_saved_tensors`)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    lm_head = ("the verifier's (full vocabulary)" if not head.cfg.draft_vocab else
               f"the verifier's rows of the {head.cfg.draft_vocab} tokens most frequent in its training answers "
               f"(ids stored with the weights as draft_vocab; q is zero outside them)")
    config = {"relaxspec_kind": KIND, **asdict(head.cfg),
              "params": sum(p.numel() for p in head.parameters()), "dtype": dtype,
              "verifier": {"name": verifier.name, "fingerprint": verifier_fingerprint(verifier),
                           "file": gguf_fingerprint(verifier), "vocab_size": verifier.vocab_size},
              "lm_head": lm_head, "training": training}
    save_file(_saved_tensors(head, dtype), out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def trained_for(verifier: CausalLM, expected: dict) -> bool:
    """Whether `verifier` is the one a head's config names: the same GGUF file, whatever --dtype it runs in (its
    "file"), or the same embedding and LM head (`verifier_fingerprint`: an int4 copy's re-quantized LM head differs
    from the file's own)."""
    if expected.get("file") and expected["file"] == gguf_fingerprint(verifier):
        return True
    return verifier_fingerprint(verifier) == expected["fingerprint"]


def read_head(name: str | Path) -> tuple[Path, dict, dict[str, torch.Tensor]]:
    """(directory, config, state dict) of the head saved under `name` (a directory or a registry name)."""
    from safetensors.torch import load_file

    path = head_directory(name)
    config = json.loads((path / "config.json").read_text())
    return path, config, _loaded_tensors(load_file(path / "model.safetensors"))


def load_mtp_drafter(name: str | Path, verifier: CausalLM) -> MTPDrafter:
    """The head saved under `name`, for `verifier`: ValueError if it was trained for another one."""
    _, config, state = read_head(name)
    expected = config["verifier"]
    if not trained_for(verifier, expected):
        raise ValueError(f"MTP drafter {str(name)!r} was trained for verifier {expected['name']!r} (fingerprint "
                         f"{expected['fingerprint']}); verifier {verifier.name!r} is a different model "
                         f"(fingerprint {verifier_fingerprint(verifier)}): train a head for it with "
                         f"`relaxspec drafter train --verifier {verifier.name} --kind mtp`")
    head = MTPHead(HeadConfig(**{k: config[k] for k in HeadConfig.__dataclass_fields__ if k in config}))
    head.load_state_dict(state)
    return MTPDrafter(head, verifier, name=str(name))

"""A model's cache with its per-row attention mask: how the engine feeds the verifier, and an LM drafter
its own model, one block of tokens at a time (left-padded rows, rollback, rows leaving the batch)."""

from __future__ import annotations

import torch

from relaxspec.models.hf import CausalLM, crop_cache


def model_device(lm: CausalLM) -> torch.device:
    """The device the model's weights live on (every tensor the engine makes goes there)."""
    device = getattr(lm, "device", None)
    return device if isinstance(device, torch.device) else next(lm.model.parameters()).device


def left_pad(encoded: list[list[int]], tokenizer, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) [B, T] of encoded prompts, each row padded on the left to the longest (mask 0 there)."""
    width = max(map(len, encoded))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = torch.device("cpu") if device is None else device
    rows = [[pad] * (width - len(row)) + row for row in encoded]
    ids = torch.tensor(rows, dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in encoded], dtype=torch.long,
                        device=device)
    return ids, mask


class Stream:
    """One model's cache plus the per-row attention mask over its slots (a row's real slots also
    count its positions, so there is no separate counter to keep in step)."""

    def __init__(self, lm: CausalLM, device: torch.device | None = None):
        self.lm = lm
        self.device = model_device(lm) if device is None else device
        self.cache = lm.new_cache()
        self.mask = None  # [B, L] 1 where the cache slot belongs to the row's sequence

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, hidden_layer=None):
        """Returns the hidden state asked for ([B, T, H]; None if not asked or T == 0)."""
        self.mask = torch.zeros((ids.shape[0], 0), dtype=torch.long, device=self.device)
        if ids.shape[1]:
            return self.feed(ids, mask, hidden_layer=hidden_layer)[1]
        return None

    def feed(self, ids: torch.Tensor, valid: torch.Tensor | None = None, hidden_layer=None):
        """Append ids [B, T]; `valid` [B, T] says which slots are real (others are masked out for good;
        None: all are). Returns float32 logits [B, T, V] and the hidden state asked for (or None)."""
        # A row's next position is its number of real slots so far.
        start = self.mask.sum(dim=1, keepdim=True)
        if valid is None:
            positions = start + torch.arange(ids.shape[1], device=self.device)
            valid = torch.ones_like(ids)
        else:
            positions = start + valid.cumsum(dim=1) - valid  # real slots get consecutive positions
        self.mask = torch.cat([self.mask, valid], dim=1)
        logits, hidden = self.lm.forward(ids, self.cache, self.mask, positions, hidden_layer=hidden_layer)
        return logits.float(), hidden  # rules see float32 whatever the model's dtype

    def invalidate_tail(self, keep: torch.Tensor, width: int) -> None:
        """Of the last `width` slots, keep only the first keep[b] per row (rollback), then crop the
        tail columns that no row uses any more."""
        self.mask[:, -width:] *= torch.arange(width, device=self.device) < keep[:, None]
        length = self.mask.shape[1] - width + int(keep.max())
        if length < self.mask.shape[1]:
            crop_cache(self.cache, length)
            self.mask = self.mask[:, :length]

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]

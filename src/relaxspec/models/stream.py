"""A model's cache with its per-row attention mask: how the engine feeds the verifier, and an LM drafter
its own model, one block of tokens at a time (left-padded rows, rollback, rows leaving the batch)."""

from __future__ import annotations

import torch

from relaxspec.models.hf import CausalLM, can_gather_cache, crop_cache, gather_cache
from relaxspec.tensors import cached_arange


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
    """One model's cache plus the per-row attention mask over its slots and each row's next position.

    Rows of a batch accept different numbers of drafts: every row's cache grows by the same block, the
    slots a row rejects are masked out (rollback is a mask update plus a crop of the columns no row uses),
    and each row keeps its own position counter. The slots one row has dead while another accepted more
    are dropped by compaction once they exceed a bound (`slack`), so a row that accepts little attends
    over about the longest row's real length instead of the sum of every round's best acceptance. The
    mask lives in a buffer grown by doubling, nothing is reallocated per round; its columns past the cache hold
    1, so a feed of real slots writes nothing and a rollback of real slots only counts (rollback and compaction
    put the 1s back in the columns they free)."""

    slack = 32  # dead slots tolerated in the longest row's span before compacting (checked every `slack` slots)

    def __init__(self, lm: CausalLM, device: torch.device | None = None):
        self.lm = lm
        self.device = model_device(lm) if device is None else device
        self.cache = lm.new_cache()
        self.length = 0  # cache slots in use
        # [B, capacity]: 1 where the cache slot belongs to the row's sequence. Every column from `_ones_from` (a host
        # int <= length) on is 1 in every row, so a feed of real slots writes nothing into it; 0: no slot is masked.
        self._mask = None
        self._ones_from = 0
        self.next_position = None  # [B, 1] the position of each row's next real slot
        self._checked = 0  # the length at which dead slots were last counted
        self.compactions = 0

    @property
    def dense(self) -> bool:
        """No slot in use is masked (known on the host): the model is told so (attention_mask None), no mask read."""
        return self._ones_from == 0

    @property
    def mask(self) -> torch.Tensor:
        """[B, length] 1 where the cache slot belongs to the row's sequence."""
        return self._mask.narrow(1, 0, self.length)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, hidden_layer=None):
        """Returns the hidden state asked for ([B, T, H]; None if not asked or T == 0)."""
        self._mask = torch.ones((ids.shape[0], max(64, 2 * ids.shape[1])), dtype=torch.long, device=self.device)
        self.length = self._checked = self._ones_from = 0
        self.next_position = torch.zeros((ids.shape[0], 1), dtype=torch.long, device=self.device)
        if ids.shape[1]:
            hidden = self.feed(ids, mask, hidden_layer=hidden_layer, logits=False)[1]  # (no one reads its logits)
            if bool(mask.all()):  # (one look at the prompts' padding) every column holds 1
                self._ones_from = 0
            return hidden
        return None

    def feed(self, ids: torch.Tensor, valid: torch.Tensor | None = None, hidden_layer=None, logits: bool = True):
        """Append ids [B, T]; `valid` [B, T] says which slots are real (others are masked out for good;
        None: all are). Returns float32 logits [B, T, V] (with `logits` False: None, the LM head skipped) and the
        hidden state asked for (or None). (The model may take other inputs [B, T, ...] and return its own outputs:
        an MTP drafter head's entries and features.)"""
        T = ids.shape[1]
        if valid is None:  # consecutive positions (one token: the row's next position itself, no new tensor)
            positions = self.next_position if T == 1 else self.next_position + cached_arange(T, self.device)
            self.next_position = self.next_position + T
        else:
            positions = self.next_position + valid.cumsum(dim=1) - valid  # real slots get consecutive positions
            self.next_position = self.next_position + valid.sum(dim=1, keepdim=True)
        # A row's padding columns past its room (never kept) stay in range; no position exceeds the slots in use
        # (length + T - 1), so the clamp is skipped while those fit.
        if self.lm.max_position_embeddings and self.length + T > self.lm.max_position_embeddings:
            positions = positions.clamp(max=self.lm.max_position_embeddings - 1)
        if self.length + T > self._mask.shape[1]:
            grown = self._mask.new_ones((self._mask.shape[0], 2 * (self.length + T)))
            grown[:, :self.length] = self.mask
            self._mask = grown
        if valid is not None:  # (real slots need no write: their columns hold 1 already)
            self._mask.narrow(1, self.length, T).copy_(valid)
            self._ones_from = self.length + T
        self.length += T
        return self.lm.forward(ids, self.cache, None if self.dense else self.mask, positions,
                               hidden_layer=hidden_layer, logits=logits)

    def invalidate_tail(self, keep: torch.Tensor | None, width: int, longest: int | None = None) -> None:
        """Of the last `width` slots, keep only the first keep[b] per row (rollback), then crop the
        tail columns that no row uses any more (`longest`: keep.max() when the caller knows it on the host;
        keep None: every row keeps `longest`, e.g. a batch of one row), and compact when dead slots exceed
        the bound."""
        start = self.length - width
        if longest is None:
            longest = int(keep.max())
        if self._ones_from <= start:  # every tail slot is real: row b drops width - keep[b] of them
            if keep is None:
                if width > longest:
                    self.next_position = self.next_position - (width - longest)
            else:
                keep = keep[:, None]
                self.next_position = self.next_position + (keep - width)
                self._mask.narrow(1, start, longest).mul_(cached_arange(longest, self.device) < keep)
                self._ones_from = start + longest
        else:  # some tail slots were fed masked: count the real ones each row drops
            tail = self._mask.narrow(1, start, width)
            before = tail.sum(dim=1, keepdim=True)
            if keep is None:
                tail.narrow(1, longest, width - longest).zero_()
            else:
                tail.mul_(cached_arange(width, self.device) < keep[:, None])
            self.next_position = self.next_position - (before - tail.sum(dim=1, keepdim=True))
            self._ones_from = self.length
        length = start + longest
        if length < self.length:
            crop_cache(self.cache, length)
            if self._ones_from > length:  # the cropped columns hold 1 again
                self._mask[:, length:self._ones_from].fill_(1)
                self._ones_from = length
            self.length = length
        if self.length - self._checked >= self.slack:
            self.compact()

    def compact(self, slack: int | None = None) -> None:
        """Drop dead slots (rolled back, or padding) when the longest row's real slots fall more than `slack`
        short of the cache length: each row's real slots move, in order, to the end of a span as long as the
        longest row's. Positions are unchanged (they were applied when the slots were written)."""
        slack = self.slack if slack is None else slack
        self._checked = self.length
        if self.dense:  # no slot in use is masked: nothing to drop, and no device read to find it out
            return
        valid = self.mask
        longest = int(valid.sum(dim=1).max())
        if self.length - longest <= slack or not can_gather_cache(self.cache):
            return
        # A stable sort of 0/1 puts each row's dead slots first, then its real ones in order; the last
        # `longest` columns hold every real slot.
        index = torch.argsort(valid, dim=1, stable=True)[:, self.length - longest:]
        gather_cache(self.cache, index)
        self._mask[:, :longest] = valid.gather(1, index)
        self._mask[:, longest:self.length].fill_(1)
        self.length = self._checked = longest
        self._ones_from = 0 if self._mask.shape[0] == 1 else longest  # a lone row keeps only its real slots
        self.compactions += 1

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self._mask, self.next_position = self._mask[rows], self.next_position[rows]

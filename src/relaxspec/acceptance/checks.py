"""The verify step's input checks (`verify` checks every argument here; docs/verify.md states the contract): a
block's shapes, dtypes, devices and ranges, draft_probs' mass, padding (-1 drafts, num_drafts), rows of -inf logits
the step may not read, the `relax` mask."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relaxspec.acceptance.processing import cdf_dtype, check_logits
from relaxspec.tensors import cached_arange

# A draft id that stands for "no draft here" in a padded batch (vLLM's PLACEHOLDER_TOKEN_ID): `verify` reads a row's
# first -1 as the end of its drafts, as num_drafts says.
PLACEHOLDER = -1
# How far from 1 a proposed row of draft_probs may sum: float32 rounding of a softmax over any vocabulary is far below
# 1e-3 (which moves min(1, p(x)/q(x)) by 0.1% at most); a row missing more mass is not the drafter's distribution (a
# row cut by top-k and not renormalised, logits, a slice). Half / bfloat16 rows round each value by up to 2^-9.
DRAFT_PROBS_TOLERANCE = 1e-3
DRAFT_PROBS_TOLERANCE_16BIT = 1e-2


@dataclass
class _Block:
    """What `_check_block` found: N, the rows of target_logits / draft_logits where every logit is -inf (bool [B, rows],
    None for none; `verify` allows those it does not read) and whether a draft id is -1 (`verify` only)."""

    num_drafts: int
    masked_target: torch.Tensor | None = None
    masked_draft: torch.Tensor | None = None
    placeholder: bool = False


def check_block(target_logits, draft_logits, draft_tokens, draft_probs=None) -> int:
    """N, the number of drafts of a well-formed verify block; ValueError naming what is wrong otherwise (every row
    is read: no row of -inf logits, no -1 draft, every row of draft_probs a distribution)."""
    N = _check_block(target_logits, draft_logits, draft_tokens, draft_probs, direct=False).num_drafts
    if draft_probs is not None:
        _check_draft_probs_mass(draft_probs, None)
    return N


def _check_block(target_logits, draft_logits, draft_tokens, draft_probs, direct: bool) -> _Block:
    """check_block's checks; direct (`verify`): rows of -inf logits and -1 drafts are returned, not refused, and
    draft_probs' mass is left to `_check_draft_probs_mass` (which reads only the rows a draft is proposed at)."""
    for name, tensor in (("target_logits", target_logits), ("draft_logits", draft_logits),
                         ("draft_tokens", draft_tokens), ("draft_probs", draft_probs)):
        if isinstance(tensor, torch.Tensor) and tensor.is_meta:
            raise ValueError(f"{name} is on the meta device: a shape without values, nothing to verify (give tensors "
                             "on a CPU or a GPU)")
    masked_target = check_logits("target_logits", target_logits, masked_rows=direct)
    if not isinstance(draft_logits, torch.Tensor):
        raise ValueError(f"draft_logits must be a torch.Tensor, got {type(draft_logits).__name__}")
    if target_logits.dim() != 3:
        raise ValueError(
            f"target_logits must be 3-D [B, N+1, V], got shape {list(target_logits.shape)}"
        )
    B, n_plus_1, V = target_logits.shape
    N = n_plus_1 - 1
    if N < 1:
        raise ValueError(
            f"target_logits must cover N >= 1 draft positions plus the bonus one ([B, N+1, V]), "
            f"got shape {list(target_logits.shape)}"
        )
    if draft_logits.dim() != 3:
        raise ValueError(
            f"draft_logits must be 3-D [B, N, V] or [B, N+1, V], got shape {list(draft_logits.shape)}"
        )
    if draft_logits.shape[-1] != V:
        raise ValueError(
            f"vocabulary mismatch: target_logits has V={V}, draft_logits has V={draft_logits.shape[-1]}"
        )
    if draft_logits.shape[0] != B or draft_logits.shape[1] not in (N, N + 1):
        raise ValueError(
            f"draft_logits must have shape [B, N, V] or [B, N+1, V] = [{B}, {N}(+1), {V}] to match "
            f"target_logits {list(target_logits.shape)}, got {list(draft_logits.shape)}"
        )
    masked_draft = check_logits("draft_logits", draft_logits, masked_rows=direct)
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in (torch.long, torch.int32):
        got = draft_tokens.dtype if isinstance(draft_tokens, torch.Tensor) else type(draft_tokens).__name__
        raise ValueError(f"draft_tokens must be an int64 or int32 tensor [B, N], got {got}")
    if tuple(draft_tokens.shape) != (B, N):
        raise ValueError(
            f"draft_tokens must have shape [B, N] = [{B}, {N}] to match target_logits "
            f"{list(target_logits.shape)}, got {list(draft_tokens.shape)}"
        )
    if draft_probs is not None and (not isinstance(draft_probs, torch.Tensor) or not draft_probs.is_floating_point()
                                    or tuple(draft_probs.shape) != (B, N, V)):
        got = (f"{draft_probs.dtype} {list(draft_probs.shape)}" if isinstance(draft_probs, torch.Tensor)
               else type(draft_probs).__name__)
        raise ValueError(f"draft_probs must be a floating-point tensor [B, N, V] = [{B}, {N}, {V}], got {got}")
    devices = {target_logits.device, draft_logits.device, draft_tokens.device}
    devices |= set() if draft_probs is None else {draft_probs.device}
    if len(devices) > 1:
        raise ValueError(f"target_logits, draft_logits, draft_tokens (and draft_probs) are on different devices: "
                         f"{devices}")
    lowest, highest = (int(v) for v in draft_tokens.aminmax())
    if highest >= V or lowest < (PLACEHOLDER if direct else 0):
        raise ValueError(f"draft_tokens must lie in [0, V) = [0, {V})"
                         + (", or be -1 (no draft: the row's drafts end at its first -1)" if direct else ""))
    if draft_probs is not None:
        if not bool(torch.isfinite(draft_probs).all()) or bool((draft_probs < 0).any()):
            raise ValueError("draft_probs must be probabilities: finite and >= 0 (got NaN, inf or a negative value)")
    return _Block(N, masked_target, masked_draft, placeholder=lowest == PLACEHOLDER)


def _check_draft_probs_mass(draft_probs: torch.Tensor, num_drafts: torch.Tensor | None) -> None:
    """Each row of draft_probs [B, N, V] a draft is proposed at (every row, or the first num_drafts[b] of row b) sums
    to 1 within DRAFT_PROBS_TOLERANCE; a ValueError naming the first that does not. Padding rows are not read."""
    tolerance = (DRAFT_PROBS_TOLERANCE_16BIT if draft_probs.dtype in (torch.float16, torch.bfloat16)
                 else DRAFT_PROBS_TOLERANCE)
    mass = draft_probs.sum(dim=-1, dtype=cdf_dtype(draft_probs.device))
    off = (mass - 1.0).abs() > tolerance
    if num_drafts is not None:
        off &= cached_arange(off.shape[1], off.device) < num_drafts.unsqueeze(1)
    if bool(off.any()):
        b, i = off.nonzero()[0].tolist()
        raise ValueError(f"draft_probs must be distributions: row [{b}, {i}] sums to {float(mass[b, i]):.6g}, not 1 "
                         f"(within {tolerance:g}); pass the drafter's processed probabilities (process_logits), "
                         f"renormalised after any top-k / top-p cut")


def _placeholder_rows(draft_tokens: torch.Tensor, num_drafts: torch.Tensor | None):
    """(draft_tokens with each -1 read as token 0, never proposed; num_drafts [B]: each row's drafts end at its first
    -1, or at num_drafts[b] if that comes first); a ValueError for a draft after a -1 in its row."""
    N = draft_tokens.shape[1]
    empty = draft_tokens == PLACEHOLDER
    if bool((empty.cumsum(dim=1).bool() & ~empty).any()):
        raise ValueError("draft_tokens: a -1 (no draft) must be followed by -1 only in its row "
                         "(the row's drafts end at its first -1; num_drafts says the same)")
    ends = torch.where(empty, cached_arange(N, draft_tokens.device), N).amin(dim=1)
    num_drafts = ends if num_drafts is None else torch.minimum(num_drafts, ends)
    return draft_tokens.clamp(min=0), num_drafts


def _without_masked_rows(logits: torch.Tensor, masked: torch.Tensor | None) -> torch.Tensor:
    """logits with each row where every logit is -inf set to 0 (any finite row would do: `verify` refuses the block
    after the step if the step may have read one)."""
    return logits if masked is None else logits.masked_fill(masked.unsqueeze(-1), 0.0)


def _check_masked_rows_unread(result, block: _Block, num_drafts, extra_draft_passes: int) -> None:
    """A ValueError if the step (its `VerifyResult`: `result`) may have read a row where every logit is -inf: position j
    of row b is reached unless a draft before it is rejected for sure (accept_prob 0) or j is past the row's bonus
    position (num_drafts[b]); there
    the verifier's row j is read, the drafter's row j if j is a draft position, or if it is the bonus position of a rule
    that reads the drafter's bonus-position row (extra_draft_passes)."""
    accept_prob = result.accept_prob
    B, N = accept_prob.shape
    ends = torch.full((B,), N, device=accept_prob.device) if num_drafts is None else num_drafts
    positions = cached_arange(N + 1, accept_prob.device)
    open_before = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=accept_prob.device),
                             (accept_prob > 0).cumprod(dim=1).bool()], dim=1)
    reached = open_before & (positions <= ends.unsqueeze(1))  # [B, N+1]
    draft_read = reached & (positions < ends.unsqueeze(1))
    if extra_draft_passes:
        draft_read |= reached & (positions == ends.unsqueeze(1))
    for name, masked, read in (("target_logits", block.masked_target, reached),
                               ("draft_logits", block.masked_draft, draft_read)):
        if masked is None:
            continue
        hit = masked & read[:, :masked.shape[1]]
        if bool(hit.any()):
            b, j = hit.nonzero()[0].tolist()
            raise ValueError(f"{name} has a row where every logit is -inf ([{b}, {j}]) that the verify step may read "
                             f"(every draft before it may be accepted); such a row is allowed only after a draft "
                             f"rejected for sure or past the row's last draft (num_drafts, -1)")


def _check_num_drafts(num_drafts, draft_tokens: torch.Tensor, N: int) -> torch.Tensor | None:
    """verify's `num_drafts` as a long tensor [B], or None; ValueError if malformed or out of [0, N]."""
    if num_drafts is not None:
        if (not isinstance(num_drafts, torch.Tensor) or num_drafts.dtype not in (torch.long, torch.int32)
                or tuple(num_drafts.shape) != (draft_tokens.shape[0],)):
            raise ValueError(f"num_drafts must be an integer tensor [B] = [{draft_tokens.shape[0]}]")
        if num_drafts.device != draft_tokens.device or bool(((num_drafts < 0) | (num_drafts > N)).any()):
            raise ValueError(f"num_drafts must lie in [0, N] = [0, {N}], on the drafts' device")
        num_drafts = num_drafts.long()
    return num_drafts


def _check_relax(relax, B: int, N: int, device) -> torch.Tensor | None:
    """verify's `relax` mask as a bool tensor [B, N+1] on the block's device, or None; ValueError if malformed."""
    if relax is None:
        return None
    if not isinstance(relax, torch.Tensor) or relax.dtype != torch.bool or tuple(relax.shape) != (B, N + 1):
        got = f"{relax.dtype} {list(relax.shape)}" if isinstance(relax, torch.Tensor) else type(relax).__name__
        raise ValueError(f"relax must be a bool tensor [B, N+1] = [{B}, {N + 1}], got {got}")
    return relax.to(device)

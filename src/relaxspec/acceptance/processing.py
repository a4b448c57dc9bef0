"""Turning logits into the processed distributions every rule works on, plus small
divergence helpers and the argument checks shared by `verify`.

"Processed" means: logits / temperature, then top-k, then top-p, renormalised
(the order vLLM and Hugging Face use). A temperature below GREEDY_TEMPERATURE
(1e-5, vLLM's sampling epsilon) means greedy: a one-hot row on the argmax.

Float32 tensors on a CPU are processed and sampled by the C kernels of `acceptance/fused.py` (the same
semantics, one call per block of rows; probabilities may differ from torch's in the last bits, sampled
indices are the same for the same weights); the torch code here serves every other device and dtype, and
everything when the kernels are unavailable (no C compiler, RELAXSPEC_NATIVE=0): it is the reference the
kernels are tested against.
"""

from __future__ import annotations

import math
import numbers

import torch

from relaxspec.acceptance import fused

NEG_INF = float("-inf")
# Temperatures below this are greedy (dividing logits by them would overflow to NaN).
GREEDY_TEMPERATURE = 1e-5


def is_greedy(temperature: float) -> bool:
    """True for temperatures that mean greedy decoding (0, or below GREEDY_TEMPERATURE)."""
    return temperature < GREEDY_TEMPERATURE


# ---------------------------------------------------------------- processing


def process_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Processed probabilities over the last dimension of `logits`.

    logits / temperature, then keep the top_k largest (ties with the k-th value
    are kept), then keep the smallest most-likely set whose mass reaches top_p
    (always at least one token), renormalised. A greedy temperature (< 1e-5) gives a
    one-hot row on the argmax (first index on ties); top-k / top-p cannot
    change the argmax, so they are no-ops there.
    """
    check_sampling_args(temperature, top_k, top_p)
    return process_logits_unchecked(logits, temperature, top_k, top_p)


def process_logits_unchecked(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                             top_p: float | None = None) -> torch.Tensor:
    """`process_logits` for settings already checked (`check_sampling_args`) once per call path: the engine
    and a VerifyStep process a few rows many times per generated sequence."""
    z = as_float(logits)
    if is_greedy(temperature):
        return one_hot_argmax(z)
    if fused.serves(z):  # float32 on a CPU: the C kernel (acceptance/fused.py), same semantics; torch otherwise
        return fused.process(z, temperature, top_k, top_p)
    if temperature != 1.0:
        z = z / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = z.topk(top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, NEG_INF)
    if top_p is not None and top_p < 1.0:
        z = _mask_top_p(z, top_p)
    return z.softmax(dim=-1)


def _mask_top_p(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-likely set whose mass reaches top_p: a token is dropped once the more likely
    tokens already hold top_p; ties at the cut are kept lowest index first (the order of a stable sort).

    A large vocabulary on a CPU finds the set among the k largest logits (topk, k growing 8x until the set
    closes within them): O(V) per row instead of a full O(V log V) sort (49k tokens: 7x faster). A small
    vocabulary, or another device (where the data-dependent loop would cost a device sync per call), sorts."""
    V = z.shape[-1]
    flat = z.reshape(-1, V)
    if z.device.type != "cpu" or V <= _TOP_P_SORT_MAX_V:
        sorted_z, order = flat.sort(dim=-1, descending=True, stable=True)
        probs = sorted_z.softmax(dim=-1)
        # The first token is never dropped: the mass before it is 0 (cumsum[0] - probs[0], exactly) < top_p.
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        # Each logit back to its place, -inf where dropped: one scatter (order is a permutation).
        return flat.scatter(-1, order, sorted_z.masked_fill_(drop_sorted, NEG_INF)).view(z.shape)
    log_total = flat.logsumexp(dim=-1, keepdim=True)
    k = _TOP_P_FIRST_K
    while True:
        top = flat.topk(k, dim=-1).values  # descending
        mass = (top - log_total).exp().cumsum(dim=-1)
        kept = 1 + (mass[:, :-1] < top_p).sum(dim=-1, keepdim=True)  # token j is kept iff the mass before it < top_p
        if k == V or bool((kept < k).all()):  # every row's set closed within the k largest
            break
        k = min(V, 8 * k)
    cut = top.gather(-1, kept - 1)
    keep = flat >= cut
    if bool((keep.sum(dim=-1, keepdim=True) != kept).any()):  # ties at the cut: the lowest indices among them
        above = flat > cut
        at_cut = flat == cut
        keep = above | (at_cut & (at_cut.cumsum(dim=-1) <= kept - above.sum(dim=-1, keepdim=True)))
    return z.masked_fill(~keep.view(z.shape), NEG_INF)


_TOP_P_SORT_MAX_V = 4096  # up to this vocabulary a sort costs less than topk and its extra ops (CPU, measured)
_TOP_P_FIRST_K = 64  # topk's first width: most rows of a sampled LM close their top-p set within it


def as_float(t: torch.Tensor) -> torch.Tensor:
    """Half / bfloat16 logits are upcast: probabilities near 0 and 1 matter here."""
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.float()
    return t


def one_hot_argmax(z: torch.Tensor) -> torch.Tensor:
    """One-hot row on the argmax of the last dimension (first index on ties)."""
    return torch.zeros_like(z).scatter_(-1, z.argmax(dim=-1, keepdim=True), 1.0)


# ---------------------------------------------------------------- divergences (nats)


def neg_entropy(p: torch.Tensor) -> torch.Tensor:
    """Σ p log p of each row: minus the Shannon entropy, in nats (xlogy(0, 0) = 0)."""
    return torch.xlogy(p, p).sum(dim=-1)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of each row, in nats."""
    return -neg_entropy(p)


def jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence of each row pair, in nats (in [0, ln 2]).

    With s = p + q and m = s/2: JSD = ½[Σ p log p + Σ q log q - Σ s log s] + ½ log 2 · Σ s,
    which needs fewer [.., V] temporaries than the two KL terms. xlogy(0, .) = 0,
    so disjoint supports need no special case.
    """
    s = p + q
    out = 0.5 * (neg_entropy(p) + neg_entropy(q) - neg_entropy(s)) + (0.5 * math.log(2.0)) * s.sum(dim=-1)
    return out.clamp(0.0, math.log(2.0))


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TV(p, q) = sum (p - q)+ of each row pair."""
    return (p - q).clamp_min(0.0).sum(dim=-1)


# ---------------------------------------------------------------- ratio / normalisation


def capped_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """min(1, num / den), and 0 where den == 0.

    den == 0 is a draft the drafter could not have produced (q(x) = 0, e.g. cut by
    its top-k): it is rejected, as vLLM's and the reference's rejection samplers do.
    A finite ratio that overflows (den tiny) is still capped to 1.
    """
    if fused.serves(num) and fused.serves(den) and num.shape == den.shape:
        return fused.capped_ratio(num, den)  # (one C call instead of four ops: every round of every rule runs it)
    return (num / den).clamp_(max=1.0).masked_fill_(den <= 0, 0.0)


def at_tokens(probs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """probs [..., V] at the tokens x [...] (one per row): [...]; on a CPU one C call for a block's p(x) or q(x)."""
    if fused.serves(probs) and x.is_cpu and x.dtype is torch.int64 and probs.dim() == x.dim() + 1 <= 3:
        return fused.at_tokens(probs, x)
    return probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)


def accept_or_strict(gate: torch.Tensor, p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """Acceptance of a rule whose target is pi = q where `gate` holds and p elsewhere: 1 on the gate
    (pi(x)/q(x) = 1, unless q(x) = 0: rejected), the strict test min(1, p(x)/q(x)) off it.

    One masked_fill and the strict test's one call: p(x) read as +inf on the gate, where min(1, inf/q(x)) is 1 for
    q(x) > 0 and capped_ratio's 0 for q(x) = 0 (the same values, bit for bit, as 1 on the gate and q(x) > 0)."""
    return capped_ratio(p_x.masked_fill(gate, math.inf), q_x)


def strict_kept(pos, strict: torch.Tensor) -> torch.Tensor:
    """bool [B, N]: where the strict test keeps each draft of the block `pos` (`strict` = min(1, p(x)/q(x)) there),
    for a rule whose test reads the strict outcome at other positions (`Rule.reads_uniforms`): u < strict with the
    block's acceptance uniforms `pos.u`, the comparison the shared loop makes; without them (temperature 0, where
    strict is 0 or 1; dense targets) where strict keeps the draft for sure (strict = 1)."""
    return strict >= 1.0 if pos.u is None else pos.u < strict


def ranking_probs(pos) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [..., V], probs at the drafts [...]): the verifier distribution a top-k candidate test ranks tokens by
    (topk-delta, topk-ratio): the processed p when sampling, the untempered softmax(z_p) at temperature 0, where the
    processed p is one-hot (the engines that ship these tests run them on greedy requests, on softmax(logits))."""
    if is_greedy(pos.temperature):
        return pos.p_tilde, at_tokens(pos.p_tilde, pos.x)
    return pos.p, pos.p_x


def top_candidate(probs: torch.Tensor, probs_x: torch.Tensor, k: float, floor) -> torch.Tensor:
    """[...] bool: the draft, of probability probs_x [...] in probs [..., V], is among the k most probable tokens
    (ties with the k-th kept: probs_x >= the k-th largest value), has probs_x >= floor(the top-1 probability [...])
    and probs_x > 0 (a token the verifier rules out is never a candidate). One topk gives both the k-th and the
    top-1 value (the same bits as counting the larger tokens and amax)."""
    k = min(int(k), probs.shape[-1])
    if k < 1:  # no candidate
        return torch.zeros_like(probs_x, dtype=torch.bool)
    top = probs.topk(k, dim=-1, sorted=True).values
    cut = torch.maximum(top[..., -1], floor(top[..., 0]))
    return (probs_x >= cut) & (probs_x > 0)


def normalize_or(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Rows of `weights` normalised to sum 1; rows with zero mass become `fallback`."""
    mass = weights.sum(dim=-1, keepdim=True)
    has_mass = mass > 0
    normalised = weights / torch.where(has_mass, mass, torch.ones_like(mass))
    return torch.where(has_mass, normalised, fallback)


def cdf_dtype(device: torch.device) -> torch.dtype:
    """The dtype of sampling sums (cdf) and 53-bit uniforms on `device`: float64, float32 on mps."""
    return torch.float32 if device.type == "mps" else torch.float64  # mps has no float64


def sample_with_uniform(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF: index i with cdf[i-1] <= u * total < cdf[i] in each row of weights [R, V]
    (unnormalised is fine; a zero-weight index is never returned). u [R] in [0, 1)."""
    if fused.serves(weights) and weights.dim() == 2 and u.is_cpu and u.shape == weights.shape[:1]:
        return fused.sample(weights, u)  # the C kernel: the same sums in the same order, so the same indices
    dtype = cdf_dtype(weights.device)
    cdf = weights.cumsum(dim=-1, dtype=dtype)
    total = cdf[:, -1:]
    # Strictly below the total, so rounding of u * total never selects a trailing zero weight.
    target = torch.minimum(u.to(dtype).unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


# ---------------------------------------------------------------- argument checks


def check_sampling_args(temperature, top_k, top_p) -> None:
    """Temperature a finite number >= 0 (below GREEDY_TEMPERATURE: greedy); top_k an int >= 1;
    top_p in (0, 1]; None means off."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if not (temperature >= 0 and temperature < float("inf")):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not (0 < top_p <= 1):
            raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def check_logits(name: str, logits, masked_rows: bool = False) -> torch.Tensor | None:
    """Floating tensor; NaN and +inf are errors, -inf (masked tokens) is allowed,
    but every row needs at least one finite logit. masked_rows: rows where every logit is -inf are
    returned instead (bool over the rows, None where there are none), for a caller that reads only some
    rows (`verify`: the rows after a draft rejected for sure)."""
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(logits.shape)})")
    row_max = logits.amax(dim=-1)  # one pass: amax propagates NaN and +inf
    if bool(torch.isfinite(row_max).all()):  # the common case costs one check
        return None
    if torch.isnan(row_max).any():
        raise ValueError(f"{name} contains NaN (only -inf is allowed, for masked tokens)")
    if torch.isposinf(row_max).any():
        raise ValueError(f"{name} contains +inf (only -inf is allowed, for masked tokens)")
    if masked_rows:
        return torch.isneginf(row_max)
    raise ValueError(f"{name} has a row where every logit is -inf (no token left to sample)")

"""Speed-up models (tau: mean acceptance length, bonus included; N: draft length; extra: the drafter passes
a round costs beyond N, as the acceptance rule declares them; c_rel: drafter step / verifier step latency).

* modelled (Leviathan)  S = tau / (1 + (N + extra) * c_rel)   -- a verify block priced as one verifier step
* block-aware           S_block = tau / ((N + extra) * c_rel + c_block + c_pivot), c_block = verifier latency of
                        the (N+1)-token block / one-token step, measured for the pair; c_pivot = a pivot
                        classifier's call on the round's N drafts / one-token step (0 for a rule that reads none)
* length-adjusted       S_len = S * L_AR / L_method (L: mean response length in tokens)
"""

from __future__ import annotations

C_REL_GRID = (0.05, 0.2, 0.5)  # the c_rel values the modelled speed-ups are also given at (beside the measured one)

# what the layers above use (relaxspec.bench.speedup)
__all__ = ["rounds", "round_cost", "C_REL_GRID"]


def _check(draft_length: int, c_rel: float, extra: int) -> None:
    if draft_length < 0 or c_rel < 0 or extra < 0:
        raise ValueError(f"need draft_length, c_rel and extra drafter passes >= 0, got N={draft_length}, "
                         f"c_rel={c_rel}, extra={extra}")


def modelled_speedup(tau: float, draft_length: int, c_rel: float, extra: int = 0) -> float:
    """S = tau / (1 + (N + extra) * c_rel); AR (N = 0, tau = 1) is 1.0."""
    _check(draft_length, c_rel, extra)
    return tau / (1.0 + (draft_length + extra) * c_rel)


def round_cost(draft_length: float, c_rel: float, c_block: float, extra: int = 0, c_pivot: float = 0.0) -> float:
    """A speculative round's cost in verifier one-token steps: (N + extra) * c_rel + c_block + c_pivot."""
    _check(draft_length, c_rel, extra)
    if c_block <= 0:
        raise ValueError(f"c_block must be > 0, got {c_block}")
    if c_pivot < 0:
        raise ValueError(f"c_pivot must be >= 0, got {c_pivot}")
    return (draft_length + extra) * c_rel + c_block + c_pivot


def block_aware_speedup(tau: float, draft_length: float, c_rel: float, c_block: float, extra: int = 0,
                        c_pivot: float = 0.0) -> float:
    """S_block = tau / ((N + extra) * c_rel + c_block + c_pivot); c_block = 1 and c_pivot = 0 give the Leviathan
    model."""
    return tau / round_cost(draft_length, c_rel, c_block, extra, c_pivot)


def length_adjusted_speedup(speedup: float, length_ar: float, length_method: float) -> float:
    """S_len = S * L_AR / L_method: a method whose answers are longer finishes later."""
    if not length_method > 0:  # no tokens (or NaN): no defined value
        return float("nan")
    return speedup * length_ar / length_method


def rounds(row) -> float:
    """A stored sample's sequence rounds: its tokens / its tau (bonus included; 1 for AR)."""
    tau = row.stats.get("mean_acceptance_length") or 1.0
    return row.tokens / tau

"""Names every layer shares (the bottom layer: imports nothing)."""

AR = "ar"  # autoregressive decoding: the baseline every cell is compared with (no drafter, no acceptance rule)
AUTO = "auto"  # draft_length: each sequence's own +2/-1 schedule (transformers' heuristic) instead of a fixed N


def draft_length_order(n) -> tuple:
    """A sort key of draft lengths: the fixed ones in order (AR's 0 first), then "auto"."""
    return (1, 0) if n == AUTO else (0, n)

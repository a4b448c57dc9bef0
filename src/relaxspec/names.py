"""Names every layer shares (the bottom layer: imports nothing)."""

AR = "ar"  # autoregressive decoding: the baseline every cell is compared with (no drafter, no acceptance rule)
AUTO = "auto"  # draft_length: each sequence's own +2/-1 schedule (transformers' heuristic) instead of a fixed N
STRICT = "strict"  # lossless speculative sampling: the reference of every relaxed rule


def draft_length_order(n) -> tuple:
    """A sort key of draft lengths: the fixed ones in order (AR's 0 first), then "auto"."""
    return (1, 0) if n == AUTO else (0, n)


def method_label(method: str, params: dict) -> str:
    """A rule and its parameters as the reports name them, e.g. cactus(delta=0.25)."""
    if not params:
        return method
    return method + "(" + ",".join(f"{k}={_fmt(v)}" for k, v in params.items()) + ")"


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)

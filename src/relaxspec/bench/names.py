"""Names shared by the bench's runner, report and plots."""

from __future__ import annotations

from relaxspec.names import AR, AUTO, draft_length_order  # noqa: F401 - the bench's modules read them here

STRICT = "strict"  # lossless speculative sampling: the reference of every relaxed rule


def method_label(method: str, params: dict) -> str:
    if not params:
        return method
    return method + "(" + ",".join(f"{k}={_fmt(v)}" for k, v in params.items()) + ")"


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)

"""Names shared by the bench's runner, report and plots, and the paper preset's budget (which `relaxspec report
--findings` passes to the study by default)."""

from __future__ import annotations

from relaxspec.names import AR, AUTO, draft_length_order  # noqa: F401 - the bench's modules read them here

STRICT = "strict"  # lossless speculative sampling: the reference of every relaxed rule
# A run of ~80 paired samples cannot show a drop <= 0.03 even when every output equals strict's (Tango's
# interval at b = c = 0 is +-z^2/(n+z^2) = +-0.046 at n = 80, 95%): the findings' default budget.
FINDINGS_MAX_DROP = 0.1


def method_label(method: str, params: dict) -> str:
    if not params:
        return method
    return method + "(" + ",".join(f"{k}={_fmt(v)}" for k, v in params.items()) + ")"


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)

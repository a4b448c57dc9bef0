"""Names shared by the bench's runner, report and plots (relaxspec.names: every layer's)."""

from __future__ import annotations

from relaxspec.names import AR, AUTO, STRICT, draft_length_order, method_label  # noqa: F401 - read here by the bench

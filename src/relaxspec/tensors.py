"""Tensors made once and shared (the bottom layer: imports torch, nothing of the package)."""

from __future__ import annotations

import torch

_ARANGES: dict = {}  # (length, device) -> torch.arange(length): made once, read every block


def cached_arange(length: int, device) -> torch.Tensor:
    """torch.arange(length) on `device`, made once and shared (read-only: callers never write into it); the
    verify step (acceptance.verify) and the caches' bookkeeping (models.stream) read one every round."""
    key = (length, device)
    if key not in _ARANGES:
        _ARANGES[key] = torch.arange(length, device=device)
    return _ARANGES[key]

"""Where models run and in which precision: `--device` / `--dtype` as every Hugging Face tool."""

from __future__ import annotations

import os

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Environment overrides of the defaults (e.g. RELAXSPEC_DEVICE=cpu on a CUDA machine; gpu_check.sh runs the
# tests with RELAXSPEC_DEVICE=cuda RELAXSPEC_DTYPE=float32). An explicit argument always wins.
DEVICE_ENV, DTYPE_ENV = "RELAXSPEC_DEVICE", "RELAXSPEC_DTYPE"


def resolve_device(device=None) -> torch.device:
    """A torch.device from None / "cpu" / "cuda" / "cuda:N" / "mps" / a torch.device. None: $RELAXSPEC_DEVICE when
    set, else cuda when available, else cpu. A device this machine does not have is a ValueError."""
    if device is None:
        device = os.environ.get(DEVICE_ENV) or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} asked for, but CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r} asked for, but this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError("device 'mps' asked for, but MPS is not available on this machine")
    elif device.type not in ("cpu", "meta"):
        raise ValueError(f"unsupported device {str(device)!r}; use cpu, cuda, cuda:N or mps")
    return device


def resolve_dtype(dtype=None, device: torch.device | None = None) -> torch.dtype:
    """A torch dtype from None / "float32" / "bfloat16" / "float16" / a torch dtype. None: $RELAXSPEC_DTYPE when
    set, else bfloat16 on CUDA, float32 elsewhere."""
    if dtype is None:
        dtype = os.environ.get(DTYPE_ENV) or None
    if dtype is None:
        return torch.bfloat16 if device is not None and device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use one of {sorted(DTYPES)}")
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}")
    return DTYPES[name]

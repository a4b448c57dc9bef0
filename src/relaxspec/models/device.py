"""Where models run and in which precision: `--device` / `--dtype` as every Hugging Face tool."""

from __future__ import annotations

import functools
import os

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# --dtype's choices: a torch dtype, int4 (weight-only, group-wise; CPU), auto (a GGUF file in the precision
# class it was shipped in, anything else as the default) or file (a qwen2 GGUF file's matrices in their own types;
# CPU). See models/quant.py.
DTYPE_CHOICES = (*DTYPES, "int4", "auto", "file")
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


def resolve_format(dtype=None, device: torch.device | None = None, gguf_format=None) -> tuple[torch.dtype, str]:
    """(dtype to load the weights in, the format they run in) for a `--dtype` value. On a CPU the weights load
    in float32 and run in the format (float32, bfloat16 or int4, models/quant.py); float16 on a CPU is a ValueError
    (it would run in float32). Elsewhere the format is the dtype. "auto": `gguf_format()` (a callable giving a GGUF
    file's class, None for another model) on a CPU, else the default. int4 and file off a CPU are a ValueError (file
    on a model other than a natively read GGUF file: load_model's)."""
    from_env = dtype is None and bool(os.environ.get(DTYPE_ENV))
    if dtype is None:
        dtype = os.environ.get(DTYPE_ENV) or None
    where = f"${DTYPE_ENV}={dtype}" if from_env else f"--dtype {dtype}"
    if isinstance(dtype, str) and dtype not in DTYPE_CHOICES and str(dtype).removeprefix("torch.") not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}" + (f" (from ${DTYPE_ENV})" if from_env else "")
                         + f"; use one of {', '.join(DTYPE_CHOICES)}")
    if isinstance(dtype, str) and dtype in ("int4", "auto", "file"):
        cpu = device is None or device.type == "cpu"
        if dtype in ("int4", "file") and not cpu:
            raise ValueError(f"{where} runs on a CPU only (device {str(device)!r}); use bfloat16 or float32")
        if dtype in ("int4", "file"):
            return torch.float32, dtype
        shipped = gguf_format() if cpu and gguf_format is not None else None
        if shipped is not None:
            return torch.float32, shipped
        dtype = None
    resolved = resolve_dtype(dtype, device)
    if device is None or device.type == "cpu":
        if resolved == torch.float16:  # a CPU runs float32, bfloat16 and int4 (float16 would run in float32)
            raise ValueError(f"{where} runs on a GPU only; on a CPU use float32, bfloat16, int4 or auto")
        return torch.float32, "bfloat16" if resolved == torch.bfloat16 else "float32"
    return resolved, str(resolved).removeprefix("torch.")


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
        source = f" (from ${DTYPE_ENV})" if dtype == os.environ.get(DTYPE_ENV) else ""
        raise ValueError(f"unknown dtype {dtype!r}{source}; use one of {', '.join(DTYPE_CHOICES)}")
    return DTYPES[name]


def inference(fn):
    """`fn` under torch.inference_mode, entered only when not already in it: a model's forward runs many times
    per generated token, and entering the mode costs as much as a few small ops."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper

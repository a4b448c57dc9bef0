"""An int4 weight-only kernel for blocks of a few rows (a verify block of N+1 tokens) on AVX-512 CPUs.

`aten._weight_int4pack_mm_for_cpu` dequantizes every weight again for every row of a block (its 6-row product
costs ~2.3 one-row products on SmolLM2). This kernel dequantizes each group of 32 weights once per call, to
bfloat16 (w = q * scale + zero' in float32, rounded), and applies it to up to `MAX_ROWS` rows with AVX-512 BF16
dot products (`vdpbf16ps`: bfloat16 pairs multiplied exactly and summed in float32), the rows' inputs rounded to
bfloat16 as the aten kernel rounds them. A longer input runs in chunks of `MAX_ROWS` rows.

Row independence: the numbers of a row (each output's chain of dot products over the groups, in order, and its
final sum) do not depend on how many other rows are in the call, nor on the threads (outputs are split between
threads, never a dot product): a row multiplied alone or in a block gives the same bits (tested), so int4 strict
greedy equals AR greedy through the linear layers by construction.

Layout (packed once at load, `pack`): codes uint8 [out, in / 2], byte j of a group holding its code j (low
nibble) and code j + 16 (high nibble); per group a 32-bit word, quant.py's bfloat16 scale in its high half and
its bfloat16 zero in the low half (w = (q - 8) scale + zero, computed as q scale + (zero - 8 scale) in float32).

Plain C (models/csrc/int4_block.c, its interface int4_block.h) built on first use by relaxspec.native with the
system's C compiler (`-fopenmp`: outputs split between the threads of the process's OpenMP runtime, torch's, with
torch's thread count, as its own kernels split them) and loaded with ctypes; without a compiler, without AVX-512
BF16, when the build fails (one warning line) or with RELAXSPEC_NATIVE=0: quant.py uses the aten kernel. It is
int4's default where it builds (RELAXSPEC_INT4_KERNEL=aten keeps aten's): measured on SmolLM2's linears at two
threads it costs 0.96 / 0.86 / 0.60 / 0.58 of aten's kernel at 1 / 4 / 6 / 9 rows (one thread: 1.05-1.08 at 1 row,
0.65-0.72 at 6-9).
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch

from relaxspec import native

MAX_ROWS = 10  # rows per pass over the weights (int4_block.c's MAX_ROWS)
GROUP = 32
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
KERNEL = native.Kernel("int4_block", Path(__file__).resolve().parent / "csrc" / "int4_block.c",
                       Path(__file__).resolve().parent / "csrc" / "int4_block.h",
                       flags=("-O3", "-fPIC", "-shared", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl",
                              "-mavx512bf16", "-mfma"))


@functools.cache
def kernel():
    """The kernel's library (its function int4_block_mm), or None (with one warning line) where it cannot run or be
    built; None, silently, with RELAXSPEC_NATIVE=0."""
    if not native.enabled():
        return None
    missing = [f for f in CPU_FLAGS if f not in native.cpu_flags()]
    if missing:
        return _unavailable(f"this CPU lacks {', '.join(missing)}")
    try:
        return native.open_library(KERNEL)
    except native.BuildError as error:
        return _unavailable(error.summary)


def _unavailable(why: str):
    warnings.warn(f"relaxspec int4 block kernel unavailable ({why}); int4 uses aten's kernel", stacklevel=3)
    return None


PACK_ROWS = 8192  # rows packed at once


def pack(codes: torch.Tensor, scale_zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [out, in / 2], scale and zero' int32 [out, in / 32]) in the kernel's layout from quant.py's
    codes [out, in] (0..15) and (scale, zero) [in / 32, out, 2] (bfloat16)."""
    out, in_features = codes.shape
    packed = torch.empty((out, in_features // 2), dtype=torch.uint8, device=codes.device)
    sz = torch.empty((out, in_features // GROUP), dtype=torch.int32, device=codes.device)
    for start in range(0, out, PACK_ROWS):  # in slices of rows: the temporaries stay small (a 151,936-row head)
        rows = slice(start, start + PACK_ROWS)
        g = codes[rows].reshape(-1, in_features // GROUP, 2, GROUP // 2).to(torch.uint8)
        packed[rows] = (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(-1, in_features // 2)
        scale, zero = scale_zero[:, rows].transpose(0, 1).unbind(-1)  # [rows, in / 32] each, bfloat16
        bits = [t.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF for t in (scale, zero)]
        sz[rows] = (bits[0] << 16) | bits[1]
    return packed, sz


def block_mm(x: torch.Tensor, codes: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
    """x [M, in] (CPU, any float dtype; rounded to bfloat16) @ W^T for `pack`'s (codes, sz): float32 [M, out], in
    chunks of MAX_ROWS rows (one call)."""
    xb = x.to(torch.bfloat16).contiguous()
    M, in_features = xb.shape
    out, half = codes.shape  # (codes and sz as `pack` makes them: uint8 and int32, contiguous)
    if half * 2 != in_features:
        raise ValueError(f"int4 block kernel: x [M, {in_features}] against a weight of {half * 2} inputs")
    y = torch.empty((M, out), dtype=torch.float32, device=xb.device)
    kernel().int4_block_mm(xb.data_ptr(), M, in_features, codes.data_ptr(), sz.data_ptr(), y.data_ptr(), out)
    return y

"""An int4 weight-only kernel for CPUs with AVX-512 or AVX2, for one row (a decode step), a verify block of N+1 rows
and a prompt alike.

Two paths, picked by the CPU (`path`):

* "vnni" (AVX-512 VNNI): each row of x quantized per group of 32 to int8 with a float scale d (symmetric, round
  to nearest, as llama.cpp's Q8_0), and per group sum w x = d (s sum q x8 + z' sum x8) with the first sum by
  `vpdpbusd` (unsigned 4-bit codes times signed int8, exact in int32), scaled and summed in float32 lane by lane
  (one lane a group) and reduced once per output. About 3x fewer instructions per weight than dequantizing; the
  activations' rounding (at most d / 2 = max|x_g| / 254 per input) is llama.cpp's. A call of many rows (a prompt)
  reads each weight once per block of rows whose int8 inputs stay in cache, not once per few rows. On a CPU with
  AVX2 and FMA but no AVX-512 (`isa` "avx2") the same path runs from int4_block_avx2.c: the same codes and int8
  inputs, and lane by lane the same float32 operations in the same order (its integer dot products by
  vpmaddubsw / vpmaddwd, exact as vpdpbusd's), so it is meant to give the AVX-512 path's bits.
* "bf16" (AVX-512 BF16 without VNNI): each group dequantized to bfloat16 (w = q * scale + zero' in float32,
  rounded) once per call of up to `MAX_ROWS` rows and applied with `vdpbf16ps` (bfloat16 pairs multiplied
  exactly and summed in float32), the rows' inputs rounded to bfloat16 as aten's kernel rounds them.

Row independence: the numbers of a row (its quantization, each output's chain of dot products over the groups, in
order, and its final sum) do not depend on how many other rows are in the call, nor on the threads (outputs are
split between threads, never a dot product): a row multiplied alone or in a block gives the same bits (tested),
so int4 strict greedy equals AR greedy through the linear layers by construction.

Layout (packed once at load, `pack`): codes uint8 [out, in / 2], byte j of a group holding its code j (low
nibble) and code j + 16 (high nibble), on the VNNI path the bytes of each 16 groups reordered 4 at a time
(`_superblocks`, int4_block.c); per group a 32-bit word, quant.py's bfloat16 scale in its high half and its
bfloat16 zero in the low half (w = (q - 8) scale + zero, computed as q scale + (zero - 8 scale) in float32).

Plain C (models/csrc/int4_block.c, or int4_block_avx2.c, their interface int4_block.h; the VNNI path's drivers in
int4_q8_drivers.h) built on first use by relaxspec.native with the system's C compiler (`-fopenmp`: outputs split
between the threads of the process's OpenMP runtime, torch's, with torch's thread count, as its own kernels split
them) and loaded with ctypes; without a compiler, without AVX-512 BF16 or AVX2, when the build fails (one warning
line) or with RELAXSPEC_NATIVE=0: quant.py uses the aten kernel (and oneDNN for bfloat16 weights wherever
`has_bf16` is False). It is int4's default where it builds (RELAXSPEC_INT4_KERNEL=aten keeps aten's). Measured on a 2-core AVX-512 VNNI EPYC
(one thread, interleaved, medians; benchmarks/int4_block_speed.py): SmolLM2's linears cost 0.48 / 0.92 / 0.99 /
0.87 of the bf16 path's time at 1 / 4 / 9 / 150 rows; Qwen2.5-1.5B's shapes 0.29-0.43 at one row.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch

from relaxspec import native

MAX_ROWS = 10  # rows per pass over the weights (int4_block.c's MAX_ROWS)
GROUP = 32
CSRC = Path(__file__).resolve().parent / "csrc"
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
KERNEL = native.Kernel("int4_block", CSRC / "int4_block.c", CSRC / "int4_block.h",
                       flags=("-O3", "-fPIC", "-shared", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl",
                              "-mavx512bf16", "-mavx512vnni", "-mfma"))
AVX2_FLAGS = ("avx2", "fma")
AVX2_KERNEL = native.Kernel("int4_block_avx2", CSRC / "int4_block_avx2.c", CSRC / "int4_block.h",
                            flags=("-O3", "-fPIC", "-shared", "-fopenmp", "-mavx2", "-mfma"),
                            functions=("int4_block_mm_q8",))
PATHS = ("vnni", "bf16")


@functools.cache
def isa() -> str | None:
    """The kernel this CPU runs: "avx512" (int4_block.c: both paths and bf16_mm) where it has AVX-512 BF16, "avx2"
    (int4_block_avx2.c: the VNNI path's numbers with AVX2 instructions, no bf16 path) where it has AVX2 and FMA,
    else None."""
    flags = native.cpu_flags()
    if set(CPU_FLAGS) <= flags:
        return "avx512"
    return "avx2" if set(AVX2_FLAGS) <= flags else None


@functools.cache
def kernel():
    """The kernel's library for this CPU (`isa`; int4_block_mm_q8, and on AVX-512 int4_block_mm and bf16_block_mm
    too), or None (with one warning line) where it cannot run or be built; None, silently, with
    RELAXSPEC_NATIVE=0."""
    if not native.enabled():
        return None
    if isa() is None:
        missing = [f for f in AVX2_FLAGS if f not in native.cpu_flags()]
        return _unavailable(f"this CPU lacks {', '.join(missing)}")
    try:
        return native.open_library(KERNEL if isa() == "avx512" else AVX2_KERNEL)
    except native.BuildError as error:
        return _unavailable(error.summary)


def has_bf16() -> bool:
    """Whether the bf16 path and bf16_mm run here (the AVX-512 kernel built)."""
    return isa() == "avx512" and kernel() is not None


@functools.cache
def path() -> str:
    """The kernel's path on this CPU: "vnni" (int8 inputs, int4_block_mm_q8) where it has AVX-512 VNNI or runs the
    AVX2 kernel, else "bf16" (int4_block_mm)."""
    return "vnni" if "avx512_vnni" in native.cpu_flags() or isa() == "avx2" else "bf16"


def _unavailable(why: str):
    warnings.warn(f"relaxspec int4 block kernel unavailable ({why}); int4 uses aten's kernel and bfloat16 "
                  "oneDNN's alone", stacklevel=3)
    return None


PACK_ROWS = 8192  # rows packed at once


def pack(codes: torch.Tensor, scale_zero: torch.Tensor, layout: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [out, in / 2], scale and zero' int32 [out, in / 32]) in the kernel's layout for `layout` (a
    path; default: this CPU's) from quant.py's codes [out, in] (0..15) and (scale, zero) [in / 32, out, 2]
    (bfloat16). (Kept by the converted-weight cache: a change to this layout raises weight_cache.VERSION.)"""
    layout = layout or path()
    out, in_features = codes.shape
    packed = torch.empty((out, in_features // 2), dtype=torch.uint8, device=codes.device)
    sz = torch.empty((out, in_features // GROUP), dtype=torch.int32, device=codes.device)
    for start in range(0, out, PACK_ROWS):  # in slices of rows: the temporaries stay small (a 151,936-row head)
        rows = slice(start, start + PACK_ROWS)
        g = codes[rows].reshape(-1, in_features // GROUP, 2, GROUP // 2).to(torch.uint8)
        groups = g[:, :, 0] | (g[:, :, 1] << 4)  # [rows, in / 32, 16]
        packed[rows] = (_superblocks(groups) if layout == "vnni" else groups).reshape(-1, in_features // 2)
        scale, zero = scale_zero[:, rows].transpose(0, 1).unbind(-1)  # [rows, in / 32] each, bfloat16
        bits = [t.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF for t in (scale, zero)]
        sz[rows] = (bits[0] << 16) | bits[1]
    return packed, sz


SUPERBLOCK = 16  # groups per superblock of the VNNI layout (int4_block.c's SB)


def _superblocks(groups: torch.Tensor) -> torch.Tensor:
    """The VNNI layout of bytes [rows, groups, 16] (int4_block.c): per superblock of 16 groups (the last may hold
    fewer, r), 4 runs of 4 r bytes, run k holding bytes 4k..4k+3 of each group in turn; a last one of r <= 4
    groups as it is."""
    rows, n = groups.shape[:2]
    parts = []
    for start in range(0, n, SUPERBLOCK):
        block = groups[:, start:start + SUPERBLOCK]  # [rows, r, 16]
        if block.shape[1] <= SUPERBLOCK // 4:  # a last superblock of 1..4 groups: in order (one register)
            parts.append(block.reshape(rows, -1))
            continue
        parts.append(block.reshape(rows, -1, 4, 4).transpose(1, 2).reshape(rows, -1))
    return torch.cat(parts, dim=1)


def dense(codes: torch.Tensor, sz: torch.Tensor, layout: str | None = None) -> torch.Tensor:
    """The float32 weight [out, in] the kernel multiplies by, from `pack`'s (codes, sz): q * scale + zero' in
    float32 (zero' = zero - 8 scale), rounded to bfloat16 on the bf16 path (its weights), as it is on the VNNI path
    (the inputs are rounded there, to int8)."""
    layout = layout or path()
    out, half = codes.shape
    groups = codes.reshape(out, -1, 16)
    if layout == "vnni":  # the inverse permutation of `_superblocks`
        parts, at = [], 0
        for start in range(0, groups.shape[1], SUPERBLOCK):
            r = min(SUPERBLOCK, groups.shape[1] - start)
            block = codes[:, at:at + 16 * r]
            parts.append(block.reshape(out, r, 16) if r <= SUPERBLOCK // 4
                         else block.reshape(out, 4, r, 4).transpose(1, 2).reshape(out, r, 16))
            at += 16 * r
        groups = torch.cat(parts, dim=1)
    q = torch.cat([groups & 0xF, groups >> 4], dim=2).float()  # [out, in / 32, 32] in input order
    s = (sz & -65536).view(torch.float32)[..., None]
    z = (sz << 16).view(torch.float32)[..., None] - 8 * s
    w = (q * s + z).reshape(out, 2 * half)
    return w if layout == "vnni" else w.bfloat16().float()


BF16_ROWS = 64  # bf16_mm serves calls of up to this many rows (decode steps, verify blocks); a prompt's rows go to
# oneDNN's GEMM, 2-3x faster there (the kernel reads the weight once per block of rows, at a lower FLOP rate)


def bf16_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, in] (CPU, any float dtype) @ W^T for W [out, in] in bfloat16 (contiguous, `in` a multiple of 32):
    float32 [M, out], x rounded to bfloat16 and each output summed in float32 and returned as it is (oneDNN's
    bfloat16 GEMM rounds its outputs to bfloat16, which ties logits that float32 tells apart); int4_block.c's
    bf16_block_mm. A row gets the same bits alone, in a verify block or in a prompt."""
    xc = x.to(torch.bfloat16).contiguous()
    M, in_features = xc.shape
    if in_features != weight.shape[1] or in_features % GROUP:
        raise ValueError(f"bf16 block kernel: x [M, {in_features}] against a weight of {weight.shape[1]} inputs "
                         f"(a multiple of {GROUP} needed)")
    y = torch.empty((M, weight.shape[0]), dtype=torch.float32, device=xc.device)
    kernel().bf16_block_mm(xc.data_ptr(), M, in_features, weight.data_ptr(), y.data_ptr(), weight.shape[0])
    return y


def block_mm(x: torch.Tensor, codes: torch.Tensor, sz: torch.Tensor, layout: str | None = None) -> torch.Tensor:
    """x [M, in] (CPU, any float dtype) @ W^T for `pack`'s (codes, sz) in `layout` (default: this CPU's path):
    float32 [M, out], in one call. VNNI: x in float32, quantized to int8 per group of 32 by the kernel; bf16: x
    rounded to bfloat16, in chunks of MAX_ROWS rows."""
    layout = layout or path()
    xc = (x.float() if layout == "vnni" else x.to(torch.bfloat16)).contiguous()
    M, in_features = xc.shape
    out, half = codes.shape  # (codes and sz as `pack` makes them: uint8 and int32, contiguous)
    if half * 2 != in_features:
        raise ValueError(f"int4 block kernel: x [M, {in_features}] against a weight of {half * 2} inputs")
    y = torch.empty((M, out), dtype=torch.float32, device=xc.device)
    mm = kernel().int4_block_mm_q8 if layout == "vnni" else kernel().int4_block_mm
    mm(xc.data_ptr(), M, in_features, codes.data_ptr(), sz.data_ptr(), y.data_ptr(), out)
    return y

"""A GGUF file's own quantized types on a CPU: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K matrices kept as their
codes and scales (`BlockCodes`) and multiplied by a C kernel (models/csrc/gguf_block.c) without dequantizing them
first: the `file` weight format (models/gguf_weights.py).

Layout (`pack`, lossless): per output row, superblocks of 16 lanes of 32 inputs (512 inputs; the last may hold
fewer lanes), each one record of the type's codes (bytes rearranged as the int4 kernel's, so that one 32-bit lane of
a dot product sums one block of 32; 5- and 6-bit codes as a 4-bit nibble plus bit planes) and its scales as the file
holds them (float16 d and m, Q4_K's 6-bit sub-scales unpacked to bytes, Q6_K's int8 sub-scales). A superblock takes
the file's own bytes (Q4_0 288, Q5_0 352, Q8_0 544, Q6_K 420) but Q4_K's (296 against 288). `dense` reads a record
back: exactly the `gguf` package's dequantization (tested), so the weights the kernel multiplies by are the file's,
bit for bit.

The product (`mm`): each row of x quantized to int8 per 32 inputs (symmetric, d = max|x| / 127, round to nearest
even: llama.cpp's Q8_0 rounding, at most d / 2 = max|x_g| / 254 of error per input; d stays float32 where llama.cpp
rounds it to float16, and llama.cpp quantizes the K-types' inputs per 256 instead), then per block of 32 (Q6_K:
16) an exact integer dot product with the codes, scaled and summed in float32 (gguf_block.c says in which order).
Two paths (`path`, as the int4 kernel picks its own: by the CPU's flags): "vnni" (AVX-512 F, BW, VL and VNNI:
`vpdpbusd`) and "portable" (plain C, any CPU with a C compiler). Both compute the same operations in the same
order: the same bits (tested). A row gets the same bits alone, in a verify block or in a prompt, on any thread count.

Plain C built on first use by relaxspec.native (`-march=native`, OpenMP: outputs split between torch's threads)
and loaded with ctypes. Without a compiler, when the build fails (one warning line) or with RELAXSPEC_NATIVE=0,
`kernel()` is None and quant.Linear runs such a matrix dequantized in float32 (the same values; no int8 inputs).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from relaxspec import native

KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K")  # gguf_block.c's enum, in its order
BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q6_K": 6}
BIAS = {"Q4_0": 8, "Q5_0": 16, "Q8_0": 128, "Q6_K": 32}  # subtracted from the unsigned codes (else an offset m)
BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q4_K": 256, "Q6_K": 256}  # the file's blocks
LANES = 16  # lanes of 32 inputs per superblock (gguf_block.c's LANES)
X_RECORD = 768  # bytes of a row's quantized inputs per superblock (XREC)
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
PATHS = ("vnni", "portable")
KERNEL = native.Kernel("gguf_block", Path(__file__).resolve().parent / "csrc" / "gguf_block.c",
                       Path(__file__).resolve().parent / "csrc" / "gguf_block.h",
                       flags=(*native.FLAGS, "-fopenmp", "-ffp-contract=off"))


@functools.cache
def kernel():
    """The kernel's library, or None (one warning line where it cannot be built; silently with
    RELAXSPEC_NATIVE=0)."""
    return native.load(KERNEL)


@functools.cache
def path() -> str:
    """The path this CPU runs: "vnni" where it has AVX-512 F, BW, VL and VNNI (and the library was built with
    them), else "portable"."""
    lib = kernel()
    if lib is not None and set(CPU_FLAGS) <= native.cpu_flags() and lib.gguf_block_vnni():
        return "vnni"
    return "portable"


def problem(kind: str, shape) -> str | None:
    """Why a matrix [out, in] of `kind` cannot be kept in its codes (None: it can)."""
    if kind not in KINDS:
        return f"no kernel for {kind}"
    if shape[1] % BLOCK[kind]:
        return f"in_features {shape[1]} is not a multiple of {kind}'s block of {BLOCK[kind]}"
    return None


# ------------------------------------------------------------------ the layout


def fields(kind: str) -> list[tuple[str, int, int, int]]:
    """A superblock record's fields in order, (name, registers, bytes per lane, fixed bytes): a lane field is
    `registers` runs of (lanes x bytes) (gguf_block.c's registers: run k holds each lane's bytes of register k); a
    fixed field its `fixed` bytes."""
    out = [("codes", 8 if BITS[kind] == 8 else 4, 4, 0)]
    out += [(f"plane{bit}", 1, 0, 64) for bit in range(4, BITS[kind] if BITS[kind] < 8 else 4)]
    if kind == "Q4_K":
        return out + [("dd", 1, 0, 8), ("sc", 1, 1, 0), ("m", 1, 1, 0)]  # d, d', dmin, dmin' (float16)
    if kind == "Q6_K":
        return out + [("dd", 1, 0, 4), ("sc", 1, 1, 0), ("sc_hi", 1, 1, 0)]  # d, d' (float16)
    return out + [("d", 1, 2, 0)] + ([("m", 1, 2, 0)] if kind in ("Q4_1", "Q5_1") else [])


def record_bytes(kind: str, lanes: int = LANES) -> int:
    """Bytes of a superblock of `lanes` lanes."""
    return sum(n * b * lanes + fixed for _, n, b, fixed in fields(kind))


def row_bytes(kind: str, in_features: int) -> int:
    """Bytes of one output row (gguf_block.c's gguf_block_row_bytes)."""
    full, tail = divmod(in_features // 32, LANES)
    return full * record_bytes(kind) + (record_bytes(kind, tail) if tail else 0)


def _blocks(data: np.ndarray, kind: str) -> np.ndarray:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1]
    return np.ascontiguousarray(data).view(np.uint8).reshape(data.shape[0], -1, size)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """The 32 codes of 16 bytes (weights 0..15 in the low nibbles, 16..31 in the high ones), per block."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5's fifth bits: 4 bytes per block, bit j (little-endian) weight j's."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _pairs(raw: np.ndarray, S: int) -> np.ndarray:
    """A 256-block field of 2 bytes [rows, blocks, 2] as each superblock's two [rows, S, 4] (zero past the last)."""
    return np.pad(raw, ((0, 0), (0, 2 * S - raw.shape[1]), (0, 0))).reshape(raw.shape[0], S, 4)


def q4_k_fields(data: np.ndarray):
    """A Q4_K tensor's fields per block of 256 (144 bytes: d, dmin float16, 12 bytes of 6-bit scales and minima for
    8 sub-blocks of 32, 128 bytes of codes, each 64 weights 32 bytes, the first sub-block in the low nibbles):
    (d, dmin as raw float16 bytes [rows, blocks, 2], sc, m uint8 [rows, blocks, 8], codes uint8 [rows, in])."""
    blocks = _blocks(data, "Q4_K")
    rows = blocks.shape[0]
    s = blocks[..., 4:16]
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    qs = blocks[..., 16:].reshape(rows, -1, 4, 1, 32)
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=3).reshape(rows, -1)
    return blocks[..., 0:2], blocks[..., 2:4], sc, m, codes


def codes_and_scales(kind: str, data: np.ndarray):
    """A tensor's rows (uint8 [rows, bytes], the file's blocks) as (unsigned codes uint8 [rows, in], {field: per-lane
    bytes [rows, in / 32, bytes] or per-superblock bytes [rows, superblocks, bytes]}) of `fields(kind)`'s scales."""
    blocks = _blocks(data, kind)
    rows = blocks.shape[0]
    S = -(-blocks.shape[1] * BLOCK[kind] // (32 * LANES))
    if kind == "Q4_K":
        d, dmin, sc, m, codes = q4_k_fields(data)
        return codes, {"dd": np.concatenate([_pairs(d, S), _pairs(dmin, S)], axis=-1),
                       "sc": sc.reshape(rows, -1, 1), "m": m.reshape(rows, -1, 1)}
    if kind == "Q6_K":  # ql[128], qh[64], scales[16] (int8, per 16 weights), d (float16), as gguf.quants reads them
        ql = (blocks[..., :128].reshape(rows, -1, 2, 1, 64) >> np.array([0, 4], np.uint8)[:, None]) & 0xF
        qh = (blocks[..., 128:192].reshape(rows, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
        codes = ql.reshape(rows, -1, 8, 32) | (qh.reshape(rows, -1, 8, 32) << 4)
        sc = blocks[..., 192:208].reshape(rows, -1, 2)  # per lane of 32: its first 16 weights' scale, its last 16's
        return codes.reshape(rows, -1), {"dd": _pairs(blocks[..., 208:210], S), "sc": sc[..., 0:1],
                                         "sc_hi": sc[..., 1:2]}
    d = {"d": blocks[..., 0:2]}
    if kind == "Q8_0":
        return (blocks[..., 2:] ^ 0x80).reshape(rows, -1), d
    if kind == "Q4_0":
        return _nibbles(blocks[..., 2:]).reshape(rows, -1), d
    if kind == "Q4_1":
        return _nibbles(blocks[..., 4:]).reshape(rows, -1), {**d, "m": blocks[..., 2:4]}
    if kind == "Q5_0":
        return (_nibbles(blocks[..., 6:]) | (_high_bits(blocks[..., 2:6]) << 4)).reshape(rows, -1), d
    if kind == "Q5_1":
        codes = _nibbles(blocks[..., 8:]) | (_high_bits(blocks[..., 4:8]) << 4)
        return codes.reshape(rows, -1), {**d, "m": blocks[..., 2:4]}
    raise ValueError(f"no GGUF block kernel for {kind}")


def pack(kind: str, data: np.ndarray) -> np.ndarray:
    """The kernel's layout (uint8 [rows, row_bytes]) of a tensor's rows (the file's blocks, uint8 [rows, bytes])."""
    codes, scales = codes_and_scales(kind, data)
    rows, groups = codes.shape[0], codes.shape[1] // 32
    S = -(-groups // LANES)
    u = np.pad(codes, ((0, 0), (0, S * LANES * 32 - codes.shape[1])))
    regs = u.reshape(rows, S, LANES, 2, 4, 4).transpose(0, 1, 3, 4, 2, 5).reshape(rows, S, 8, LANES, 4)
    parts = {"codes": regs if BITS[kind] == 8 else (regs[:, :, :4] & 0xF) | ((regs[:, :, 4:] & 0xF) << 4)}
    for bit in range(4, BITS[kind] if BITS[kind] < 8 else 4):
        bits = ((regs >> bit) & 1).reshape(rows, S, 8, 64)
        parts[f"plane{bit}"] = np.packbits(bits, axis=-1, bitorder="little").reshape(rows, S, 64)
    for name, value in scales.items():
        if value.shape[1] != S:  # per lane: [rows, groups, bytes] -> [rows, S, 1, LANES, bytes]
            value = np.pad(value, ((0, 0), (0, S * LANES - groups), (0, 0))).reshape(rows, S, 1, LANES, -1)
        parts[name] = value
    full, tail = divmod(groups, LANES)
    out = []
    for at, count, lanes in ((0, full, LANES), (full, 1 if tail else 0, tail)):
        if count:
            record = [parts[name][:, at:at + count].reshape(rows, count, -1) if fixed else
                      parts[name][:, at:at + count, :, :lanes].reshape(rows, count, -1)
                      for name, _, _, fixed in fields(kind)]
            out.append(np.concatenate(record, axis=-1).reshape(rows, -1))
    return np.concatenate(out, axis=1)


def _split(kind: str, packed: np.ndarray, groups: int) -> dict:
    """`pack`'s fields of each superblock, lanes past a row's last zero: {name: [rows, S, registers, LANES, bytes]
    or [rows, S, fixed]}."""
    rows, full, tail = packed.shape[0], *divmod(groups, LANES)
    parts, at = {name: [] for name, *_ in fields(kind)}, 0
    for count, lanes in ((full, LANES), (1 if tail else 0, tail)):
        if not count:
            continue
        size = record_bytes(kind, lanes)
        record, offset = packed[:, at:at + count * size].reshape(rows, count, size), 0
        at += count * size
        for name, n, b, fixed in fields(kind):
            width = fixed or n * lanes * b
            value = record[..., offset:offset + width]
            if not fixed:
                value = np.pad(value.reshape(rows, count, n, lanes, b), ((0, 0),) * 3 + ((0, LANES - lanes), (0, 0)))
            parts[name].append(value)
            offset += width
    return {name: np.concatenate(value, axis=1) for name, value in parts.items()}


def _f16(raw: np.ndarray) -> np.ndarray:
    """float16 values of raw bytes [..., 2 k] as float32 [..., k]."""
    raw = np.ascontiguousarray(raw)
    return raw.view(np.float16).reshape(*raw.shape[:-1], -1).astype(np.float32)


def dense(kind: str, packed: np.ndarray, in_features: int) -> np.ndarray:
    """The float32 weight [rows, in] of `pack`'s layout: the file's values exactly (w = scale (u - bias) + offset in
    float32, as gguf.quants computes them)."""
    rows, groups = packed.shape[0], in_features // 32
    f = _split(kind, packed, groups)
    S = f["codes"].shape[1]
    regs = f["codes"] if BITS[kind] == 8 else np.concatenate([f["codes"] & 0xF, f["codes"] >> 4], axis=2)
    for bit in range(4, BITS[kind] if BITS[kind] < 8 else 4):
        plane = np.unpackbits(f[f"plane{bit}"].reshape(rows, S, 8, 8), axis=-1, bitorder="little")
        regs = regs | (plane.reshape(rows, S, 8, LANES, 4) << bit)
    u = regs.reshape(rows, S, 2, 4, LANES, 4).transpose(0, 1, 4, 2, 3, 5).reshape(rows, S, LANES, 32)
    lane = lambda name: f[name].reshape(rows, S, LANES, -1)  # noqa: E731 - a per-lane field's bytes
    offset = None
    if kind in ("Q4_K", "Q6_K"):
        dd = np.repeat(_f16(f["dd"]), LANES // 2, axis=-1)  # [rows, S, 2 or 4 * LANES / 2]: d (and dmin) per lane
        scale = dd[..., :LANES] * lane("sc").view(np.int8 if kind == "Q6_K" else np.uint8)[..., 0].astype(np.float32)
        if kind == "Q4_K":
            offset = -(dd[..., LANES:] * lane("m")[..., 0].astype(np.float32))[..., None]
            scale = np.repeat(scale[..., None], 32, axis=-1)
        else:  # a lane's first 16 weights and its last 16, each their own scale
            high = dd[..., :LANES] * lane("sc_hi").view(np.int8)[..., 0].astype(np.float32)
            scale = np.concatenate([np.repeat(scale[..., None], 16, -1), np.repeat(high[..., None], 16, -1)], -1)
    else:
        scale = np.repeat(_f16(lane("d")), 32, axis=-1)
        if kind in ("Q4_1", "Q5_1"):
            offset = _f16(lane("m"))
    w = scale * (u.astype(np.float32) - BIAS.get(kind, 0))
    if offset is not None:
        w = w + offset  # (per lane: [rows, S, LANES, 1])
    return w.reshape(rows, -1)[:, :in_features]


# ------------------------------------------------------------------ a matrix in the file's types


class BlockCodes:
    """A matrix in a GGUF file's own types: segments of output rows, each (type, `pack`'s layout [rows, bytes]
    as a uint8 tensor), all with `in_features` inputs. One segment per file tensor; FastLlama's stacked q, k, v (and
    gate, up) keep each part's type (`cat`)."""

    def __init__(self, segments: list, in_features: int):
        self.segments, self.in_features = [(k, d) for k, d in segments], in_features

    @classmethod
    def from_file(cls, kind: str, data: np.ndarray, in_features: int) -> "BlockCodes":
        """A tensor's rows (the file's blocks, uint8 [rows, bytes]) in the kernel's layout."""
        return cls([(kind, torch.from_numpy(pack(kind, data)))], in_features)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((sum(d.shape[0] for _, d in self.segments), self.in_features))

    @property
    def device(self) -> torch.device:
        return self.segments[0][1].device

    @property
    def nbytes(self) -> int:
        return sum(d.numel() for _, d in self.segments)

    def dense(self) -> torch.Tensor:
        """The float32 weight [out, in]: the file's values."""
        parts = []
        for kind, data in self.segments:
            for start in range(0, data.shape[0], 4096):  # (in slices of rows: the temporaries stay small)
                parts.append(torch.from_numpy(dense(kind, data[start:start + 4096].numpy(), self.in_features)))
        return torch.cat(parts)

    def __getitem__(self, rows) -> "BlockCodes":
        """The matrix's output rows `rows` (an index tensor or a slice) of a one-segment matrix."""
        if len(self.segments) != 1:
            raise ValueError("rows of a matrix stacked from several GGUF tensors")
        kind, data = self.segments[0]
        return BlockCodes([(kind, data[rows])], self.in_features)

    @staticmethod
    def cat(parts: list) -> "BlockCodes":
        """Matrices stacked along their outputs (as torch.cat(dim=0) of the dense ones); neighbouring segments of one
        type become one."""
        runs = []  # (type, [data, ...]) of neighbouring segments of one type
        for part in parts:
            for kind, data in part.segments:
                if runs and runs[-1][0] == kind:
                    runs[-1][1].append(data)
                else:
                    runs.append((kind, [data]))
        return BlockCodes([(kind, run[0] if len(run) == 1 else torch.cat(run)) for kind, run in runs],
                          parts[0].in_features)


def mm(x: torch.Tensor, weight: BlockCodes, layout: str | None = None) -> torch.Tensor:
    """x [M, in] (CPU, any float dtype) @ W^T: float32 [M, out], on `layout`'s path (default: this CPU's). x is
    quantized once (gguf_block_quantize) for every segment of W."""
    lib, layout = kernel(), layout or path()
    xc = x.float().contiguous()
    M, in_features = xc.shape
    if in_features != weight.in_features:
        raise ValueError(f"GGUF block kernel: x [M, {in_features}] against a weight of {weight.in_features} inputs")
    xq = torch.empty((M, -(-in_features // (32 * LANES)) * X_RECORD), dtype=torch.uint8)
    lib.gguf_block_quantize(xc.data_ptr(), M, in_features, xq.data_ptr())
    out = weight.shape[0]
    y = torch.empty((M, out), dtype=torch.float32)
    run = lib.gguf_block_mm_vnni if layout == "vnni" else lib.gguf_block_mm_portable
    row = 0
    for kind, data in weight.segments:
        if run(KINDS.index(kind), xq.data_ptr(), M, in_features, data.data_ptr(), data.shape[0], y.data_ptr() + 4 * row,
               out):
            raise RuntimeError(f"the GGUF block kernel's {layout} path is not built here")
        row += data.shape[0]
    return y


def quantized_inputs(x: torch.Tensor) -> torch.Tensor:
    """The float32 values [M, in] the kernel multiplies by: x rounded to int8 per 32 inputs, times each group's d
    (torch's own computation of gguf_block_quantize's rounding, for tests and measurements)."""
    g = x.float().reshape(x.shape[0], -1, 32)
    amax = g.abs().amax(-1, keepdim=True)
    inverse = torch.full_like(amax, 127.0) / amax  # (`127 / amax` is reciprocal(amax) * 127 in torch: two roundings)
    return (torch.round(g * torch.where(amax > 0, inverse, 0)) * (amax / 127)).reshape(x.shape)

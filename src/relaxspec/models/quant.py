"""Weight formats a CPU user deploys: float32, bfloat16 and int4 weight-only (group-wise), for every model kind.

`--dtype` picks the format (`resolve_format`); on a CPU the large matrices of a model (its linear layers and
LM head) are stored once, in that format, and multiplied by a stock kernel:

* float32: oneDNN on the weight reordered once into its blocked layout, for one row (a decode step) and for a
  block of rows alike; small weights: `models/f32_kernels.py` (each weight read once per block of up to 8 rows,
  row-independent bits), or where that kernel cannot be built, or no oneDNN: sgemm on W^T. One copy.
* bfloat16: the weight in bfloat16 [out, in], multiplied by the activations rounded to bfloat16. Calls of up to
  `int4_block.BF16_ROWS` (64) rows (decode steps, verify blocks: every call of the LM head) go, where it builds
  (AVX-512 BF16, a C compiler), to `int4_block.bf16_mm`, which returns each output summed in float32, a row's bits
  the same whatever the call's other rows; a prompt's rows, and every call where the kernel cannot run, to
  `F.linear` (oneDNN), which rounds each output to bfloat16: a relative 2^-9 that ties logits float32 tells apart
  (steps of 0.125 near 20).
* file: a GGUF file's own quantized types (`gguf_block.BlockCodes`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K) kept as
  their codes and scales and multiplied by `models/gguf_block.py`'s kernel (the inputs quantized to int8 per 32, as
  llama.cpp's Q8_0); any other matrix, and every one where that kernel cannot be built, in float32 (the same values).
* int4: 4-bit codes per weight with a bfloat16 scale and zero per group of `GROUP_SIZE` inputs
  (w = (q - 8) * scale + zero), `aten._weight_int4pack_mm_for_cpu` on the activations rounded to bfloat16.
  The kernel needs `in_features % GROUP_SIZE == 0` (`int4_problem`); the output rows are padded with zero
  rows to a multiple of 16 (its packing), and the padding is sliced off. By default, where it can be built
  (AVX-512 BF16 or AVX2, a C compiler), `models/int4_block.py` instead, in its own layout of the same codes,
  scales and zeros (one copy): with AVX-512 VNNI, or AVX2 without AVX-512, the activations quantized to int8 per
  group of 32 and integer dot products (as llama.cpp's Q8_0 x Q4), else each group dequantized to bfloat16 once
  per block of up to 10 rows;
  RELAXSPEC_INT4_KERNEL=aten keeps aten's.

What stays float32 in every format: the activations between layers and the residual stream, norms and their
weights, RoPE, attention (softmax, KV cache), the embedding table, and the logits (always float32 before any
rule).

Blocks and single rows: the int4 and bfloat16 kernels give a row the same numbers whether it is multiplied alone or
in a block of N+1 rows (tested); oneDNN's float32 and bfloat16 (a prompt's) kernels may block the inner dimension
differently (a difference within their rounding), and so does attention (a block's masked softmax against one row's)
in every format. Strict greedy therefore equals AR greedy except at near-ties of the verifier's top two logits;
benchmarks/cpu_peer.py counts the divergences per format and prints each one's top-2 gap.

Quantizing: min-max per group (scale = (max - min) / 15, code = round((w - min) / scale)), from the float
weights. A GGUF file's Q4_1 tensors are dequantized by transformers (w = d q + m, with q spanning 0..15 in
each block of 32: llama.cpp sets m to the block's minimum and d to its range / 15), so quantizing them again
with groups of 32 recovers the file's own codes (measured: `gguf_code_agreement`), with d and m rounded to
bfloat16 (a relative 2^-9). Other 4-bit types (Q4_0, Q4_K) are quantized from the dequantized weights anew.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from relaxspec.models import f32_kernels, gguf_block, int4_block
from relaxspec.models.gguf_block import BlockCodes
from relaxspec.native import enabled as native_enabled

FORMATS = ("float32", "bfloat16", "int4", "file")
GROUP_SIZE = 32
INT4_OUT_MULTIPLE = 16  # the CPU int4 packing works on blocks of 16 output rows
# oneDNN's per-call overhead (~25 us) outweighs what it saves on weights below this size (measured crossover
# 150k-330k elements at 6 rows, AVX2); below it, and where oneDNN is missing, float32 uses sgemm.
ONEDNN_MIN_ELEMENTS = 1 << 18


def int4_problem(shape, group_size: int = GROUP_SIZE) -> str | None:
    """Why a weight [out, in] cannot be stored as int4 (None: it can)."""
    in_features = shape[1]
    if in_features % group_size:
        return f"in_features {in_features} is not a multiple of the group size {group_size}"
    return None


def quantize_int4(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Min-max 4-bit codes [out, in] (int32, 0..15) and (scale, zero) [in / group, out, 2] (bfloat16) of a
    float weight [out, in], in the form of the CPU int4 kernel: w = (q - 8) * scale + zero."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    codes = ((groups - low[..., None]) / scale[..., None]).round_().clamp_(0, 15).to(torch.int32)
    scale_zero = torch.stack([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return codes.reshape(out_features, in_features), scale_zero


def dequantize_int4(codes: torch.Tensor, scale_zero: torch.Tensor, group_size: int = GROUP_SIZE) -> torch.Tensor:
    """The float32 weight [out, in] that int4 codes and (scale, zero) stand for."""
    out_features, in_features = codes.shape
    scale, zero = scale_zero.float().transpose(0, 1).unbind(-1)  # [out, in / group] each
    groups = (codes.float() - 8).reshape(out_features, -1, group_size) * scale[..., None] + zero[..., None]
    return groups.reshape(out_features, in_features)


class Int4Codes:
    """A weight already in the int4 form (a GGUF file's own 4-bit codes, models/gguf_weights.py): codes [out, in]
    (uint8, 0..15) and (scale, zero) [in / group, out, 2] (bfloat16), w = (q - 8) * scale + zero. `Linear` stores
    it as it is in the int4 format (no re-quantization) and dequantizes it for any other format."""

    def __init__(self, codes: torch.Tensor, scale_zero: torch.Tensor):
        self.codes, self.scale_zero = codes, scale_zero

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dense(self) -> torch.Tensor:
        return dequantize_int4(self.codes, self.scale_zero, self.codes.shape[1] // self.scale_zero.shape[0])

    def __getitem__(self, rows) -> "Int4Codes":
        """The weight's output rows `rows` (an index tensor or a slice)."""
        return Int4Codes(self.codes[rows], self.scale_zero[:, rows])

    @staticmethod
    def cat(parts: list) -> "Int4Codes":
        """Weights stacked along their outputs (as torch.cat(dim=0) of the dense weights)."""
        return Int4Codes(torch.cat([p.codes for p in parts]), torch.cat([p.scale_zero for p in parts], dim=1))


def cat_weights(parts: list):
    """Weights stacked along their outputs: Int4Codes or BlockCodes when every part is one (the codes kept), else
    float32."""
    for codes in (Int4Codes, BlockCodes):
        if all(isinstance(p, codes) for p in parts):
            return codes.cat(parts)
    return torch.cat([p.dense() if isinstance(p, (Int4Codes, BlockCodes)) else p.detach().float() for p in parts])


def file_layout() -> str:
    """How `Linear` stores a GGUF file's matrix in the file format in this process: "blocks" (gguf_block's layout,
    the same on both of its paths) where its kernel runs, else "float32"."""
    return "blocks" if gguf_block.kernel() is not None else "float32"


def int4_layout(group_size: int = GROUP_SIZE) -> str:
    """How `Linear` stores an int4 weight in this process (`int4_impl` "auto"): the block kernel's layout, "vnni" or
    "bf16" (int4_block.path), where it runs, else "aten"."""
    if (os.environ.get("RELAXSPEC_INT4_KERNEL", "block") == "block" and group_size == int4_block.GROUP
            and native_enabled() and int4_block.kernel() is not None):
        return int4_block.path()
    return "aten"


class Linear:
    """x [M, in] (float32) @ W^T for one weight W [out, in] stored once in a format; float32 out [M, out].
    On a device other than the CPU (formats float32 / bfloat16 / float16 only) W^T is kept in that dtype and
    x is multiplied in it (the caller's compute dtype)."""

    def __init__(self, weight: torch.Tensor, fmt: str = "float32", group_size: int = GROUP_SIZE,
                 transposed: bool = False, int4_impl: str = "auto"):
        """`transposed`: keep W^T as a plain tensor (`t`) in a float format, for a caller that multiplies it
        itself (the compiled step: inductor picks the kernel). `int4_impl`: the int4 kernel, "block"
        (models/int4_block.py; where it cannot be built, aten with one warning line) or "aten"; "auto": the
        environment's RELAXSPEC_INT4_KERNEL if set, else block (groups of 32)."""
        self.gguf = None  # the file format's BlockCodes
        if isinstance(weight, BlockCodes):  # a GGUF file's types: kept in the file format, else dequantized
            if fmt == "file" and gguf_block.kernel() is not None:
                self.format, self.shape, self.group_size, self.gguf = fmt, tuple(weight.shape), group_size, weight
                self.packed = self.t = self.w = self.scale_zero = self.block = self.tiles = self.native = None
                self.bf16_kernel = False
                return
            weight = weight.dense()
        if fmt == "file":  # a matrix in no GGUF type of the kernel's, or no kernel: float32
            fmt = "float32"
        codes = None
        if isinstance(weight, Int4Codes):  # the int4 form already: kept as it is in int4, else dequantized
            if fmt == "int4" and weight.codes.shape[1] // weight.scale_zero.shape[0] == group_size:
                codes = weight
            weight = weight.codes if codes is not None else weight.dense()
        weight = weight.detach()
        self.format, self.shape, self.group_size = fmt, tuple(weight.shape), group_size
        self.packed = self.t = self.w = self.scale_zero = self.block = self.tiles = self.native = None
        self.bf16_kernel = False  # bfloat16 through int4_block.bf16_mm
        cpu = weight.device.type == "cpu"
        if fmt == "int4":
            if not cpu:
                raise ValueError("the int4 format runs on a CPU only")
            problem = int4_problem(weight.shape, group_size)
            if problem:
                raise ValueError(f"cannot store a weight {list(weight.shape)} as int4: {problem}")
            if int4_impl == "auto":
                int4_impl = os.environ.get("RELAXSPEC_INT4_KERNEL", "block")
            if (int4_impl == "block" and group_size == int4_block.GROUP and native_enabled()
                    and int4_block.kernel() is not None):
                self.block = int4_block.pack(*((codes.codes, codes.scale_zero) if codes is not None
                                               else quantize_int4(weight, group_size)))
                return
            pad = -weight.shape[0] % INT4_OUT_MULTIPLE
            if codes is not None:  # padding rows: codes 0, scale and zero 0 (outputs sliced off)
                q, self.scale_zero = codes.codes.to(torch.int32), F.pad(codes.scale_zero, (0, 0, 0, pad))
                q = F.pad(q, (0, 0, 0, pad))
            else:
                q, self.scale_zero = quantize_int4(F.pad(weight.float(), (0, 0, 0, pad)), group_size)
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        elif transposed:
            self.t = weight.to(_DTYPES[fmt]).t().contiguous()
        elif fmt == "bfloat16" and cpu:
            self.w = weight.to(torch.bfloat16).contiguous()
            self.bf16_kernel = (self.shape[1] % int4_block.GROUP == 0 and native_enabled()
                                and int4_block.has_bf16())
        elif (fmt == "float32" and cpu and weight.numel() >= ONEDNN_MIN_ELEMENTS
              and torch.backends.mkldnn.is_available()):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.float().contiguous(), 6)
        elif fmt == "float32" and cpu and weight.numel() < ONEDNN_MIN_ELEMENTS and f32_kernels.library() is not None:
            self.tiles, self.native = f32_kernels.pack(weight), f32_kernels.library()
        else:  # W^T [in, out] contiguous: `x @ W^T` on a row-major right operand (sgemm / cuBLAS)
            self.t = weight.to(_DTYPES[fmt]).t().contiguous()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x @ W^T, plus `residual` when given."""
        if self.t is not None:
            return torch.mm(x, self.t) if residual is None else torch.addmm(residual, x, self.t)
        if self.tiles is not None:
            return f32_kernels.block_mm(self.native, x, self.tiles, self.shape[0], residual)
        if self.gguf is not None:
            y = gguf_block.mm(x, self.gguf)
        elif self.w is not None:
            y = (int4_block.bf16_mm(x, self.w) if self.bf16_kernel and x.shape[0] <= int4_block.BF16_ROWS
                 else F.linear(x.to(torch.bfloat16), self.w).float())
        elif self.block is not None:
            y = int4_block.block_mm(x, *self.block)
        elif self.format == "int4":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, self.group_size,
                                                           self.scale_zero)[:, :self.shape[0]].float()
        else:
            y = torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return y if residual is None else y.add_(residual)

    def dense(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weight [out, in] this layer multiplies by: exact in float32 and bfloat16; in int4 the
        dequantized weight as the kernel sees it (each value rounded to bfloat16, read off an identity block); in the
        file format the file's values. `rows` (an index tensor): those output rows alone, `dense()[rows]`, made
        without the others where the layout keeps rows apart (int4 blocks, a one-tensor GGUF matrix, a transposed
        or plain weight): a head's 16k rows of a 152k-row LM head."""
        if rows is not None:
            if self.block is not None:
                codes, sz = self.block
                return int4_block.dense(codes[rows.to(codes.device)], sz[rows.to(codes.device)])
            if self.gguf is not None and len(self.gguf.segments) == 1:
                return self.gguf[rows.cpu()].dense()
            if self.t is not None:
                return self.t[:, rows.to(self.t.device)].t().float().contiguous()
            if self.w is not None:
                return self.w[rows.to(self.w.device)].float()
            return self.dense()[rows]
        if self.gguf is not None:
            return self.gguf.dense()
        if self.t is not None:
            return self.t.t().float().contiguous()
        if self.w is not None:
            return self.w.float()
        if self.tiles is not None:
            return f32_kernels.unpack(self.tiles, self.shape[0])
        if self.format == "float32":
            return self.packed.to_dense()  # oneDNN's blocked layout back to [out, in]: a permutation, exact
        if self.block is not None:
            return int4_block.dense(*self.block)
        eye = torch.eye(self.shape[1], dtype=torch.bfloat16, device="cpu")  # (int4 runs on a CPU only)
        return torch.cat([self(eye[i:i + 256]).t() for i in range(0, self.shape[1], 256)], dim=1).contiguous()

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """(meta, tensors) from which `restore` rebuilds this layer without converting anything again (the
        converted-weight cache, models/weight_cache.py): int4 in its kernel's own layout (the block kernel's packed
        codes and scale / zero words, or aten's packed codes with the scales), bfloat16 its matrix; float32 its
        dense matrix (oneDNN's blocked copy or the small-weight tiles are laid out again by `restore`)."""
        meta = {"format": self.format, "shape": list(self.shape), "group_size": self.group_size}
        if self.gguf is not None:
            return ({**meta, "kind": "gguf", "segments": [[kind, data.shape[0]] for kind, data in self.gguf.segments]},
                    {f"segment{i}": data for i, (_, data) in enumerate(self.gguf.segments)})
        if self.block is not None:
            return {**meta, "kind": "block", "layout": int4_block.path()}, {"codes": self.block[0],
                                                                           "sz": self.block[1]}
        if self.format == "int4":
            return {**meta, "kind": "aten"}, {"packed": self.packed, "scale_zero": self.scale_zero}
        if self.w is not None:
            return {**meta, "kind": "bfloat16"}, {"w": self.w}
        if self.t is not None and self.format != "float32":
            return {**meta, "kind": "t"}, {"t": self.t}
        return {**meta, "kind": "dense"}, {"dense": self.dense()}

    @classmethod
    def restore(cls, meta: dict, tensors: dict[str, torch.Tensor]) -> "Linear":
        """The layer `state` described, on its tensors as they are (memory-mapped ones stay mapped: no copy but
        float32's layout); a ValueError when this process would not run it so (another int4 kernel or layout)."""
        kind, fmt = meta["kind"], meta["format"]
        if kind == "dense":
            return cls(tensors["dense"], fmt, meta["group_size"])
        self = cls.__new__(cls)
        self.format, self.shape, self.group_size = fmt, tuple(meta["shape"]), meta["group_size"]
        self.packed = self.t = self.w = self.scale_zero = self.block = self.tiles = self.native = self.gguf = None
        self.bf16_kernel = False
        if kind == "gguf":
            if file_layout() != "blocks":
                raise ValueError("the file format's blocks stored; this process runs them in float32")
            segments = [(k, tensors[f"segment{i}"]) for i, (k, rows) in enumerate(meta["segments"])]
            if [d.shape[0] for _, d in segments] != [rows for _, rows in meta["segments"]]:
                raise ValueError("a segment of other rows than stored")
            self.gguf = BlockCodes(segments, self.shape[1])
            return self
        layout = int4_layout(self.group_size) if fmt == "int4" else None
        if kind in ("block", "aten") and (meta.get("layout") if kind == "block" else "aten") != layout:
            raise ValueError(f"int4 stored for the {meta.get('layout', 'aten')} layout; this process runs {layout}")
        if kind == "block":
            self.block = (tensors["codes"], tensors["sz"])
        elif kind == "aten":
            self.packed, self.scale_zero = tensors["packed"], tensors["scale_zero"]
        elif kind == "bfloat16":
            self.w = tensors["w"]
            self.bf16_kernel = (self.shape[1] % int4_block.GROUP == 0 and native_enabled()
                                and int4_block.has_bf16())
        elif kind == "t":
            self.t = tensors["t"]
        else:
            raise ValueError(f"unknown stored layer kind {kind!r}")
        return self

    @property
    def nbytes(self) -> int:
        """Bytes this weight keeps resident."""
        if self.gguf is not None:
            return self.gguf.nbytes
        return sum(t.numel() * t.element_size() for t in (self.t, self.w, self.scale_zero, self.packed, self.tiles,
                                                           *(self.block or ()))
                   if t is not None and not t.is_mkldnn) + (
            self.shape[0] * self.shape[1] * 4 if self.packed is not None and self.packed.is_mkldnn else 0)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class FormatLinear(torch.nn.Module):
    """An nn.Linear's weight in a format (its bias, if any, in float32): a drop-in for any leading dims."""

    def __init__(self, linear: torch.nn.Linear, fmt: str, group_size: int = GROUP_SIZE):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.linear = Linear(linear.weight, fmt, group_size)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().float(),
                                                                        requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x.reshape(-1, self.in_features).float()).view(*x.shape[:-1], self.out_features)
        return (y if self.bias is None else y + self.bias).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.linear.format}"


def linears(module: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    return [(name, m) for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)]


def check_format(module: torch.nn.Module, fmt: str, what: str, group_size: int = GROUP_SIZE) -> None:
    """A one-line ValueError when `module`'s linear layers cannot be stored in `fmt` (checked before any work)."""
    if fmt == "int4":
        for name, m in linears(module):
            problem = int4_problem(m.weight.shape, group_size)
            if problem:
                raise ValueError(f"{what} cannot run as int4: layer {name!r} {list(m.weight.shape)}: {problem}; "
                                 f"use --dtype bfloat16 or float32")


def convert_linears(module: torch.nn.Module, fmt: str, what: str = "model",
                    group_size: int = GROUP_SIZE) -> torch.nn.Module:
    """Every nn.Linear of `module` (any model: a transformers model, a drafter, an MTP head) replaced in place
    by a FormatLinear holding its weight once in `fmt` (float32, or off a CPU: left as it is). Shapes are checked first:
    a model that cannot be stored in `fmt` is one ValueError, with nothing converted."""
    if fmt not in ("bfloat16", "int4") or any(p.device.type != "cpu" for p in module.parameters()):
        return module  # (off a CPU the model is already in its dtype)
    check_format(module, fmt, what, group_size)
    for name, m in linears(module):
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, FormatLinear(m, fmt, group_size))
    return module


def gguf_format(path) -> str:
    """The precision class a GGUF file was shipped in, by the type of most elements of its blocks' matrices
    (`blk.*`: a file often keeps its embedding in another type, SmolLM2's Q4_1 file in Q8_0): int4 (any 4-bit
    type), bfloat16 (16- or 8-bit types) or float32."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for tensor in GGUFReader(str(path)).tensors:
        if len(tensor.shape) >= 2 and tensor.name.startswith("blk."):
            kind = tensor.tensor_type.name
            fmt = "int4" if kind.startswith(("Q4", "IQ4")) else "float32" if kind == "F32" else "bfloat16"
            counts[fmt] = counts.get(fmt, 0) + int(tensor.n_elements)
    return max(counts, key=counts.get) if counts else "float32"

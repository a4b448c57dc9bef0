"""Float32 kernels for FastLlama on a CPU: a small weight times a block of a few rows, RMSNorm, RoPE with the cache
write, and attention.

`block_mm`: MKL's sgemm repacks the weight on every call once there are several rows: on the built-in family's
matrices (64-1024 outputs, 64-512 inputs) a 4-row product cost 2-3.7x a one-row product, which priced the
verifier's (N+1)-token block at ~1.6 steps (c_block) though each weight is read once either way. This kernel
reads each weight once per call, from a layout packed once at load (tiles of 16 outputs: [out / 16, in, 16],
zero-padded), keeping 16-wide accumulators per row in registers (up to 8 rows at a time; output tiles
outermost, so a prefill's further chunks of 8 rows find the tile in cache); a 4-row product costs 1.2-1.6x a
one-row product. Row independence: each output of a row is one chain of fused multiply-adds over the inputs,
in order, then the residual added; no other row enters it, so a row multiplied alone or in any block gives the
same bits (tested), and through the linear layers strict greedy equals AR greedy by construction (attention
still differs within its rounding, see quant.py).

`rms_norm`: torch's CPU RMSNorm is a composite of ~8 operations (~9 us on a 64-576 wide row); this is one call
(~2 us): y = w * (x / sqrt(mean(x^2) + eps)), the mean summed in float32 in 16 lanes (HF's LlamaRMSNorm
order of operations; the sum's order differs from torch's within float32 rounding).

Plain C (models/csrc/f32_kernels.c, its interface f32_kernels.h) built by relaxspec.native (GCC vector extensions:
AVX-512, AVX2 or whatever the CPU has); where it cannot be built (or RELAXSPEC_NATIVE=0), quant.py keeps sgemm and
FastLlama torch's ops.
"""

from __future__ import annotations

from pathlib import Path

import torch

from relaxspec import native

TILE = 16

KERNEL = native.Kernel("f32_kernels", Path(__file__).resolve().parent / "csrc" / "f32_kernels.c",
                       Path(__file__).resolve().parent / "csrc" / "f32_kernels.h")
_STRUCTS = native.structs(KERNEL.header)  # the arguments of f32_attention and f32_rope_write, filled by name
_ATTENTION, _ROPE_WRITE = _STRUCTS["f32_attention_args"], _STRUCTS["f32_rope_write_args"]


def library():
    """The kernels' library (built on first use, cached), or None where it cannot be built (one warning) or
    RELAXSPEC_NATIVE=0. Its functions (csrc/f32_kernels.h): f32_block_mm, f32_rms_norm, f32_attention,
    f32_rope_write."""
    return native.load(KERNEL)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The kernel's layout [ceil(out / 16), in, 16] (float32, zero rows padding the outputs) of W [out, in]."""
    out, in_features = weight.shape
    padded = torch.nn.functional.pad(weight.float(), (0, 0, 0, -out % TILE))
    return padded.view(-1, TILE, in_features).transpose(1, 2).contiguous()


def unpack(tiles: torch.Tensor, out: int) -> torch.Tensor:
    """W [out, in] back from `pack`'s layout (exact)."""
    return tiles.transpose(1, 2).reshape(-1, tiles.shape[1])[:out].contiguous()


def block_mm(lib, x: torch.Tensor, tiles: torch.Tensor, out: int, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, in] (float32, CPU) @ W^T (+ residual [M, out], float32 contiguous) through `lib` (`library()`):
    float32 [M, out]. (A decode step's small linears cost a few microseconds: this stays lean.)"""
    if not x.is_contiguous():
        x = x.contiguous()
    y = x.new_empty((x.shape[0], out))
    lib.f32_block_mm(x.data_ptr(), x.shape[0], x.shape[1], tiles.data_ptr(), out, y.data_ptr(),
       None if residual is None else residual.contiguous().data_ptr())
    return y


def rms_norm(lib, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of x [..., C] (float32, CPU) with `weight` [C] (float32, contiguous) through
    `lib` (`library()`): float32, x's shape."""
    if not x.is_contiguous():
        x = x.contiguous()
    y = torch.empty_like(x)
    C = x.shape[-1]
    lib.f32_rms_norm(x.data_ptr(), x.numel() // C, C, weight.data_ptr(), eps, y.data_ptr())
    return y


def attention(lib, qkv: torch.Tensor, kv: torch.Tensor, bias: torch.Tensor | None, heads: int, kv_heads: int,
              head_dim: int, scratch: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + bias) v for the query heads in qkv [B, T, (H + 2 KVH) * D] (contiguous; its
    first H heads per token are q) over the cache's slots kv [B, 2 KVH, L, D] (keys then values; a view of the
    cache buffer whose rows are D contiguous floats), bias [B, 1, T, L] (contiguous, additive) or None, through
    `lib` (`library()`); `scratch`: float32, at least L + 16 values (overwritten). Returns
    [B * T, H * D] float32, the layout the output projection reads."""
    B, T = qkv.shape[0], qkv.shape[1]
    L, D = kv.shape[2], head_dim
    out = qkv.new_empty((B * T, heads * D))
    lib.f32_attention(_ATTENTION(qkv=qkv.data_ptr(), B=B, T=T, H=heads, KVH=kv_heads, D=D, kv=kv.data_ptr(),
                                 cap=kv.stride(1) // D, L=L, bias=None if bias is None else bias.data_ptr(),
                                 scale=D ** -0.5, out=out.data_ptr(), s=scratch.data_ptr()))
    return out


def rope_write(lib, qkv: torch.Tensor, rotation: torch.Tensor, buffer: torch.Tensor, past: int, heads: int,
               kv_heads: int, head_dim: int) -> torch.Tensor:
    """Rotate the q and k heads of qkv [B * T, (H + 2 KVH) * D] (contiguous float32) in place by `rotation` (complex64
    [B, T, 1, D / 2], contiguous: the pairs (2j, 2j + 1) of every head alike) and store its k and v heads at slots
    past..past + T of the cache `buffer` [B, 2 KVH, capacity, D] (contiguous) through `lib` (`library()`).
    Returns the keys and values of slots 0..past + T, [B, 2 KVH, past + T, D] (a view of the buffer)."""
    B, T = rotation.shape[0], rotation.shape[1]
    lib.f32_rope_write(_ROPE_WRITE(qkv=qkv.data_ptr(), B=B, T=T, H=heads, KVH=kv_heads, D=head_dim,
                                   rot=rotation.data_ptr(), kv=buffer.data_ptr(), cap=buffer.shape[2], past=past))
    return buffer[:, :, :past + T]

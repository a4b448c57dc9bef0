"""A float32 kernel for small weights times a block of a few rows (a verify block of N+1 tokens, a decode step).

MKL's sgemm repacks the weight on every call once there are several rows: on the built-in family's matrices
(64-1024 outputs, 64-512 inputs) a 4-row product cost 2-3.7x a one-row product, which priced the verifier's
(N+1)-token block at ~1.5 steps (c_block) though each weight is read once either way. This kernel reads each
weight once per block of up to 8 rows, from a layout packed once at load (tiles of 16 outputs: [out / 16, in,
16], zero-padded), keeping 16-wide accumulators per row in registers; a 4-row product then costs 1.2-1.6x a
one-row product (`benchmarks/model_speed.py`).

Row independence: each output of a row is one chain of fused multiply-adds over the inputs, in order, then the
residual added; no other row enters it, so a row multiplied alone or in any block gives the same bits (tested),
and through the linear layers strict greedy equals AR greedy by construction (attention still differs within
its rounding, see quant.py). Longer inputs (a prefill) run in chunks of 8 rows.

Plain C through relaxspec.native (GCC vector extensions: AVX-512, AVX2 or whatever the CPU has); where it
cannot be built, quant.py keeps sgemm.
"""

from __future__ import annotations

import ctypes

import torch

from relaxspec import native

TILE = 16

_SOURCE = r"""
#include <string.h>
typedef float v16 __attribute__((vector_size(64)));

/* Rows 0..M-1 of one chunk, outputs of tiles o16..o16+OT-1: y[m, o] = sum over i of x[m, i] w[o, i], in order
   (+ r[m, o]). wp: [tiles][in][16]. */
static inline __attribute__((always_inline)) void tile(const float* x, long M, long in, const float* wp, long o16,
                                                       int OT, float* y, const float* r, long out) {
  v16 acc[8][4];
  for (int m = 0; m < M; ++m)
    for (int t = 0; t < OT; ++t) acc[m][t] = (v16){0};
  for (long i = 0; i < in; ++i) {
    v16 w[4];
    for (int t = 0; t < OT; ++t) memcpy(&w[t], wp + ((o16 + t) * in + i) * 16, 64);
    for (int m = 0; m < M; ++m) {
      const float xv = x[m * in + i];
      for (int t = 0; t < OT; ++t) acc[m][t] += xv * w[t];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int t = 0; t < OT; ++t) {
      float v[16];
      memcpy(v, &acc[m][t], 64);
      const long o = (o16 + t) * 16;
      const int n = out - o < 16 ? (int)(out - o) : 16;
      for (int j = 0; j < n; ++j) y[m * out + o + j] = r ? v[j] + r[m * out + o + j] : v[j];
    }
}

#define CHUNK(MM)                                                                                      \
  static void chunk_##MM(const float* x, long in, const float* wp, long out, float* y, const float* r) { \
    const long tiles = (out + 15) / 16;                                                                \
    long o16 = 0;                                                                                      \
    for (; o16 + 4 <= tiles; o16 += 4) tile(x, MM, in, wp, o16, 4, y, r, out);                         \
    for (; o16 < tiles; ++o16) tile(x, MM, in, wp, o16, 1, y, r, out);                                 \
  }
CHUNK(1) CHUNK(2) CHUNK(3) CHUNK(4) CHUNK(5) CHUNK(6) CHUNK(7) CHUNK(8)

void f32_block_mm(const float* x, long M, long in, const float* wp, long out, float* y, const float* r) {
  for (long m0 = 0; m0 < M; m0 += 8) {
    const long k = M - m0 < 8 ? M - m0 : 8;
    const float* xs = x + m0 * in;
    float* ys = y + m0 * out;
    const float* rs = r ? r + m0 * out : 0;
    switch (k) {
      case 1: chunk_1(xs, in, wp, out, ys, rs); break;
      case 2: chunk_2(xs, in, wp, out, ys, rs); break;
      case 3: chunk_3(xs, in, wp, out, ys, rs); break;
      case 4: chunk_4(xs, in, wp, out, ys, rs); break;
      case 5: chunk_5(xs, in, wp, out, ys, rs); break;
      case 6: chunk_6(xs, in, wp, out, ys, rs); break;
      case 7: chunk_7(xs, in, wp, out, ys, rs); break;
      default: chunk_8(xs, in, wp, out, ys, rs); break;
    }
  }
}
"""

_P, _L = ctypes.c_void_p, ctypes.c_long


def kernel():
    """The loaded library (cached), or None where it cannot be built (one warning) or RELAXSPEC_NATIVE=0."""
    return native.load("f32_block", _SOURCE, (("f32_block_mm", None, (_P, _L, _L, _P, _L, _P, _P)),))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The kernel's layout [ceil(out / 16), in, 16] (float32, zero rows padding the outputs) of W [out, in]."""
    out, in_features = weight.shape
    padded = torch.nn.functional.pad(weight.float(), (0, 0, 0, -out % TILE))
    return padded.view(-1, TILE, in_features).transpose(1, 2).contiguous()


def unpack(tiles: torch.Tensor, out: int) -> torch.Tensor:
    """W [out, in] back from `pack`'s layout (exact)."""
    return tiles.transpose(1, 2).reshape(-1, tiles.shape[1])[:out].contiguous()


def block_mm(x: torch.Tensor, tiles: torch.Tensor, out: int, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, in] (float32, CPU) @ W^T (+ residual [M, out]): float32 [M, out]."""
    x = x.contiguous()
    y = torch.empty((x.shape[0], out), dtype=torch.float32, device=x.device)
    r = None if residual is None else residual.contiguous()
    kernel().f32_block_mm(x.data_ptr(), x.shape[0], x.shape[1], tiles.data_ptr(), out, y.data_ptr(),
                          None if r is None else r.data_ptr())
    return y

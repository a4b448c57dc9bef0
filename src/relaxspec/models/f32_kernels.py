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

Plain C through relaxspec.native (GCC vector extensions: AVX-512, AVX2 or whatever the CPU has); where it
cannot be built (or RELAXSPEC_NATIVE=0), quant.py keeps sgemm and FastLlama torch's ops.
"""

from __future__ import annotations

import ctypes

import torch

from relaxspec import native

TILE = 16

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
""" + native.EXP_NONPOSITIVE + r"""
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

/* One tile of OT x 16 outputs for rows m0.. of x (k <= 8 of them), M a constant in each case. */
static void rows(long k, const float* x, long in, const float* wp, long o16, int OT, float* y, const float* r,
                 long out) {
  switch (k) {
#define CASE(MM) case MM: if (OT == 4) tile(x, MM, in, wp, o16, 4, y, r, out); \
                          else tile(x, MM, in, wp, o16, 1, y, r, out); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) default: CASE(8)
#undef CASE
  }
}

/* Output tiles outermost, chunks of 8 rows inside: a tile of the weight (in x 64 floats) is read from memory once
   per call and from cache by the other chunks (a prefill). */
void f32_block_mm(const float* x, long M, long in, const float* wp, long out, float* y, const float* r) {
  const long tiles = (out + 15) / 16;
  for (long o16 = 0; o16 < tiles;) {
    const int OT = tiles - o16 >= 4 ? 4 : 1;
    for (long m0 = 0; m0 < M; m0 += 8)
      rows(M - m0 < 8 ? M - m0 : 8, x + m0 * in, in, wp, o16, OT, y + m0 * out, r ? r + m0 * out : 0, out);
    o16 += OT;
  }
}

/* y[m, :] = w * (x[m, :] / sqrt(mean(x[m, :]^2) + eps)) for M rows of C values. */
void f32_rms_norm(const float* x, long M, long C, const float* w, float eps, float* y) {
  for (long m = 0; m < M; ++m) {
    const float* xm = x + m * C;
    float* ym = y + m * C;
    v16 acc = {0};
    long i = 0;
    for (; i + 16 <= C; i += 16) {
      v16 v;
      memcpy(&v, xm + i, 64);
      acc += v * v;
    }
    float ss = 0;
    for (int j = 0; j < 16; ++j) ss += acc[j];
    for (; i < C; ++i) ss += xm[i] * xm[i];
    const float inv = 1.0f / sqrtf(ss / (float)C + eps);
    for (long c = 0; c < C; ++c) ym[c] = w[c] * (xm[c] * inv);
  }
}

typedef int i16 __attribute__((vector_size(64)));

static inline float hsum(v16 a) {
  a += __builtin_shuffle(a, (i16){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  a += __builtin_shuffle(a, (i16){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  a += __builtin_shuffle(a, (i16){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  a += __builtin_shuffle(a, (i16){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  return a[0];
}

/* One query head over L slots: o = softmax(q k^T * scale + bias) v, with DV = D / 16 vectors per row held in
   registers (DV > 0: D a multiple of 16, at most 128) or, DV = 0, any D. s: scratch of L + 16 floats. */
static inline __attribute__((always_inline)) void head(int DV, const float* q, const float* k, const float* v,
                                                       long D, long L, const float* bs, float scale, float* o,
                                                       float* s) {
  const long D16 = D / 16 * 16;
  v16 qv[8];
  for (int c = 0; c < DV; ++c) memcpy(&qv[c], q + 16 * c, 64);
  float m = -INFINITY;
  for (long j = 0; j < L; ++j) {
    const float* kj = k + j * D;
    v16 acc = {0};
    float dot;
    if (DV) {
      for (int c = 0; c < DV; ++c) {
        v16 kc;
        memcpy(&kc, kj + 16 * c, 64);
        acc += qv[c] * kc;
      }
      dot = hsum(acc);
    } else {
      long d = 0;
      for (; d < D16; d += 16) {
        v16 a, c;
        memcpy(&a, q + d, 64);
        memcpy(&c, kj + d, 64);
        acc += a * c;
      }
      dot = hsum(acc);
      for (; d < D; ++d) dot += q[d] * kj[d];
    }
    const float x = dot * scale + (bs ? bs[j] : 0.0f);
    s[j] = x;
    m = x > m ? x : m;
  }
  for (long j = 0; j < L; ++j) s[j] = exp_nonpositive(s[j] - m);
  for (long j = L; j < L + 16; ++j) s[j] = 0; /* s has 16 floats of slack */
  v16 z = {0};
  for (long j = 0; j < L; j += 16) {
    v16 x;
    memcpy(&x, s + j, 64);
    z += x;
  }
  const float inv = 1.0f / hsum(z);
  if (DV) {
    v16 ov[8];
    for (int c = 0; c < DV; ++c) ov[c] = (v16){0};
    for (long j = 0; j < L; ++j) {
      const float p = s[j];
      const float* vj = v + j * D;
      for (int c = 0; c < DV; ++c) {
        v16 vc;
        memcpy(&vc, vj + 16 * c, 64);
        ov[c] += p * vc;
      }
    }
    for (int c = 0; c < DV; ++c) {
      ov[c] *= inv;
      memcpy(o + 16 * c, &ov[c], 64);
    }
    return;
  }
  for (long d = 0; d < D; ++d) o[d] = 0;
  for (long j = 0; j < L; ++j) {
    const float p = s[j];
    const float* vj = v + j * D;
    for (long d = 0; d < D; ++d) o[d] += p * vj[d];
  }
  for (long d = 0; d < D; ++d) o[d] *= inv;
}

/* Attention of T new queries per row over L cache slots, one head at a time: softmax(q k^T * scale + bias) v.
   q: heads 0..H-1 of qkv [B * T, (H + 2 KVH) * D]; k, v: the cache [B, 2 KVH, cap, D] (keys, then values);
   bias [B, 1, T, L] (additive) or NULL; GQA: head h reads group h / (H / KVH). out: [B * T, H * D], the
   layout the output projection reads. s: scratch of L + 16 floats. */
void f32_attention(const float* qkv, long B, long T, long H, long KVH, long D, const float* kv, long cap, long L,
                   const float* bias, float scale, float* out, float* s) {
  const long NH = H + 2 * KVH, per_group = H / KVH;
  for (long b = 0; b < B; ++b)
    for (long t = 0; t < T; ++t)
      for (long h = 0; h < H; ++h) {
        const long g = h / per_group;
        const float* q = qkv + ((b * T + t) * NH + h) * D;
        const float* k = kv + (b * 2 * KVH + g) * cap * D;
        const float* v = kv + (b * 2 * KVH + KVH + g) * cap * D;
        const float* bs = bias ? bias + (b * T + t) * L : 0;
        float* o = out + ((b * T + t) * H + h) * D;
        switch (D) {
          case 32: head(2, q, k, v, D, L, bs, scale, o, s); break;
          case 64: head(4, q, k, v, D, L, bs, scale, o, s); break;
          case 128: head(8, q, k, v, D, L, bs, scale, o, s); break;
          default: head(0, q, k, v, D, L, bs, scale, o, s); break;
        }
      }
}

/* RoPE on the q and k heads of qkv [B * T, (H + 2 KVH) * D] in place (pairs (2j, 2j + 1) times the complex
   rot [B * T, D / 2]), then the k and v heads stored at slot past + t of the cache [B, 2 KVH, cap, D]. */
void f32_rope_write(float* qkv, long B, long T, long H, long KVH, long D, const float* rot, float* kv, long cap,
                    long past) {
  const long NH = H + 2 * KVH;
  for (long b = 0; b < B; ++b)
    for (long t = 0; t < T; ++t) {
      float* row = qkv + (b * T + t) * NH * D;
      const float* r = rot + (b * T + t) * D;
      for (long h = 0; h < H + KVH; ++h) {
        float* x = row + h * D;
        for (long j = 0; j < D; j += 2) {
          const float a = x[j], c = x[j + 1];
          x[j] = a * r[j] - c * r[j + 1];
          x[j + 1] = a * r[j + 1] + c * r[j];
        }
      }
      for (long g = 0; g < KVH; ++g) {
        memcpy(kv + ((b * 2 * KVH + g) * cap + past + t) * D, row + (H + g) * D, D * sizeof(float));
        memcpy(kv + ((b * 2 * KVH + KVH + g) * cap + past + t) * D, row + (H + KVH + g) * D, D * sizeof(float));
      }
    }
}
"""

_P, _L = ctypes.c_void_p, ctypes.c_long


def library():
    """The kernels' library (built on first use, cached), or None where it cannot be built (one warning) or
    RELAXSPEC_NATIVE=0. Its functions: f32_block_mm, f32_rms_norm, f32_attention, f32_rope_write."""
    return native.load("f32_kernels", _SOURCE, (("f32_block_mm", None, (_P, _L, _L, _P, _L, _P, _P)),
                                                ("f32_rms_norm", None, (_P, _L, _L, _P, ctypes.c_float, _P)),
                                                ("f32_attention", None, (_P, _L, _L, _L, _L, _L, _P, _L, _L, _P,
                                                                         ctypes.c_float, _P, _P)),
                                                ("f32_rope_write", None, (_P, _L, _L, _L, _L, _L, _P, _P, _L, _L))))


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
    lib.f32_attention(qkv.data_ptr(), B, T, heads, kv_heads, D, kv.data_ptr(), kv.stride(1) // D, L,
       None if bias is None else bias.data_ptr(), D ** -0.5, out.data_ptr(), scratch.data_ptr())
    return out


def rope_write(lib, qkv: torch.Tensor, rotation: torch.Tensor, buffer: torch.Tensor, past: int, heads: int,
               kv_heads: int, head_dim: int) -> torch.Tensor:
    """Rotate the q and k heads of qkv [B * T, (H + 2 KVH) * D] (contiguous float32) in place by `rotation` (complex64
    [B, T, 1, D / 2], contiguous: the pairs (2j, 2j + 1) of every head alike) and store its k and v heads at slots
    past..past + T of the cache `buffer` [B, 2 KVH, capacity, D] (contiguous) through `lib` (`library()`).
    Returns the keys and values of slots 0..past + T, [B, 2 KVH, past + T, D] (a view of the buffer)."""
    B, T = rotation.shape[0], rotation.shape[1]
    lib.f32_rope_write(qkv.data_ptr(), B, T, heads, kv_heads, head_dim, rotation.data_ptr(), buffer.data_ptr(),
                       buffer.shape[2], past)
    return buffer[:, :, :past + T]

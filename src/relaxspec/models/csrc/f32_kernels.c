/* FastLlama's float32 kernels on a CPU (models/f32_kernels.py); its interface is f32_kernels.h. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exp_nonpositive.h"
#include "f32_kernels.h"


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
#define CASE(MM) case MM: if (OT == 4) { tile(x, MM, in, wp, o16, 4, y, r, out); } \
                          else { tile(x, MM, in, wp, o16, 1, y, r, out); } break;
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
   layout the output projection reads. s: scratch of L + 16 floats. (Its arguments: the fields of args.) */
void f32_attention(const struct f32_attention_args* args) {
  const struct f32_attention_args a = *args;
  const long NH = a.H + 2 * a.KVH, per_group = a.H / a.KVH, D = a.D, L = a.L;
  for (long b = 0; b < a.B; ++b)
    for (long t = 0; t < a.T; ++t)
      for (long h = 0; h < a.H; ++h) {
        const long g = h / per_group;
        const float* q = a.qkv + ((b * a.T + t) * NH + h) * D;
        const float* k = a.kv + (b * 2 * a.KVH + g) * a.cap * D;
        const float* v = a.kv + (b * 2 * a.KVH + a.KVH + g) * a.cap * D;
        const float* bs = a.bias ? a.bias + (b * a.T + t) * L : 0;
        float* o = a.out + ((b * a.T + t) * a.H + h) * D;
        switch (D) {
          case 32: head(2, q, k, v, D, L, bs, a.scale, o, a.s); break;
          case 64: head(4, q, k, v, D, L, bs, a.scale, o, a.s); break;
          case 128: head(8, q, k, v, D, L, bs, a.scale, o, a.s); break;
          default: head(0, q, k, v, D, L, bs, a.scale, o, a.s); break;
        }
      }
}

/* RoPE on the q and k heads of qkv [B * T, (H + 2 KVH) * D] in place (pairs (2j, 2j + 1) times the complex
   rot [B * T, D / 2]), then the k and v heads stored at slot past + t of the cache [B, 2 KVH, cap, D]. (Its
   arguments: the fields of args.) */
void f32_rope_write(const struct f32_rope_write_args* args) {
  const struct f32_rope_write_args a = *args;
  const long H = a.H, KVH = a.KVH, D = a.D, NH = H + 2 * KVH;
  for (long b = 0; b < a.B; ++b)
    for (long t = 0; t < a.T; ++t) {
      float* row = a.qkv + (b * a.T + t) * NH * D;
      const float* r = a.rot + (b * a.T + t) * D;
      for (long h = 0; h < H + KVH; ++h) {
        float* x = row + h * D;
        for (long j = 0; j < D; j += 2) {
          const float x0 = x[j], x1 = x[j + 1];
          x[j] = x0 * r[j] - x1 * r[j + 1];
          x[j + 1] = x0 * r[j + 1] + x1 * r[j];
        }
      }
      for (long g = 0; g < KVH; ++g) {
        memcpy(a.kv + ((b * 2 * KVH + g) * a.cap + a.past + t) * D, row + (H + g) * D, D * sizeof(float));
        memcpy(a.kv + ((b * 2 * KVH + KVH + g) * a.cap + a.past + t) * D, row + (H + KVH + g) * D, D * sizeof(float));
      }
    }
}

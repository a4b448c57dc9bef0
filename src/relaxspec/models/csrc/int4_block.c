/* The int4 block kernel (models/int4_block.py): y = x @ W^T for M rows of bfloat16 inputs x [M, in] against W in
   its packed int4 layout (codes [out, in / 2], one scale-and-zero word per group of 32 [out, in / 32]), each group
   dequantized to bfloat16 once per call of up to 10 rows and applied with AVX-512 BF16 dot products; its sibling
   for bfloat16 weights (bf16_block_mm); and the int8-activation path (int4_block_mm_q8). Outputs are split
   between OpenMP threads (the process's runtime: torch's, and its thread count), never a dot product. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "int4_block.h"
#include "parallel_for.h"

#define MAX_ROWS 10

typedef struct {
  const uint16_t* x;
  int64_t in;
  const uint8_t* codes;
  const int32_t* sz;
  float* y;
  int64_t out;
} problem;

/* Output tile of OT rows of W, M rows of x: y[m, o] = sum over groups of dot(bf16(q * s + z'), x_bf16[m]).
   M and OT are constants where it is inlined. */
static inline __attribute__((always_inline)) void tile(const int M, const int OT, const problem* p, int64_t o) {
  const int64_t in = p->in, G = in / 32;
  const __m512i low4 = _mm512_set1_epi32(0xF);
  __m512 acc[4][MAX_ROWS];
  for (int t = 0; t < OT; ++t)
    for (int m = 0; m < M; ++m) acc[t][m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512bh w[4];
    for (int t = 0; t < OT; ++t) {
      const __m512i b =
          _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p->codes + (o + t) * (in / 2) + 16 * g)));
      const __m512i s32 = _mm512_set1_epi32(p->sz[(o + t) * G + g]);
      const __m512 s = _mm512_castsi512_ps(_mm512_and_si512(s32, _mm512_set1_epi32((int)0xFFFF0000u)));
      const __m512 z = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), s, _mm512_castsi512_ps(_mm512_slli_epi32(s32, 16)));
      const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, low4)), s, z);  /* inputs 0..15 */
      const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), s, z);    /* inputs 16..31 */
      w[t] = _mm512_cvtne2ps_pbh(hi, lo);  /* 32 bfloat16 in input order */
    }
    for (int m = 0; m < M; ++m) {
      const __m512bh xm = (__m512bh)_mm512_loadu_si512((const void*)(p->x + m * in + 32 * g));
      for (int t = 0; t < OT; ++t) acc[t][m] = _mm512_dpbf16_ps(acc[t][m], w[t], xm);
    }
  }
  for (int t = 0; t < OT; ++t)
    for (int m = 0; m < M; ++m) p->y[m * p->out + o + t] = _mm512_reduce_add_ps(acc[t][m]);
}

/* M rows: tiles of OT outputs (OT = 4 up to 4 rows, else 2) split between threads, then the last outputs one by
   one. */
#define ROWS(MM)                                                                        \
  static void tiles_##MM(const void* p, int64_t begin, int64_t end) {                   \
    for (int64_t i = begin; i < end; ++i) tile(MM, (MM) <= 4 ? 4 : 2, p, i * ((MM) <= 4 ? 4 : 2)); \
  }                                                                                     \
  static void run_##MM(const problem* p) {                                              \
    const int OT = (MM) <= 4 ? 4 : 2;                                                   \
    const int64_t tiles = p->out / OT;                                                  \
    parallel_for(tiles, 8, tiles_##MM, p);                                              \
    for (int64_t o = tiles * OT; o < p->out; ++o) tile(MM, 1, p, o);                    \
  }
ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8) ROWS(9) ROWS(10)
#undef ROWS

/* y [M, out] float32 = x [M, in] (bfloat16 bits, contiguous) @ W^T, in chunks of MAX_ROWS rows; in a multiple of
   32, codes and sz in int4_block.py's packed layout (`pack`). */
void int4_block_mm(const uint16_t* x, int64_t M, int64_t in, const uint8_t* codes, const int32_t* sz, float* y,
                   int64_t out) {
  static void (*const runs[MAX_ROWS])(const problem*) = {run_1, run_2, run_3, run_4, run_5,
                                                         run_6, run_7, run_8, run_9, run_10};
  for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
    const problem p = {x + m0 * in, in, codes, sz, y + m0 * out, out};
    const int64_t rows = M - m0 < MAX_ROWS ? M - m0 : MAX_ROWS;
    runs[rows - 1](&p);
  }
}

/* ---- bfloat16 weights (quant.py's bfloat16 format), bf16_block_mm: y[m, o] = one float32 chain of vdpbf16ps over
   the inputs of W's row o (bfloat16 [out, in], read as stored) and x's row m (rounded to bfloat16, as oneDNN
   rounds it), returned in float32. oneDNN's bfloat16 GEMM rounds each output to bfloat16 (a relative 2^-9): logits
   that float32 tells apart come out tied. A row's numbers do not depend on the call's other rows, its chunking or
   the threads, so a row alone, in a verify block or in a prompt gets the same bits. */

#define X_BLOCK_BYTES (512 << 10) /* a block of rows' inputs, kept in L2 while every output tile passes over it */

typedef struct {
  const uint16_t* x;
  int64_t in, M; /* M rows in this block */
  const uint16_t* w;
  float* y;
  int64_t out;
  int OT;        /* outputs per tile: 4 up to 4 rows in the call, else 2 (the accumulators stay in registers) */
} bproblem;

/* Rows [m0, m0 + M) against outputs o..o + OT - 1 (M and OT constants where it is inlined). */
static inline __attribute__((always_inline)) void btile(const int M, const int OT, const bproblem* p, int64_t m0,
                                                        int64_t o) {
  const int64_t in = p->in, G = in / 32;
  __m512 acc[4][MAX_ROWS];
  for (int t = 0; t < OT; ++t)
    for (int m = 0; m < M; ++m) acc[t][m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512bh w[4];
    for (int t = 0; t < OT; ++t) w[t] = (__m512bh)_mm512_loadu_si512((const void*)(p->w + (o + t) * in + 32 * g));
    for (int m = 0; m < M; ++m) {
      const __m512bh xm = (__m512bh)_mm512_loadu_si512((const void*)(p->x + (m0 + m) * in + 32 * g));
      for (int t = 0; t < OT; ++t) acc[t][m] = _mm512_dpbf16_ps(acc[t][m], w[t], xm);
    }
  }
  for (int t = 0; t < OT; ++t)
    for (int m = 0; m < M; ++m) p->y[(m0 + m) * p->out + o + t] = _mm512_reduce_add_ps(acc[t][m]);
}

/* Every chunk of up to MAX_ROWS rows of the block against outputs o..o + ot - 1 (ot: the problem's OT, or 1). */
static void bcolumn(const bproblem* p, int ot, int64_t o) {
  for (int64_t m0 = 0; m0 < p->M; m0 += MAX_ROWS) {
    switch (p->M - m0 < MAX_ROWS ? p->M - m0 : MAX_ROWS) {
#define CASE(MM) case MM: {                                                                                      \
          if (ot == 1) btile(MM, 1, p, m0, o);                                                                 \
          else if ((MM) <= 4 && ot == 4) btile(MM, 4, p, m0, o);                                               \
          else btile(MM, 2, p, m0, o);                                                                         \
          break;                                                                                               \
        }
      CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) default: CASE(10)
#undef CASE
    }
  }
}

static void btiles(const void* arg, int64_t begin, int64_t end) {
  const bproblem* p = arg;
  for (int64_t i = begin; i < end; ++i) bcolumn(p, p->OT, i * p->OT);
}

/* y [M, out] float32 = x [M, in] (bfloat16 bits, contiguous) @ W^T, W [out, in] bfloat16 (contiguous), in a
   multiple of 32: per block of rows (their inputs stay in cache), output tiles split between threads, each tile's
   weights read once per block. */
void bf16_block_mm(const uint16_t* x, int64_t M, int64_t in, const uint16_t* w, float* y, int64_t out) {
  const int OT = M <= 4 ? 4 : 2;
  int64_t block = X_BLOCK_BYTES / (2 * in) / MAX_ROWS * MAX_ROWS;
  block = block < MAX_ROWS ? MAX_ROWS : block;
  for (int64_t b0 = 0; b0 < M; b0 += block) {
    const bproblem p = {x + b0 * in, in, M - b0 < block ? M - b0 : block, w, y + b0 * out, out, OT};
    parallel_for(out / OT, 8, btiles, &p);
    for (int64_t o = out / OT * OT; o < out; ++o) bcolumn(&p, 1, o);
  }
}

/* ---- The int8-activation path (AVX-512 VNNI), int4_block_mm_q8: each row of x quantized per group of 32 to int8
   with a float scale d (symmetric, round to nearest: x ~ d * x8, as llama.cpp's Q8_0), and per group
   sum_i w_i x_i = d * (s * sum_i q_i x8_i + z' * sum_i x8_i), the first sum by vpdpbusd (unsigned codes times
   signed inputs, exact in int32). The codes in `pack`'s VNNI layout: per superblock of 16 groups (256 bytes),
   4 registers of 64 bytes, register k holding at bytes 4g..4g+3 group g's bytes 4k..4k+3 (codes 4k..4k+3 in the
   low nibbles, 16+4k..16+4k+3 in the high ones), so each 32-bit lane of the dot products sums one group; a last
   partial superblock of r groups packs its 4 registers in 4r bytes each, or where r <= 4 keeps its groups'
   16 bytes in order (one register, group g in lanes 4g..4g+3, its scales spread to them). */

#include "int4_q8.h"

/* Rows [m0, m0 + M) against outputs o..o + OT - 1: y[m, o + t] = sum over lanes of the float accumulator, which
   gets per superblock d * s * (integer dot product) and z' * c lane by lane (lane g: group g). The same steps
   for a row whatever M, OT and m0 (M and OT are constants where it is inlined). */
static inline __attribute__((always_inline)) void qtile(const int M, const int OT, const qproblem* p, int64_t m0,
                                                        int64_t o) {
  const int64_t G = p->G, S = p->S, row_bytes = G * 16;
  const int tail = (int)(G - (S - 1) * SB); /* groups in the last superblock, 1..16 */
  const __m512i low4 = _mm512_set1_epi8(0x0F), high16 = _mm512_set1_epi32((int)0xFFFF0000u);
  const __m512i spread4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 acc[4][MAX_ROWS];
  _Pragma("GCC unroll 16") for (int t = 0; t < OT; ++t)
    _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) acc[t][m] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < S; ++sb) {
    const int r = sb < S - 1 ? SB : tail;
    const int bytes = r <= SB / 4 ? 16 * r : 4 * r; /* of a register */
    const __mmask64 cmask = bytes >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << bytes) - 1);
    const __mmask16 smask = (__mmask16)((1u << r) - 1);
    _Pragma("GCC unroll 16") for (int t = 0; t < OT; ++t) {
      const uint8_t* cb = p->codes + (o + t) * row_bytes + sb * (SB * 16);
      _Pragma("GCC unroll 4") for (int k = 0; k < 4; ++k) _mm_prefetch((const char*)cb + PREFETCH + 64 * k, _MM_HINT_T0);
      __m512i sz = _mm512_maskz_loadu_epi32(smask, p->sz + (o + t) * G + sb * SB);
      if (r <= SB / 4) sz = _mm512_permutexvar_epi32(spread4, sz); /* lane l: group l / 4 */
      const __m512 s = _mm512_castsi512_ps(_mm512_and_si512(sz, high16));
      const __m512 z = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), s, _mm512_castsi512_ps(_mm512_slli_epi32(sz, 16)));
      __m512i dot[MAX_ROWS];
      _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) dot[m] = _mm512_setzero_si512();
      if (r <= SB / 4) { /* a last superblock of 1..4 groups in one register, group g in lanes 4g..4g+3 */
        const __m512i b = _mm512_maskz_loadu_epi8(cmask, cb);
        const __m512i lo = _mm512_and_si512(b, low4), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
        _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) {
          const int8_t* xm = p->x8 + (m0 + m) * S * SB_BYTES + sb * SB_BYTES;
          dot[m] = _mm512_dpbusd_epi32(dot[m], lo, _mm512_loadu_si512((const void*)xm));
          dot[m] = _mm512_dpbusd_epi32(dot[m], hi, _mm512_loadu_si512((const void*)(xm + 256)));
        }
      } else
      _Pragma("GCC unroll 16") for (int k = 0; k < 4; ++k) {
        const __m512i b = _mm512_maskz_loadu_epi8(cmask, cb + 4 * r * k);
        const __m512i lo = _mm512_and_si512(b, low4), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
        _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) {
          const int8_t* xm = p->x8 + (m0 + m) * S * SB_BYTES + sb * SB_BYTES;
          dot[m] = _mm512_dpbusd_epi32(dot[m], lo, _mm512_loadu_si512((const void*)(xm + 64 * k)));
          dot[m] = _mm512_dpbusd_epi32(dot[m], hi, _mm512_loadu_si512((const void*)(xm + 256 + 64 * k)));
        }
      }
      _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) {
        const int64_t at = (m0 + m) * S * SB + sb * SB;
        const __m512 ds = _mm512_mul_ps(s, _mm512_loadu_ps(p->d + at));
        acc[t][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m]), ds, acc[t][m]);
        acc[t][m] = _mm512_fmadd_ps(z, _mm512_loadu_ps(p->c + at), acc[t][m]);
      }
    }
  }
  _Pragma("GCC unroll 16") for (int t = 0; t < OT; ++t)
    _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) p->y[(m0 + m) * p->out + o + t] = _mm512_reduce_add_ps(acc[t][m]);
}

/* The group's 32 inputs rounded to int8 (int4_q8.h): d = max |x| / 127, x8 = round(x / d) (nearest even). */
static inline __attribute__((always_inline)) float quantize_group(const float* xg, int8_t bytes[32], int32_t* sum) {
  const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id))); /* round to nearest even */
  const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(id)));
  _mm_storeu_si128((__m128i*)bytes, _mm512_cvtsepi32_epi8(qa));
  _mm_storeu_si128((__m128i*)(bytes + 16), _mm512_cvtsepi32_epi8(qb));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  return d;
}

#define QTILE_OT(MM) ((MM) == 1 ? 4 : (MM) == 2 ? 2 : 1) /* outputs per tile: 4 for one row, 2 for two, else 1 */
#include "int4_q8_drivers.h"

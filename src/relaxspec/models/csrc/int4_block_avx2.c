/* The int4 kernel's int8-activation path (int4_block_mm_q8) for CPUs with AVX2 and FMA but no AVX-512
   (models/int4_block.py): the same codes (`pack`'s "vnni" layout), the same int8 inputs and, lane by lane, the
   same float32 operations in the same order as int4_block.c's AVX-512 VNNI path, so a row gets the bits it gets
   there. Each 16-lane register of that path (lane g: group g of a superblock) is two 8-lane halves here, run one
   after the other over a row (lanes 0..7, then 8..15); the integer dot product of a lane, which vpdpbusd sums in
   int32, is summed here by vpmaddubsw (pairs of unsigned codes times signed inputs, into int16: at most
   2 * 15 * 127 a pair, no saturation), eight of those added in int16 (at most 30480, no overflow), then vpmaddwd
   (pairs into int32): the same integer, exactly. The float32 steps per lane and superblock are that path's:
   acc = fma(float(dot), s * d, acc), then acc = fma(z', c, acc); the 16 lanes summed in _mm512_reduce_add_ps's
   order (the upper 8 lanes plus the lower, then 4 + 4, 2 + 2, 1 + 1). Lanes past a last superblock's groups hold
   zeros there and are skipped here (adding zero leaves a lane's sum as it is). */
#include <immintrin.h>
#include <stdint.h>

#include "int4_block.h"
#include "int4_q8.h"

#define MAX_ROWS 6 /* rows per pass (int4_q8_drivers.h's Q_ROWS) */

/* The first n (0..8) 32-bit lanes set. */
static inline __attribute__((always_inline)) __m256i first_lanes(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 32 bytes at p, of which the first `lanes` 32-bit words are read (zero past them). */
static inline __attribute__((always_inline)) __m256i load_lanes(const void* p, int lanes) {
  return lanes >= 8 ? _mm256_loadu_si256((const __m256i*)p) : _mm256_maskload_epi32((const int*)p, first_lanes(lanes));
}

/* The sum of 16 float lanes (lo: 0..7, hi: 8..15) in the order GCC's _mm512_reduce_add_ps sums them. */
static inline __attribute__((always_inline)) float reduce16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_add_ps(hi, lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

/* Half h (lanes 8h..8h + 7) of superblock sb of output o's row against rows [m0, m0 + M): each row's lanes added
   to acc[m]. r: the superblock's groups (16, a constant where inlined for every superblock but the last). */
static inline __attribute__((always_inline)) void half_superblock(const int M, const qproblem* p, int64_t m0,
                                                                  int64_t o, int64_t sb, const int r, const int h,
                                                                  __m256* acc) {
  const int compact = r <= SB / 4;                       /* one register, group g in lanes 4g..4g+3 */
  const int lanes = compact ? 4 * r - 8 * h : r - 8 * h; /* this half's lanes that hold a group */
  if (lanes <= 0) return;
  const __m256i low4 = _mm256_set1_epi8(0x0F), high16 = _mm256_set1_epi32((int)0xFFFF0000u);
  const int64_t S = p->S;
  const uint8_t* cb = p->codes + o * p->G * 16 + sb * (SB * 16);
  if (h == 0) /* the second half reads the lines the first brought in */
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; ++k) _mm_prefetch((const char*)cb + PREFETCH + 64 * k, _MM_HINT_T0);
  const int32_t* szp = p->sz + o * p->G + sb * SB;
  const __m256i sz = compact ? _mm256_permutevar8x32_epi32(load_lanes(szp + 2 * h, r - 2 * h),
                                                           _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1))
                             : load_lanes(szp + 8 * h, lanes);
  const __m256 s = _mm256_castsi256_ps(_mm256_and_si256(sz, high16));
  const __m256 z = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), s, _mm256_castsi256_ps(_mm256_slli_epi32(sz, 16)));
  __m256i sum[MAX_ROWS]; /* each row's int16 sums, run by run */
  _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) sum[m] = _mm256_setzero_si256();
  for (int k = 0; k < (compact ? 1 : 4); ++k) { /* unrolled where r is a constant */
    const __m256i b = load_lanes(cb + 4 * r * k + 32 * h, lanes);
    const __m256i lo = _mm256_and_si256(b, low4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
    _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) {
      const int8_t* xm = p->x8 + (m0 + m) * S * SB_BYTES + sb * SB_BYTES + 64 * k + 32 * h;
      sum[m] = _mm256_add_epi16(sum[m], _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i*)xm)));
      sum[m] = _mm256_add_epi16(sum[m], _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i*)(xm + 256))));
    }
  }
  _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) {
    const int64_t at = (m0 + m) * S * SB + sb * SB + 8 * h;
    const __m256 ds = _mm256_mul_ps(s, _mm256_loadu_ps(p->d + at));
    const __m256i dot = _mm256_madd_epi16(sum[m], _mm256_set1_epi16(1));
    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), ds, acc[m]);
    acc[m] = _mm256_fmadd_ps(z, _mm256_loadu_ps(p->c + at), acc[m]);
  }
}

/* Rows [m0, m0 + M) against outputs o..o + OT - 1 (int4_q8.h): each lane's steps in the superblocks' order (the
   halves in either order: their lanes are apart), the halves summed at the end. */
static inline __attribute__((always_inline)) void qtile(const int M, const int OT, const qproblem* p, int64_t m0,
                                                        int64_t o) {
  const int64_t S = p->S;
  const int tail = (int)(p->G - (S - 1) * SB); /* groups in the last superblock, 1..16 */
  __m256 acc[2][4][MAX_ROWS];
  _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h)
    _Pragma("GCC unroll 16") for (int t = 0; t < OT; ++t)
      _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m) acc[h][t][m] = _mm256_setzero_ps();
  if (M * OT <= 4) { /* few accumulators: both halves of a superblock in turn, each line of codes used at once */
    for (int64_t sb = 0; sb < S - 1; ++sb)
      _Pragma("GCC unroll 16") for (int t = 0; t < OT; ++t)
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) half_superblock(M, p, m0, o + t, sb, SB, h, acc[h][t]);
    _Pragma("GCC unroll 16") for (int t = 0; t < OT; ++t)
      _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) half_superblock(M, p, m0, o + t, S - 1, tail, h, acc[h][t]);
  } else { /* half 0 of every superblock, then half 1: half the accumulators live at a time */
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
      for (int64_t sb = 0; sb < S - 1; ++sb)
        _Pragma("GCC unroll 16") for (int t = 0; t < OT; ++t) half_superblock(M, p, m0, o + t, sb, SB, h, acc[h][t]);
      _Pragma("GCC unroll 16") for (int t = 0; t < OT; ++t)
        half_superblock(M, p, m0, o + t, S - 1, tail, h, acc[h][t]);
    }
  }
  _Pragma("GCC unroll 16") for (int t = 0; t < OT; ++t)
    _Pragma("GCC unroll 16") for (int m = 0; m < M; ++m)
      p->y[(m0 + m) * p->out + o + t] = reduce16(acc[0][t][m], acc[1][t][m]);
}

/* The group's 32 inputs rounded to int8 (int4_q8.h), as int4_block.c rounds them. */
static inline __attribute__((always_inline)) float quantize_group(const float* xg, int8_t bytes[32], int32_t* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], amax8 = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xg + 8 * i);
    amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, v[i]));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, amax8);
  float amax = 0.0f;
  for (int i = 0; i < 8; ++i) amax = lanes[i] > amax ? lanes[i] : amax;
  const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t q[32];
  for (int i = 0; i < 4; ++i) /* round to nearest even */
    _mm256_storeu_si256((__m256i*)(q + 8 * i), _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id))));
  int32_t total = 0;
  for (int i = 0; i < 32; ++i) {
    bytes[i] = (int8_t)q[i]; /* |q| <= 127 */
    total += q[i];
  }
  *sum = total;
  return d;
}

/* One output per tile: with 16 registers, a second output's accumulators and codes spill, and each output's codes
   are one sequential stream for the prefetchers (measured on a Zen 3 EPYC, 2 threads, 12 matrices of the 1.5B's
   shapes: one row 11.0 ms against 14.2 with 4 outputs per tile, 2-24 rows no slower). */
#define QTILE_OT(MM) 1
#include "int4_q8_drivers.h"

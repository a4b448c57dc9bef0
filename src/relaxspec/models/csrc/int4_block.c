/* The int4 block kernel (models/int4_block.py): y = x @ W^T for M rows of bfloat16 inputs x [M, in] against W in
   its packed int4 layout (codes [out, in / 2], one scale-and-zero word per group of 32 [out, in / 32]), each group
   dequantized to bfloat16 once per call of up to 10 rows and applied with AVX-512 BF16 dot products. Outputs are
   split between OpenMP threads (the process's runtime: torch's, and its thread count), never a dot product. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "int4_block.h"

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

typedef void (*tiles_fn)(const problem* p, int64_t begin, int64_t end);

/* f over [0, n) in chunks of at least `grain`, one per thread, as torch's at::parallel_for splits a range (OpenMP
   backend): serially where n <= grain, inside a parallel region, or with one thread. */
static void parallel_for(int64_t n, int64_t grain, tiles_fn f, const problem* p) {
  if (n <= 0) return;
  if (n <= grain || omp_in_parallel() || omp_get_max_threads() == 1) {
    f(p, 0, n);
    return;
  }
#pragma omp parallel
  {
    int64_t threads = omp_get_num_threads();
    const int64_t most = (n + grain - 1) / grain;
    threads = threads < most ? threads : most;
    const int64_t chunk = (n + threads - 1) / threads, begin = omp_get_thread_num() * chunk;
    if (begin < n) f(p, begin, begin + chunk < n ? begin + chunk : n);
  }
}

/* M rows: tiles of OT outputs (OT = 4 up to 4 rows, else 2) split between threads, then the last outputs one by
   one. */
#define ROWS(MM)                                                                        \
  static void tiles_##MM(const problem* p, int64_t begin, int64_t end) {                \
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

/* The GGUF block kernel (models/gguf_block.py): y = x @ W^T for W in a GGUF file's own quantized types (Q4_0, Q4_1,
   Q5_0, Q5_1, Q8_0, Q4_K, Q6_K), each kept as its codes and scales, for any number of rows of x (a decode step, a
   verify block, a prompt).

   The inputs: each row of x quantized to int8 per 32 inputs (symmetric, d = max|x| / 127, round to nearest even:
   llama.cpp's Q8_0 rounding, with d kept in float32) once per call (gguf_block_quantize), shared by the calls of the
   weight's parts (a stacked q, k, v of several types).

   Superblocks of 16 lanes, lane j the 32 inputs 32j..32j+31 (one block of the 32-input types, one sub-block of
   Q4_K, two of Q6_K); the last superblock of a row may hold fewer lanes, r. Eight registers of 64 bytes: register
   4h + k (h = 0, 1; k = 0..3) holds at bytes 4j..4j+3 lane j's inputs 16h + 4k .. 16h + 4k + 3, so that a vpdpbusd
   sums 4 products into lane j's own 32-bit lane, and h = 0 is a lane's first 16 inputs, h = 1 its last 16. A weight
   row is its superblocks' records one after the other, each its codes, bit planes and scales:
     codes, unsigned u (the type's signed code plus its bias 2^SHIFT), each register's 4r bytes in turn:
       4-bit nibbles: 4 registers, register k's low nibbles register k's codes, its high nibbles register 4 + k's;
       Q8_0: the 8 registers' bytes (u = q + 128).
     bit planes (Q5_0, Q5_1: bit 4; Q6_K: bits 4, then 5), each 8 masks of 64 bits, register 0..7's (bit 4j + t).
     scales, float16 values as the file holds them:
       Q4_0, Q5_0, Q8_0: d per lane (r x float16);                       w = d (u - bias)
       Q4_1, Q5_1: d per lane, then m per lane;                          w = d u + m
       Q4_K: d, d of the second block, dmin, dmin of the second (float16; lanes 0..7 the first block of 256, 8..15
             the second), sc per lane, m per lane (uint8, 6-bit values); w = (d sc) u - dmin m
       Q6_K: d, d of the second block (float16), sc of each lane's first 16 inputs, then of its last 16 (int8);
             w = (d sc) (u - 32)

   A row's quantized inputs, per superblock (XREC bytes): the 8 registers of int8 (lanes past the last zero), then per
   lane dx (float32: its d), -sum of its 32 int8, -sum of its first 16 (int32), and dx * sum (float32).

   Per output and row, lane by lane and superblock by superblock in order: an exact int32 dot product of the codes
   and the int8 inputs, less bias * sum (so the integer is sum (u - bias) x8), then acc = fma(float(dot), scale * dx,
   acc), and for the types with an offset acc = fma(offset, dx * sum, acc); Q6_K does the two halves of a lane each
   with its own scale, first then last. The output is the 16 lanes summed in one fixed order (sum16). Two paths
   compute exactly these operations: AVX-512 VNNI intrinsics (gguf_block_mm_vnni, compiled where -march=native has
   AVX-512 F, BW, VL and VNNI) and plain C (gguf_block_mm_portable): the same bits on both (tested). A row's numbers
   do not depend on the call's other rows or the threads (outputs are split between threads, never a dot product). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif

#include "gguf_block.h"
#include "parallel_for.h"

enum { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, KINDS }; /* models/gguf_block.py's KINDS, in this order */

#define LANES 16
#define SB (32 * LANES)       /* inputs per superblock */
#define XREC 768              /* bytes of one row's quantized inputs per superblock: */
#define X_DX 512              /*   after the 512 int8: dx per lane (float32), */
#define X_NSUM 576            /*   -sum of the lane's int8 (int32), */
#define X_NSUM_LO 640         /*   -sum of its first 16 (int32), */
#define X_C 704               /*   dx * sum (float32) */
#define ROWS 4                /* rows per pass over an output's weights (VNNI) */
#define GRAIN 16              /* outputs per unit of the split between threads */
#define X_BLOCK_BYTES (256 << 10) /* a block of rows' quantized inputs, kept in L2 while the outputs pass over it */
#define PREFETCH 2048         /* weight bytes read ahead */

static inline int bits_of(const int kind) {
  return kind == Q8_0 ? 8 : kind == Q6_K ? 6 : (kind == Q5_0 || kind == Q5_1) ? 5 : 4;
}
static inline int planes_of(const int kind) { return bits_of(kind) == 8 ? 0 : bits_of(kind) - 4; }
/* Bytes of a superblock of r lanes: codes and planes, then scales. */
static inline int64_t code_bytes(const int kind, const int r) {
  return (bits_of(kind) == 8 ? 32 * r : 16 * r) + 64 * planes_of(kind);
}
static inline int64_t scale_bytes(const int kind, const int r) {
  return (kind == Q4_1 || kind == Q5_1) ? 4 * r : kind == Q4_K ? 8 + 2 * r : kind == Q6_K ? 4 + 2 * r : 2 * r;
}
static inline int64_t record_bytes(const int kind, const int r) { return code_bytes(kind, r) + scale_bytes(kind, r); }
/* the codes' bias as a power of two (-1: none; those types have an offset instead) */
static inline int shift_of(const int kind) {
  return kind == Q4_0 ? 3 : kind == Q5_0 ? 4 : kind == Q6_K ? 5 : kind == Q8_0 ? 7 : -1;
}
static inline int has_offset(const int kind) { return kind == Q4_1 || kind == Q5_1 || kind == Q4_K; }

/* Bytes of one weight row of `in` inputs (a multiple of 32); -1 for an unknown kind. */
int64_t gguf_block_row_bytes(int32_t kind, int64_t in) {
  if (kind < 0 || kind >= KINDS) return -1;
  const int64_t groups = in / 32, tail = groups % LANES;
  return groups / LANES * record_bytes(kind, LANES) + (tail ? record_bytes(kind, (int)tail) : 0);
}

int32_t gguf_block_vnni(void) { return HAVE_VNNI; }

static inline uint16_t read16(const uint8_t* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

/* A float16's value (exact). */
static float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  uint32_t bits;
  float f;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {
    f = (float)mantissa * 5.9604644775390625e-08f; /* a subnormal: mantissa 2^-24, exact */
    memcpy(&bits, &f, 4);
    bits |= sign;
  }
  memcpy(&f, &bits, 4);
  return f;
}

/* The outputs' lanes summed: (v_i + v_{i+8}), then (a_i + a_{i+4}), then (b_0 + b_2) + (b_1 + b_3). */
static inline float sum16(const float v[16]) {
  float a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

/* ---- the inputs */

typedef struct {
  const float* x;
  int64_t in, S;
  uint8_t* xq;
} quantize_job;

static inline int x8_at(int lane, int i) { /* byte of input i (0..31) of a lane in a superblock's registers */
  return 64 * (4 * (i / 16) + (i % 16) / 4) + 4 * lane + i % 4;
}

static void quantize_rows(const void* arg, int64_t begin, int64_t end) {
  const quantize_job* job = arg;
  for (int64_t m = begin; m < end; ++m) {
    uint8_t* row = job->xq + m * job->S * XREC;
    memset(row, 0, (size_t)(job->S * XREC)); /* the lanes past the last: zero */
    for (int64_t g = 0; g < job->in / 32; ++g) {
      const float* xg = job->x + m * job->in + 32 * g;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(xg[i]));
      const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
      uint8_t* xs = row + (g / LANES) * XREC;
      const int lane = (int)(g % LANES);
      int32_t sum = 0, first = 0;
      for (int i = 0; i < 32; ++i) {
        const int q = (int)nearbyintf(xg[i] * id); /* |q| <= 127 */
        sum += q;
        first += i < 16 ? q : 0;
        xs[x8_at(lane, i)] = (uint8_t)(int8_t)q;
      }
      ((float*)(xs + X_DX))[lane] = d;
      ((int32_t*)(xs + X_NSUM))[lane] = -sum;
      ((int32_t*)(xs + X_NSUM_LO))[lane] = -first;
      ((float*)(xs + X_C))[lane] = d * (float)sum;
    }
  }
}

/* xq [M, ceil(in / 512) * XREC] from x [M, in] (float32, contiguous, in a multiple of 32). */
void gguf_block_quantize(const float* x, int64_t M, int64_t in, uint8_t* xq) {
  const quantize_job job = {x, in, (in + SB - 1) / SB, xq};
  parallel_for(M, 4, quantize_rows, &job);
}

/* ---- the product */

typedef struct {
  int32_t kind;
  const uint8_t* xq;
  int64_t M, in;
  const uint8_t* w;
  float* y;
  int64_t ldy, row_bytes;
} mm_job;

static int64_t rows_per_block(int64_t in) {
  const int64_t block = X_BLOCK_BYTES / (((in + SB - 1) / SB) * XREC) / ROWS * ROWS;
  return block < ROWS ? ROWS : block;
}

/* Lanes in superblock sb of a row of `groups` groups of 32. */
static inline int lanes_of(int64_t groups, int64_t sb) {
  return groups - LANES * sb < LANES ? (int)(groups - LANES * sb) : LANES;
}

/* -- plain C */

/* A superblock's codes u, lane by lane (u[32 j + i]: lane j's input i; zero past its r lanes). */
static void codes_of(int kind, int r, const uint8_t* b, uint8_t u[SB]) {
  const int bits = bits_of(kind), planes = planes_of(kind), at = bits == 8 ? 32 * r : 16 * r;
  memset(u, 0, SB);
  for (int j = 0; j < r; ++j)
    for (int i = 0; i < 32; ++i) {
      const int h = i / 16, k = (i % 16) / 4, reg = 4 * h + k, pos = 4 * j + i % 4;
      int v = bits == 8 ? b[reg * 4 * r + pos] : (b[k * 4 * r + pos] >> (4 * h)) & 15;
      for (int pl = 0; pl < planes; ++pl) v |= ((b[at + 64 * pl + 8 * reg + pos / 8] >> (pos % 8)) & 1) << (4 + pl);
      u[32 * j + i] = (uint8_t)v;
    }
}

/* A superblock's scales per lane (Q6_K: s its lanes' first 16 inputs, s2 their last 16) and offsets (zero past its
   r lanes). */
static void scales_of(int kind, int r, const uint8_t* rec, float s[LANES], float s2[LANES], float mn[LANES]) {
  for (int j = 0; j < LANES; ++j) s[j] = s2[j] = mn[j] = 0.0f;
  for (int j = 0; j < r; ++j) {
    switch (kind) {
      case Q4_1:
      case Q5_1:
        mn[j] = half_to_float(read16(rec + 2 * r + 2 * j));
        /* fall through */
      case Q4_0:
      case Q5_0:
      case Q8_0:
        s[j] = half_to_float(read16(rec + 2 * j));
        break;
      case Q4_K:
        s[j] = half_to_float(read16(rec + 2 * (j / 8))) * (float)rec[8 + j];
        mn[j] = -(half_to_float(read16(rec + 4 + 2 * (j / 8))) * (float)rec[8 + r + j]);
        break;
      default: /* Q6_K */
        s[j] = half_to_float(read16(rec + 2 * (j / 8))) * (float)(int8_t)rec[4 + j];
        s2[j] = half_to_float(read16(rec + 2 * (j / 8))) * (float)(int8_t)rec[4 + r + j];
    }
  }
}

static float row_portable(int kind, const uint8_t* w, const uint8_t* xq, int64_t in) {
  const int64_t groups = in / 32, S = (groups + LANES - 1) / LANES;
  const int shift = shift_of(kind), offset = has_offset(kind);
  float acc[LANES] = {0}, s[LANES], s2[LANES], mn[LANES];
  uint8_t u[SB];
  for (int64_t sb = 0; sb < S; ++sb) {
    const int r = lanes_of(groups, sb);
    const uint8_t* xs = xq + sb * XREC;
    const float* dx = (const float*)(xs + X_DX);
    const int32_t *nsum = (const int32_t*)(xs + X_NSUM), *nlo = (const int32_t*)(xs + X_NSUM_LO);
    const float* c = (const float*)(xs + X_C);
    codes_of(kind, r, w, u);
    scales_of(kind, r, w + code_bytes(kind, r), s, s2, mn);
    for (int l = 0; l < LANES; ++l) {
      const uint8_t* ul = u + 32 * l;
      if (kind == Q6_K) {
        int32_t lo = nlo[l] * 32, hi = (nsum[l] - nlo[l]) * 32;
        for (int i = 0; i < 16; ++i) lo += (int32_t)ul[i] * (int32_t)(int8_t)xs[x8_at(l, i)];
        for (int i = 16; i < 32; ++i) hi += (int32_t)ul[i] * (int32_t)(int8_t)xs[x8_at(l, i)];
        acc[l] = fmaf((float)lo, s[l] * dx[l], acc[l]);
        acc[l] = fmaf((float)hi, s2[l] * dx[l], acc[l]);
        continue;
      }
      int32_t dot = shift >= 0 ? nsum[l] * (1 << shift) : 0;
      for (int i = 0; i < 32; ++i) dot += (int32_t)ul[i] * (int32_t)(int8_t)xs[x8_at(l, i)];
      acc[l] = fmaf((float)dot, s[l] * dx[l], acc[l]);
      if (offset) acc[l] = fmaf(mn[l], c[l], acc[l]);
    }
    w += record_bytes(kind, r);
  }
  return sum16(acc);
}

static void portable_outputs(const void* arg, int64_t begin, int64_t end) {
  const mm_job* p = arg;
  const int64_t block = rows_per_block(p->in), xrow = ((p->in + SB - 1) / SB) * XREC;
  for (int64_t b0 = 0; b0 < p->M; b0 += block) {
    const int64_t b1 = b0 + block < p->M ? b0 + block : p->M;
    for (int64_t o = begin; o < end; ++o)
      for (int64_t m = b0; m < b1; ++m)
        p->y[m * p->ldy + o] = row_portable(p->kind, p->w + o * p->row_bytes, p->xq + m * xrow, p->in);
  }
}

/* y[m * ldy + o] (m < M, o < out) = row m of the quantized inputs xq (gguf_block_quantize of `in` inputs) against
   output o of w (out rows of gguf_block_row_bytes each, of `kind`); -1 for an unknown kind. */
int32_t gguf_block_mm_portable(int32_t kind, const uint8_t* xq, int64_t M, int64_t in, const uint8_t* w,
                               int64_t out, float* y, int64_t ldy) {
  if (kind < 0 || kind >= KINDS) return -1;
  const mm_job p = {kind, xq, M, in, w, y, ldy, gguf_block_row_bytes(kind, in)};
  parallel_for(out, GRAIN, portable_outputs, &p);
  return 0;
}

/* -- AVX-512 VNNI: the same operations, 16 lanes at once */

#if HAVE_VNNI
static inline float vsum16(__m512 v) { /* sum16's order */
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

static inline __mmask64 mask_at(const uint8_t* p) { /* 64 bits, little-endian: bit p is byte p's */
  uint64_t bits;
  memcpy(&bits, p, 8);
  return _cvtu64_mask64(bits);
}

static inline __m512 negate(__m512 v) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u)));
}

/* Rows [m0, m0 + R) against output o (kind and R constants where it is inlined). */
static inline __attribute__((always_inline)) void vnni_rows(const int kind, const int R, const mm_job* p, int64_t o,
                                                            int64_t m0) {
  const int bits = bits_of(kind), planes = planes_of(kind), shift = shift_of(kind);
  const int64_t groups = p->in / 32, S = (groups + LANES - 1) / LANES;
  const uint8_t* b = p->w + o * p->row_bytes;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i by8 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); /* lane j: block j / 8 */
  __m512 acc[ROWS];
  for (int m = 0; m < R; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < S; ++sb) {
    const int r = lanes_of(groups, sb);
    const int64_t rb = record_bytes(kind, r);
    const __mmask64 cmask = r == LANES ? ~(__mmask64)0 : (((__mmask64)1 << (4 * r)) - 1);
    const __mmask16 smask = (__mmask16)((1u << r) - 1);
    for (int k = 0; k < rb; k += 64) _mm_prefetch((const char*)b + PREFETCH + k, _MM_HINT_T0);
    __m512i lo[4], hi[4]; /* registers k and 4 + k */
    for (int k = 0; k < 4; ++k) {
      if (bits == 8) {
        lo[k] = _mm512_maskz_loadu_epi8(cmask, b + 4 * r * k);
        hi[k] = _mm512_maskz_loadu_epi8(cmask, b + 4 * r * (4 + k));
        continue;
      }
      const __m512i nib = _mm512_maskz_loadu_epi8(cmask, b + 4 * r * k);
      lo[k] = _mm512_and_si512(nib, low4);
      hi[k] = _mm512_and_si512(_mm512_srli_epi16(nib, 4), low4);
      for (int pl = 0; pl < planes; ++pl) {
        const __m512i bit = _mm512_set1_epi8((char)(16 << pl));
        lo[k] = _mm512_mask_add_epi8(lo[k], mask_at(b + 16 * r + 64 * pl + 8 * k), lo[k], bit);
        hi[k] = _mm512_mask_add_epi8(hi[k], mask_at(b + 16 * r + 64 * pl + 8 * (4 + k)), hi[k], bit);
      }
    }
    const uint8_t* rec = b + code_bytes(kind, r);
    __m512 s, s2 = _mm512_setzero_ps(), mn = _mm512_setzero_ps();
    if (kind == Q4_K) {
      const __m512 dd = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)rec)));
      const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(smask, rec + 8)));
      const __m512 m8 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(smask, rec + 8 + r)));
      s = _mm512_mul_ps(_mm512_permutexvar_ps(by8, dd), sc);
      mn = negate(_mm512_mul_ps(_mm512_permutexvar_ps(_mm512_add_epi32(by8, _mm512_set1_epi32(2)), dd), m8));
    } else if (kind == Q6_K) {
      int32_t d2;
      memcpy(&d2, rec, 4);
      const __m512 d = _mm512_permutexvar_ps(by8, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(d2))));
      s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(smask, rec + 4))));
      s2 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(smask, rec + 4 + r))));
    } else {
      s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(smask, rec));
      if (has_offset(kind)) mn = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(smask, rec + 2 * r));
    }
    for (int m = 0; m < R; ++m) {
      const uint8_t* xs = p->xq + (m0 + m) * S * XREC + sb * XREC;
      const __m512 dx = _mm512_loadu_ps((const float*)(xs + X_DX));
      if (kind == Q6_K) {
        const __m512i nlo = _mm512_loadu_si512((const void*)(xs + X_NSUM_LO));
        __m512i dlo = _mm512_slli_epi32(nlo, 5);
        __m512i dhi = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_loadu_si512((const void*)(xs + X_NSUM)), nlo), 5);
        for (int k = 0; k < 4; ++k) {
          dlo = _mm512_dpbusd_epi32(dlo, lo[k], _mm512_loadu_si512((const void*)(xs + 64 * k)));
          dhi = _mm512_dpbusd_epi32(dhi, hi[k], _mm512_loadu_si512((const void*)(xs + 64 * (4 + k))));
        }
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dlo), _mm512_mul_ps(s, dx), acc[m]);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dhi), _mm512_mul_ps(s2, dx), acc[m]);
        continue;
      }
      __m512i dot = shift >= 0 ? _mm512_slli_epi32(_mm512_loadu_si512((const void*)(xs + X_NSUM)), shift)
                               : _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        dot = _mm512_dpbusd_epi32(dot, lo[k], _mm512_loadu_si512((const void*)(xs + 64 * k)));
        dot = _mm512_dpbusd_epi32(dot, hi[k], _mm512_loadu_si512((const void*)(xs + 64 * (4 + k))));
      }
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s, dx), acc[m]);
      if (has_offset(kind)) acc[m] = _mm512_fmadd_ps(mn, _mm512_loadu_ps((const float*)(xs + X_C)), acc[m]);
    }
    b += rb;
  }
  for (int m = 0; m < R; ++m) p->y[(m0 + m) * p->ldy + o] = vsum16(acc[m]);
}

#define VNNI_KIND(K)                                                                \
  static void vnni_##K(const mm_job* p, int64_t o, int64_t m0, int64_t rows) {      \
    switch (rows) {                                                                 \
      case 1: vnni_rows(K, 1, p, o, m0); break;                                     \
      case 2: vnni_rows(K, 2, p, o, m0); break;                                     \
      case 3: vnni_rows(K, 3, p, o, m0); break;                                     \
      default: vnni_rows(K, 4, p, o, m0);                                           \
    }                                                                               \
  }
VNNI_KIND(Q4_0) VNNI_KIND(Q4_1) VNNI_KIND(Q5_0) VNNI_KIND(Q5_1) VNNI_KIND(Q8_0) VNNI_KIND(Q4_K) VNNI_KIND(Q6_K)
#undef VNNI_KIND

/* Outputs [begin, end): for each block of rows (their quantized inputs stay in cache), each output against its
   rows ROWS at a time (its weights stay in cache): each weight read from memory once per block of rows. */
static void vnni_outputs(const void* arg, int64_t begin, int64_t end) {
  static void (*const kinds[KINDS])(const mm_job*, int64_t, int64_t, int64_t) = {
      vnni_Q4_0, vnni_Q4_1, vnni_Q5_0, vnni_Q5_1, vnni_Q8_0, vnni_Q4_K, vnni_Q6_K};
  const mm_job* p = arg;
  const int64_t block = rows_per_block(p->in);
  for (int64_t b0 = 0; b0 < p->M; b0 += block) {
    const int64_t b1 = b0 + block < p->M ? b0 + block : p->M;
    for (int64_t o = begin; o < end; ++o)
      for (int64_t m0 = b0; m0 < b1; m0 += ROWS) kinds[p->kind](p, o, m0, b1 - m0 < ROWS ? b1 - m0 : ROWS);
  }
}
#endif

/* As gguf_block_mm_portable, through AVX-512 VNNI; -1 where this library was built without it. */
int32_t gguf_block_mm_vnni(int32_t kind, const uint8_t* xq, int64_t M, int64_t in, const uint8_t* w, int64_t out,
                           float* y, int64_t ldy) {
#if HAVE_VNNI
  if (kind < 0 || kind >= KINDS) return -1;
  const mm_job p = {kind, xq, M, in, w, y, ldy, gguf_block_row_bytes(kind, in)};
  parallel_for(out, GRAIN, vnni_outputs, &p);
  return 0;
#else
  (void)kind, (void)xq, (void)M, (void)in, (void)w, (void)out, (void)y, (void)ldy;
  return -1;
#endif
}

/* The int4 kernel's int8-activation path (int4_block_mm_q8) written out one float32 operation at a time, in the
   order int4_block.c's AVX-512 VNNI code performs them lane by lane (built with -ffp-contract=off: no operation
   fused that the kernel does not fuse): the inputs rounded to int8 per group of 32 (d = max |x| / 127,
   x8 = rint(x * (127 / max |x|))), then per output and superblock of 16 groups, per lane l (group l; in a last
   superblock of 1..4 groups, lane 4g + j holds inputs 4j..4j+3 and 16+4j..16+4j+3 of group g), the integer dot
   product of the lane's codes and inputs, acc_l = fma(float(dot), s * d, acc_l), acc_l = fma(z', c, acc_l) with
   z' = fma(-8, s, zero) and c = d * sum of the group's x8 (in the group's first lane only); the 16 lanes summed as
   GCC's _mm512_reduce_add_ps sums them. The codes are read in `pack`'s "vnni" layout. A kernel that gives these
   bits on every instruction set gives a row the same bits on every machine. */
#include "int4_q8_reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Code i (0..31) of group gl (0..r-1) of superblock sb of output o's row, in the "vnni" layout. */
static int code(const uint8_t* row, int64_t sb, int r, int gl, int i) {
  const uint8_t* block = row + sb * 16 * 16;
  const int j = i & 15; /* byte j of the group: code j low, code j + 16 high */
  const uint8_t byte = r <= 4 ? block[16 * gl + j] : block[4 * r * (j / 4) + 4 * gl + j % 4];
  return i < 16 ? byte & 15 : byte >> 4;
}

void int4_q8_reference(const float* x, int64_t M, int64_t in, const uint8_t* codes, const int32_t* sz, float* y,
                       int64_t out) {
  const int64_t G = in / 32, S = (G + 15) / 16;
  int8_t* x8 = malloc((size_t)in);
  float* d = malloc((size_t)G * sizeof(float));
  float* c = malloc((size_t)G * sizeof(float));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const float* xg = x + m * in + 32 * g;
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = fabsf(xg[i]) > amax ? fabsf(xg[i]) : amax;
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const float scaled = xg[i] * id;
        x8[32 * g + i] = (int8_t)rintf(scaled);
        sum += x8[32 * g + i];
      }
      d[g] = amax / 127.0f;
      c[g] = d[g] * (float)sum;
    }
    for (int64_t o = 0; o < out; ++o) {
      const uint8_t* row = codes + o * (in / 2);
      float acc[16] = {0};
      for (int64_t sb = 0; sb < S; ++sb) {
        const int r = (int)(sb < S - 1 ? 16 : G - 16 * sb);
        for (int l = 0; l < 16; ++l) {
          const int gl = r <= 4 ? l / 4 : l;
          if (gl >= r) continue; /* zeros in the kernel's lane: its sum unchanged */
          const int64_t g = 16 * sb + gl;
          const int first = r <= 4 ? 4 * (l % 4) : 0, count = r <= 4 ? 4 : 16;
          int dot = 0;
          for (int i = first; i < first + count; ++i)
            dot += code(row, sb, r, gl, i) * x8[32 * g + i] + code(row, sb, r, gl, i + 16) * x8[32 * g + i + 16];
          const uint32_t word = (uint32_t)sz[o * G + g];
          const float s = from_bits(word & 0xFFFF0000u), zero = from_bits(word << 16);
          const float z = fmaf(-8.0f, s, zero);
          const float ds = s * d[g];
          acc[l] = fmaf((float)dot, ds, acc[l]);
          acc[l] = fmaf(z, r <= 4 && l % 4 ? 0.0f : c[g], acc[l]);
        }
      }
      float t3[8], t6[4];
      for (int i = 0; i < 8; ++i) t3[i] = acc[8 + i] + acc[i];
      for (int i = 0; i < 4; ++i) t6[i] = t3[4 + i] + t3[i];
      const float t8_0 = t6[0] + t6[2], t8_1 = t6[1] + t6[3];
      y[m * out + o] = t8_0 + t8_1;
    }
  }
  free(x8);
  free(d);
  free(c);
}

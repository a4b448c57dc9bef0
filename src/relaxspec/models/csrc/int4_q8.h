/* The int8-activation int4 kernel (int4_block_mm_q8): its types and constants here; its drivers, which do not
   depend on the instruction set (the split of a call into blocks of rows and output tiles between threads, the
   inputs' quantization into the layout below, the entry point), in int4_q8_drivers.h, included by each instruction
   set's translation unit (int4_block.c: AVX-512 VNNI; int4_block_avx2.c: AVX2) after it defines, as static inline
   functions:

     void qtile(const int M, const int OT, const qproblem* p, int64_t m0, int64_t o);
         y[m, o + t] for rows [m0, m0 + M) and t < OT (M and OT constants where it is inlined), the same steps
         for a row whatever M, OT and m0;
     float quantize_group(const float* xg, int8_t bytes[32], int32_t* sum);
         the group's 32 inputs rounded to int8 (x ~ d * x8, d = max |x| / 127, round to nearest even): the
         bytes, their sum, and d returned;

   and QTILE_OT(MM), the outputs per tile for a pass of MM rows (the accumulators stay in registers).

   The quantized inputs (`qproblem`): per row and superblock of 16 groups (SB_BYTES bytes), 4 runs of 64 bytes
   of inputs 4k..4k+3 of each group (run k: group g at bytes 4g..4g+3), then 4 runs of inputs 16+4k..16+4k+3; a
   last superblock of 1..4 groups ("compact") holds group g's inputs 0..15 at bytes 16g.. and 16..31 at
   256 + 16g..; per group its scale d and c = d * sum of its x8 (in a compact superblock d in the group's 4
   lanes 4g..4g+3, c in its first), zero past the last group. The codes' layout is int4_block.py's `pack` for
   "vnni": the same bytes for every instruction set. */
#ifndef RELAXSPEC_INT4_Q8_H
#define RELAXSPEC_INT4_Q8_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel_for.h"

#define SB 16                /* groups per superblock */
#define SB_BYTES (SB * 32)   /* x8 bytes per superblock: 4 registers of low-nibble inputs, then 4 of high */
#define PREFETCH 2048        /* codes read ahead (bytes): the memory stream overlaps the dot products */

typedef struct {
  const int8_t* x8;  /* [M, S * SB_BYTES], the rows' inputs in the superblocks' order (zero past the last group) */
  const float* d;    /* [M, S * SB], each group's scale (zero past the last group) */
  const float* c;    /* [M, S * SB], d * sum of the group's x8 */
  int64_t S, G;      /* superblocks, groups */
  const uint8_t* codes;
  const int32_t* sz;
  float* y;
  int64_t out, M;
} qproblem;

#endif

/* The int8-activation int4 kernel's drivers (int4_q8.h says what the includer defines before this: qtile,
   quantize_group, QTILE_OT): the passes of rows over output tiles, the quantization of the inputs, the entry point
   int4_block_mm_q8. Included once, by one instruction set's translation unit. */
#ifndef RELAXSPEC_INT4_Q8_DRIVERS_H
#define RELAXSPEC_INT4_Q8_DRIVERS_H
#include "int4_q8.h"

/* Rows [m0, m0 + MM) against the outputs [o, o + n): sub-tiles of QTILE_OT(MM) outputs, the rest one by one. */
#define QROWS(MM)                                                                      \
  static void qrows_##MM(const qproblem* p, int64_t m0, int64_t o, int64_t n) {        \
    const int OT = QTILE_OT(MM);                                                       \
    int64_t i = 0;                                                                     \
    for (; i + OT <= n; i += OT) qtile(MM, OT, p, m0, o + i);                          \
    for (; i < n; ++i) qtile(MM, 1, p, m0, o + i);                                     \
  }
QROWS(1) QROWS(2) QROWS(3) QROWS(4) QROWS(5) QROWS(6)
#undef QROWS

#define Q_ROWS 6                 /* rows per pass over a tile (more spill the accumulators) */
#define OUT_TILE 4               /* outputs per unit of the split between threads */
#define X8_CHUNK_BYTES (32 << 10)  /* a pass of rows: their quantized inputs kept in L1 */
#define X8_BLOCK_BYTES (256 << 10) /* a block of rows' quantized inputs, kept in L2 while the outputs pass over it */

/* Output tiles [begin, end): for each block of rows (their int8 inputs stay in cache), each tile against its rows
   Q_ROWS at a time (the tile's codes stay in cache): each weight read from memory once per block of rows. */
static void qtiles(const void* arg, int64_t begin, int64_t end) {
  static void (*const rows[Q_ROWS])(const qproblem*, int64_t, int64_t, int64_t) = {qrows_1, qrows_2, qrows_3,
                                                                                   qrows_4, qrows_5, qrows_6};
  const qproblem* p = arg;
  const int64_t row_bytes = p->S * (SB_BYTES + 8 * SB);
  int64_t block = X8_BLOCK_BYTES / row_bytes / Q_ROWS * Q_ROWS;
  block = block < Q_ROWS ? Q_ROWS : block;
  int64_t chunk = X8_CHUNK_BYTES / row_bytes; /* rows per pass over a tile: their int8 inputs stay in L1 */
  chunk = chunk < 1 ? 1 : chunk > Q_ROWS ? Q_ROWS : chunk;
  for (int64_t b0 = 0; b0 < p->M; b0 += block) {
    const int64_t b1 = b0 + block < p->M ? b0 + block : p->M;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t o = i * OUT_TILE, n = o + OUT_TILE < p->out ? OUT_TILE : p->out - o;
      for (int64_t m0 = b0; m0 < b1; m0 += chunk) rows[(b1 - m0 < chunk ? b1 - m0 : chunk) - 1](p, m0, o, n);
    }
  }
}

/* Rows [begin, end) of x quantized into the problem's buffers (group by group, in the superblocks' order). */
typedef struct {
  const float* x;
  int64_t in;
  qproblem* q;
} quantize_job;

static void quantize_rows(const void* arg, int64_t begin, int64_t end) {
  const quantize_job* job = arg;
  const qproblem* q = job->q;
  for (int64_t m = begin; m < end; ++m)
    for (int64_t g = 0; g < q->G; ++g) {
      int8_t bytes[32];
      int32_t sum;
      const float d = quantize_group(job->x + m * job->in + 32 * g, bytes, &sum);
      const int64_t sb = g / SB, lane = g % SB;
      const int compact = q->G - sb * SB <= SB / 4; /* a last superblock of 1..4 groups: group g in lanes 4g.. */
      int8_t* row = (int8_t*)q->x8 + m * q->S * SB_BYTES + sb * SB_BYTES;
      if (compact) { /* inputs 0..15 at bytes 16g.., inputs 16..31 at 256 + 16g.. */
        memcpy(row + 16 * lane, bytes, 16);
        memcpy(row + 256 + 16 * lane, bytes + 16, 16);
      } else {
        for (int k = 0; k < 8; ++k) memcpy(row + 4 * lane + 64 * k, bytes + 4 * k, 4); /* inputs 4k..: register k */
      }
      const int64_t at = m * q->S * SB + sb * SB + (compact ? 4 * lane : lane);
      const float c = d * (float)sum;
      for (int l = 0; l < (compact ? 4 : 1); ++l) ((float*)q->d)[at + l] = d; /* c in the group's first lane only */
      ((float*)q->c)[at] = c;
    }
}

/* y [M, out] float32 = x [M, in] (float32, contiguous) @ W^T with the inputs in int8 (above); codes in `pack`'s
   VNNI layout, sz as for int4_block_mm. */
void int4_block_mm_q8(const float* x, int64_t M, int64_t in, const uint8_t* codes, const int32_t* sz, float* y,
                      int64_t out) {
  if (M <= 0 || out <= 0) return;
  const int64_t G = in / 32, S = (G + SB - 1) / SB;
  void* buffer = calloc((size_t)(M * S * (SB_BYTES + 8 * SB)), 1);
  if (buffer == NULL) abort();
  qproblem q = {buffer, (const float*)((int8_t*)buffer + M * S * SB_BYTES), NULL, S, G, codes, sz, y, out, M};
  q.c = q.d + M * S * SB;
  const quantize_job job = {x, in, &q};
  parallel_for(M, 4, quantize_rows, &job);
  parallel_for((out + OUT_TILE - 1) / OUT_TILE, 8, qtiles, &q);
  free(buffer);
}

#endif

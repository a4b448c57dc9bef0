/* The int4 block kernel and its bfloat16-weight sibling (models/int4_block.py reads their ctypes signatures from
   these prototypes; every pointer is a tensor's data pointer). What each computes: beside its definition in
   int4_block.c. */
#ifndef RELAXSPEC_INT4_BLOCK_H
#define RELAXSPEC_INT4_BLOCK_H
#include <stdint.h>

void int4_block_mm(const uint16_t* x, int64_t M, int64_t in, const uint8_t* codes, const int32_t* sz, float* y,
                   int64_t out);
void int4_block_mm_q8(const float* x, int64_t M, int64_t in, const uint8_t* codes, const int32_t* sz, float* y,
                      int64_t out);
void bf16_block_mm(const uint16_t* x, int64_t M, int64_t in, const uint16_t* w, float* y, int64_t out);

#endif

/* The GGUF block kernel (models/gguf_block.py reads its ctypes signatures from these prototypes; every pointer is a
   tensor's data pointer). The layouts and what each function computes: in gguf_block.c. */
#ifndef RELAXSPEC_GGUF_BLOCK_H
#define RELAXSPEC_GGUF_BLOCK_H
#include <stdint.h>

int32_t gguf_block_vnni(void);
int64_t gguf_block_row_bytes(int32_t kind, int64_t in);
void gguf_block_quantize(const float* x, int64_t M, int64_t in, uint8_t* xq);
int32_t gguf_block_mm_vnni(int32_t kind, const uint8_t* xq, int64_t M, int64_t in, const uint8_t* w, int64_t out,
                           float* y, int64_t ldy);
int32_t gguf_block_mm_portable(int32_t kind, const uint8_t* xq, int64_t M, int64_t in, const uint8_t* w,
                               int64_t out, float* y, int64_t ldy);

#endif

/* FastLlama's float32 kernels (models/f32_kernels.py reads its ctypes signatures from these prototypes; every
   pointer is a tensor's data pointer). What each computes: beside its definition in f32_kernels.c. */
#ifndef RELAXSPEC_F32_KERNELS_H
#define RELAXSPEC_F32_KERNELS_H

void f32_block_mm(const float* x, long M, long in, const float* wp, long out, float* y, const float* r);
void f32_rms_norm(const float* x, long M, long C, const float* w, float eps, float* y);
void f32_attention(const float* qkv, long B, long T, long H, long KVH, long D, const float* kv, long cap, long L,
                   const float* bias, float scale, float* out, float* s);
void f32_rope_write(float* qkv, long B, long T, long H, long KVH, long D, const float* rot, float* kv, long cap,
                    long past);

#endif

/* FastLlama's float32 kernels (models/f32_kernels.py reads its ctypes signatures from these prototypes and its
   argument structs from these definitions; every pointer is a tensor's data pointer). What each computes: beside its
   definition in f32_kernels.c. */
#ifndef RELAXSPEC_F32_KERNELS_H
#define RELAXSPEC_F32_KERNELS_H

/* The arguments of a function of more than 8, one struct each, filled by name (relaxspec.native.structs). */
struct f32_attention_args {
  const float* qkv;
  long B, T, H, KVH, D;
  const float* kv; long cap, L;
  const float* bias;
  float scale;
  float *out, *s;
};
struct f32_rope_write_args {
  float* qkv;
  long B, T, H, KVH, D;
  const float* rot;
  float* kv; long cap, past;
};

void f32_block_mm(const float* x, long M, long in, const float* wp, long out, float* y, const float* r);
void f32_rms_norm(const float* x, long M, long C, const float* w, float eps, float* y);
void f32_attention(const struct f32_attention_args* args);
void f32_rope_write(const struct f32_rope_write_args* args);

#endif

"""An int4 weight-only kernel for blocks of a few rows (a verify block of N+1 tokens) on AVX-512 CPUs.

`aten._weight_int4pack_mm_for_cpu` dequantizes every weight again for every row of a block (its 6-row product
costs ~2.3 one-row products on SmolLM2). This kernel dequantizes each group of 32 weights once per call, to
bfloat16 (w = q * scale + zero' in float32, rounded), and applies it to up to `MAX_ROWS` rows with AVX-512 BF16
dot products (`vdpbf16ps`: bfloat16 pairs multiplied exactly and summed in float32), the rows' inputs rounded to
bfloat16 as the aten kernel rounds them. A longer input runs in chunks of `MAX_ROWS` rows.

Row independence: the numbers of a row (each output's chain of dot products over the groups, in order, and its
final sum) do not depend on how many other rows are in the call, nor on the threads (outputs are split between
threads, never a dot product): a row multiplied alone or in a block gives the same bits (tested), so int4 strict
greedy equals AR greedy through the linear layers by construction.

Layout (packed once at load, `pack`): codes uint8 [out, in / 2], byte j of a group holding its code j (low
nibble) and code j + 16 (high nibble); per group a 32-bit word, quant.py's bfloat16 scale in its high half and
its bfloat16 zero in the low half (w = (q - 8) scale + zero, computed as q scale + (zero - 8 scale) in float32).

Built on first use with `torch.utils.cpp_extension.load_inline` (a C++ compiler and `ninja`, the `[kernels]`
extra; OpenMP threads, as torch's own kernels) and cached by torch; without a compiler, without AVX-512 BF16, or
when the build fails: one warning line and quant.py uses the aten kernel. It is int4's default where it builds
(RELAXSPEC_INT4_KERNEL=aten keeps aten's): measured on SmolLM2's linears at two threads it costs 0.96 / 0.86 /
0.60 / 0.58 of aten's kernel at 1 / 4 / 6 / 9 rows (one thread: 1.05-1.08 at 1 row, 0.65-0.72 at 6-9).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch

MAX_ROWS = 10
GROUP = 32
_NAME = "relaxspec_int4_block_v6"  # a new name when the source changes (torch also rebuilds on a changed source)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

// Output tile of OT rows of W, M rows of x: y[m, o] = sum over groups of dot(bf16(q * s + z'), x_bf16[m]).
template <int M, int OT>
static void tile(const uint16_t* x, int64_t in, const uint8_t* codes, const int32_t* sz, float* y,
                 int64_t out, int64_t o) {
  const int64_t G = in / 32;
  const __m512i low4 = _mm512_set1_epi32(0xF);
  __m512 acc[OT][M];
  for (int t = 0; t < OT; ++t)
    for (int m = 0; m < M; ++m) acc[t][m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512bh w[OT];
    for (int t = 0; t < OT; ++t) {
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(codes + (o + t) * (in / 2) + 16 * g)));
      const __m512i p = _mm512_set1_epi32(sz[(o + t) * G + g]);
      const __m512 s = _mm512_castsi512_ps(_mm512_and_si512(p, _mm512_set1_epi32((int)0xFFFF0000u)));
      const __m512 z = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), s, _mm512_castsi512_ps(_mm512_slli_epi32(p, 16)));
      const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, low4)), s, z);  // inputs 0..15
      const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), s, z);    // inputs 16..31
      w[t] = _mm512_cvtne2ps_pbh(hi, lo);  // 32 bfloat16 in input order
    }
    for (int m = 0; m < M; ++m) {
      const __m512bh xm = (__m512bh)_mm512_loadu_si512((const void*)(x + m * in + 32 * g));
      for (int t = 0; t < OT; ++t) acc[t][m] = _mm512_dpbf16_ps(acc[t][m], w[t], xm);
    }
  }
  for (int t = 0; t < OT; ++t)
    for (int m = 0; m < M; ++m) y[m * out + o + t] = _mm512_reduce_add_ps(acc[t][m]);
}

template <int M>
static void run(const uint16_t* x, int64_t in, const uint8_t* codes, const int32_t* sz, float* y, int64_t out) {
  constexpr int OT = M <= 4 ? 4 : 2;
  const int64_t tiles = out / OT;
  at::parallel_for(0, tiles, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) tile<M, OT>(x, in, codes, sz, y, out, i * OT);
  });
  for (int64_t o = tiles * OT; o < out; ++o) tile<M, 1>(x, in, codes, sz, y, out, o);
}

torch::Tensor int4_block_mm(torch::Tensor x, torch::Tensor codes, torch::Tensor sz) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && x.is_contiguous(), "x: bfloat16 [M, in]");
  TORCH_CHECK(codes.scalar_type() == torch::kUInt8 && sz.scalar_type() == torch::kInt, "codes uint8, sz int32");
  const int64_t M = x.size(0), in = x.size(1), out = codes.size(0);
  TORCH_CHECK(in % 32 == 0 && codes.size(1) * 2 == in && sz.size(0) == out && sz.size(1) == in / 32, "shapes");
  TORCH_CHECK(M >= 1 && M <= 10, "1 to 10 rows");
  auto y = torch::empty({M, out}, x.options().dtype(torch::kFloat));
  const uint16_t* xp = (const uint16_t*)x.data_ptr(); const uint8_t* cp = codes.data_ptr<uint8_t>();
  const int32_t* sp = sz.data_ptr<int32_t>(); float* yp = y.data_ptr<float>();
  switch (M) {
    case 1: run<1>(xp, in, cp, sp, yp, out); break;
    case 2: run<2>(xp, in, cp, sp, yp, out); break;
    case 3: run<3>(xp, in, cp, sp, yp, out); break;
    case 4: run<4>(xp, in, cp, sp, yp, out); break;
    case 5: run<5>(xp, in, cp, sp, yp, out); break;
    case 6: run<6>(xp, in, cp, sp, yp, out); break;
    case 7: run<7>(xp, in, cp, sp, yp, out); break;
    case 8: run<8>(xp, in, cp, sp, yp, out); break;
    case 9: run<9>(xp, in, cp, sp, yp, out); break;
    default: run<10>(xp, in, cp, sp, yp, out); break;
  }
  return y;
}
"""

_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.cache
def kernel():
    """The compiled extension, or None (with one warning line) where it cannot run or be built."""
    missing = [f for f in _FLAGS if f not in _cpu_flags()]
    if missing:
        return _unavailable(f"this CPU lacks {', '.join(missing)}")
    try:
        from torch.utils import cpp_extension
        from torch.utils.cpp_extension import load_inline

        try:
            built = any(Path(cpp_extension._get_build_directory(_NAME, verbose=False)).glob("*.so"))
        except Exception:  # (a private helper: if it moves, the note is printed every time)
            built = False
        if shutil.which("ninja") is None:  # pip's ninja sits next to this interpreter (a venv not activated)
            os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
        if not built:
            print("relaxspec: building the int4 block kernel (once, about a minute; cached by torch)", file=sys.stderr)
        return load_inline(name=_NAME, cpp_sources=[_SOURCE], functions=["int4_block_mm"],
                           extra_cflags=["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16",
                                         "-mfma"], verbose=False)
    except Exception as error:  # no compiler, no ninja, a failed build: the aten kernel serves
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return _unavailable(f"{type(error).__name__}: {first[:200]}")


def _unavailable(why: str):
    warnings.warn(f"relaxspec int4 block kernel unavailable ({why}); int4 uses aten's kernel", stacklevel=3)
    return None


def pack(codes: torch.Tensor, scale_zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [out, in / 2], scale and zero' int32 [out, in / 32]) in the kernel's layout from quant.py's
    codes [out, in] (0..15) and (scale, zero) [in / 32, out, 2] (bfloat16)."""
    out, in_features = codes.shape
    g = codes.reshape(out, in_features // GROUP, 2, GROUP // 2).to(torch.uint8)
    packed = (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(out, in_features // 2).contiguous()
    scale, zero = scale_zero.transpose(0, 1).unbind(-1)  # [out, in / 32] each, bfloat16
    bits = [t.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF for t in (scale, zero)]
    return packed, ((bits[0] << 16) | bits[1]).contiguous()


def block_mm(x: torch.Tensor, codes: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
    """x [M, in] (any float dtype; rounded to bfloat16) @ W^T: float32 [M, out], in chunks of MAX_ROWS rows."""
    xb = x.to(torch.bfloat16).contiguous()
    mm = kernel().int4_block_mm
    if xb.shape[0] <= MAX_ROWS:
        return mm(xb, codes, sz)
    return torch.cat([mm(xb[i:i + MAX_ROWS], codes, sz) for i in range(0, xb.shape[0], MAX_ROWS)])

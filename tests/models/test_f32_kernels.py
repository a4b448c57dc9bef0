"""The float32 small-weight kernel (models/f32_kernels.py): numbers against a float64 reference, rows independent of
the block they are in (bit for bit), exact packing, and sgemm's path when native kernels are off."""

import pytest
import torch

from relaxspec import native
from relaxspec.models import f32_kernels
from relaxspec.models.quant import Linear

# Skipped only where no kernel can be built (no compiler, kernels off); where one can, a build that fails fails these
# tests (library() None) and tests/project/test_native_build.py.
needs_kernel = pytest.mark.skipif(native.compiler() is None or not native.enabled(),
                                  reason="no C compiler, or RELAXSPEC_NATIVE=0")

SHAPES = ((714, 128), (384, 64), (128, 512), (7, 32), (20, 3), (65, 33))  # output tails of the 64- and 16-wide tiles


@needs_kernel
def test_the_library_builds_here():
    assert f32_kernels.library() is not None


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_a_float64_reference(shape):
    # Stated tolerance: one float32 chain of fused multiply-adds per output, a relative 2^-24 per step, bounded
    # by 1e-6 of sum |x| |w| (in <= 512 terms) plus the residual's own rounding.
    torch.manual_seed(shape[0])
    w = torch.randn(shape)
    tiles = f32_kernels.pack(w)
    for rows in (1, 3, 8, 13):  # 13: two chunks (8 + 5)
        x, r = torch.randn(rows, shape[1]), torch.randn(rows, shape[0])
        ref = x.double() @ w.double().t()
        bound = 1e-6 * (x.abs().double() @ w.abs().double().t()) + 1e-6
        y = f32_kernels.block_mm(f32_kernels.library(), x, tiles, shape[0])
        assert y.dtype == torch.float32 and y.shape == (rows, shape[0])
        assert ((y.double() - ref).abs() <= bound).all()
        y_r = f32_kernels.block_mm(f32_kernels.library(), x, tiles, shape[0], residual=r)
        assert ((y_r.double() - ref - r.double()).abs() <= bound + 1e-6 * r.abs().double()).all()


@needs_kernel
def test_a_row_gives_the_same_bits_alone_and_in_any_block():
    torch.manual_seed(0)
    w = torch.randn(714, 128)
    lin = Linear(w)
    assert lin.tiles is not None
    x, r = torch.randn(11, 128), torch.randn(11, 714)
    block = lin(x, residual=r.clone())
    for i in range(11):
        assert torch.equal(lin(x[i:i + 1], residual=r[i:i + 1].clone()), block[i:i + 1])
    assert torch.equal(lin(x[3:7]), lin(x)[3:7])


def test_packing_is_exact_and_dense_reads_the_weight_back():
    w = torch.randn(37, 24)
    assert torch.equal(f32_kernels.unpack(f32_kernels.pack(w), 37), w)
    assert torch.equal(Linear(w).dense(), w)


def test_without_native_kernels_small_weights_use_sgemm_with_the_same_numbers(forker, tmp_path):
    code = ("import torch; from relaxspec.models.quant import Linear; torch.manual_seed(1); w = torch.randn(96, 40);"
            "lin = Linear(w); x = torch.randn(5, 40); assert lin.tiles is None and lin.t is not None;"
            "assert torch.allclose(lin(x), x @ w.t(), atol=1e-5); print('sgemm')")
    out = forker.run(["-c", code], cwd=tmp_path, env={"RELAXSPEC_NATIVE": "0"}, timeout=300)  # (conftest.forker)
    assert out.returncode == 0 and out.stdout.strip() == "sgemm", out.stderr[-2000:]


@needs_kernel
@pytest.mark.parametrize("width", (7, 64, 576))
def test_rms_norm_matches_torch_and_leaves_rows_independent(width):
    # Stated tolerance: the mean of squares summed in another order (16 lanes, then a tail), a relative 2^-24
    # per addition over <= 576 terms, plus one rounding each for the scale and the two products: 1e-5 relative.
    torch.manual_seed(width)
    x, w = torch.randn(3, 5, width) * 3, torch.randn(width)
    fn = f32_kernels.library()
    y = f32_kernels.rms_norm(fn, x, w, 1e-6)
    ref = torch.rms_norm(x.double(), (width,), w.double(), 1e-6)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert ((y.double() - ref).abs() <= 1e-5 * ref.abs() + 1e-6).all()
    assert torch.equal(f32_kernels.rms_norm(fn, x[1:2, 3:4], w, 1e-6), y[1:2, 3:4])
    strided = x.transpose(0, 1)  # not contiguous: made so first
    assert torch.equal(f32_kernels.rms_norm(fn, strided, w, 1e-6), y.transpose(0, 1))


@needs_kernel
@pytest.mark.parametrize("B,T,H,KVH,D,L", [(1, 1, 4, 4, 32, 150), (1, 4, 4, 4, 32, 150), (2, 6, 9, 3, 64, 200),
                                           (3, 2, 4, 2, 40, 37), (1, 1, 2, 2, 64, 1), (2, 3, 8, 2, 128, 70)])
def test_attention_matches_sdpa(B, T, H, KVH, D, L):
    # Stated tolerance: the kernel's exp is Cephes' polynomial (within a few float32 ulp) and its sums run in
    # another order than sdpa's; outputs are convex combinations of values ~N(0, 1): 2e-6 absolute.
    torch.manual_seed(B * 100 + D)
    qkv = torch.randn(B, T, (H + 2 * KVH) * D)
    kv = torch.randn(B, 2 * KVH, L + 9, D)[:, :, :L]  # a view of a longer cache buffer
    bias = None
    if T > 1:  # padding and future slots masked (finite, as FastLlama's), slot 0 always visible
        bias = torch.where(torch.rand(B, 1, T, L) < 0.3, -1e30, 0.0).float()
        bias[..., 0] = 0
    q = qkv.view(B, T, H + 2 * KVH, D).transpose(1, 2)[:, :H]
    ref = torch.nn.functional.scaled_dot_product_attention(q, kv[:, :KVH], kv[:, KVH:], attn_mask=bias,
                                                           enable_gqa=KVH != H)
    got = f32_kernels.attention(f32_kernels.library(), qkv, kv, bias, H, KVH, D, torch.empty(L + 16))
    assert got.shape == (B * T, H * D)
    assert (got - ref.transpose(1, 2).reshape(B * T, H * D)).abs().max() < 2e-6


@needs_kernel
def test_rope_write_matches_the_complex_multiply_and_fills_the_cache_slots():
    # Stated tolerance: one complex product per pair, float32 (fused or not): 1e-6 absolute on values ~N(0, 1).
    torch.manual_seed(5)
    B, T, H, KVH, D, past, cap = 2, 3, 6, 2, 16, 4, 12
    qkv = torch.randn(B * T, (H + 2 * KVH) * D)
    rotation = torch.polar(torch.ones(B, T, 1, D // 2), torch.rand(B, T, 1, D // 2) * 6)
    buffer = torch.randn(B, 2 * KVH, cap, D)
    before = buffer.clone()
    pairs = torch.view_as_complex(qkv.clone().view(B, T, H + 2 * KVH, D // 2, 2))
    pairs[:, :, :H + KVH] *= rotation
    want = torch.view_as_real(pairs).reshape(B * T, -1)
    kv = f32_kernels.rope_write(f32_kernels.library(), qkv, rotation, buffer, past, H, KVH, D)
    assert (qkv - want).abs().max() < 1e-6
    assert kv.shape == (B, 2 * KVH, past + T, D) and kv.data_ptr() == buffer.data_ptr()
    heads = want.view(B, T, H + 2 * KVH, D).transpose(1, 2)
    assert (buffer[:, :, past:past + T] - heads[:, H:]).abs().max() < 1e-6
    assert torch.equal(buffer[:, :, :past], before[:, :, :past]) and torch.equal(buffer[:, :, past + T:],
                                                                                 before[:, :, past + T:])

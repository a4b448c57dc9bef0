"""The float32 small-weight kernel (models/f32_block.py): numbers against a float64 reference, rows independent of
the block they are in (bit for bit), exact packing, and sgemm's path when native kernels are off."""

import os
import subprocess
import sys

import pytest
import torch

from relaxspec.models import f32_block
from relaxspec.models.quant import Linear

needs_kernel = pytest.mark.skipif(f32_block.kernel() is None, reason="no C compiler")

SHAPES = ((714, 128), (384, 64), (128, 512), (7, 32), (20, 3), (65, 33))  # output tails of the 64- and 16-wide tiles


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_a_float64_reference(shape):
    # Stated tolerance: one float32 chain of fused multiply-adds per output, a relative 2^-24 per step, bounded
    # by 1e-6 of sum |x| |w| (in <= 512 terms) plus the residual's own rounding.
    torch.manual_seed(shape[0])
    w = torch.randn(shape)
    tiles = f32_block.pack(w)
    for rows in (1, 3, 8, 13):  # 13: two chunks (8 + 5)
        x, r = torch.randn(rows, shape[1]), torch.randn(rows, shape[0])
        ref = x.double() @ w.double().t()
        bound = 1e-6 * (x.abs().double() @ w.abs().double().t()) + 1e-6
        y = f32_block.block_mm(f32_block.kernel(), x, tiles, shape[0])
        assert y.dtype == torch.float32 and y.shape == (rows, shape[0])
        assert ((y.double() - ref).abs() <= bound).all()
        y_r = f32_block.block_mm(f32_block.kernel(), x, tiles, shape[0], residual=r)
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
    assert torch.equal(f32_block.unpack(f32_block.pack(w), 37), w)
    assert torch.equal(Linear(w).dense(), w)


def test_without_native_kernels_small_weights_use_sgemm_with_the_same_numbers():
    code = ("import torch; from relaxspec.models.quant import Linear; torch.manual_seed(1); w = torch.randn(96, 40);"
            "lin = Linear(w); x = torch.randn(5, 40); assert lin.tiles is None and lin.t is not None;"
            "assert torch.allclose(lin(x), x @ w.t(), atol=1e-5); print('sgemm')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RELAXSPEC_NATIVE": "0"})
    assert out.returncode == 0 and out.stdout.strip() == "sgemm", out.stderr[-2000:]

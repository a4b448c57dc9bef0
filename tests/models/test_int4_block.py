"""The int4 block kernel (models/int4_block.py): numbers against a float32 dequantize-then-matmul reference, the
int8-activation path's bits against a scalar C reference of its operations (the same on AVX-512 and AVX2), rows
independent of the block they are in (bit for bit), and a clean fallback to aten's kernel when it cannot be built."""

from pathlib import Path

import pytest
import torch

from relaxspec import native
from relaxspec.models import int4_block
from relaxspec.models.quant import Linear, dequantize_int4, quantize_int4

# Skipped only where the kernel cannot run here (no compiler, neither AVX-512 BF16 nor AVX2, kernels off); where it
# can, a build that fails fails these tests (kernel() None) and tests/project/test_native_build.py.
needs_kernel = pytest.mark.skipif(
    native.compiler() is None or not native.enabled() or int4_block.isa() is None,
    reason="no C compiler, neither an AVX-512 BF16 nor an AVX2 CPU, or RELAXSPEC_NATIVE=0")
needs_bf16 = pytest.mark.skipif(int4_block.isa() != "avx512", reason="bf16_mm needs the AVX-512 kernel")

# The paths this CPU runs: bf16 on every CPU the AVX-512 kernel runs on, vnni where it has AVX-512 VNNI as well or
# runs the AVX2 kernel.
LAYOUTS = (["bf16"] if int4_block.isa() == "avx512" else []) + (["vnni"] if int4_block.path() == "vnni" else [])
REFERENCE = native.Kernel("int4_q8_reference", Path(__file__).parent / "csrc" / "int4_q8_reference.c",
                          Path(__file__).parent / "csrc" / "int4_q8_reference.h",
                          flags=("-O2", "-fPIC", "-shared", "-ffp-contract=off"))
SHAPES = ((50, 96), (7, 64), (960, 576), (576, 1536), (3, 32), (40, 8960), (5, 640))  # last superblocks of 3, 2,
# 2, 16, 1, 8 and 4 groups


def int8_rounding(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The most the VNNI path's int8 inputs can move each output: an input of group g rounded to a multiple of
    d_g = max|x_g| / 127 moves by at most d_g / 2 (a factor 1 + 2^-10 for the float32 rounding of d_g and of
    x / d_g), times |w|, summed."""
    amax = x.abs().reshape(x.shape[0], -1, 32).amax(-1).repeat_interleave(32, dim=1)
    return (amax.double() / 254 * (1 + 2 ** -10)) @ w.abs().double().t()


@needs_kernel
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_a_float32_reference_on_its_weights_and_inputs(shape, layout):
    # Stated tolerance. bf16: the kernel multiplies bfloat16(w) by bfloat16(x) exactly and sums in float32, so
    # against the same product summed by torch it differs by summation order only: a relative 2^-24 per
    # addition, bounded here by 1e-5 of sum |x| |w| (in <= 8960 terms, summed 16 lanes apart). vnni: the float32
    # weight q s + z' (int4_block.dense) against x rounded to int8 per group: `int8_rounding`, plus the same 1e-5
    # for the float32 scaling and sums.
    torch.manual_seed(shape[0])
    w = torch.randn(shape) * 0.05
    codes, scale_zero = quantize_int4(w)
    packed = int4_block.pack(codes, scale_zero, layout)
    deq = int4_block.dense(*packed, layout)
    for rows in (1, 3, 7, 10, 13):
        x = torch.randn(rows, shape[1])
        y = int4_block.block_mm(x, *packed, layout)
        xr = x.bfloat16().float() if layout == "bf16" else x
        ref = xr.double() @ deq.double().t()
        bound = 1e-5 * (xr.abs().double() @ deq.abs().double().t()) + 1e-7
        if layout == "vnni":
            bound = bound + int8_rounding(x, deq)
        assert y.dtype == torch.float32 and y.shape == (rows, shape[0])
        assert ((y - ref).abs() <= bound).all(), ((y - ref).abs() / bound).max()
    # and it is the int4 weights it stands for: within bfloat16's rounding of the float32 dequantized weights
    # (bf16), exactly the float32 q s + (z - 8 s) (vnni: within 2^-23 of the largest weight of (q - 8) s + z)
    exact = dequantize_int4(codes, scale_zero)
    if layout == "bf16":
        assert torch.equal(deq, exact.bfloat16().float())
    else:
        assert (deq - exact).abs().max() <= 2 ** -22 * exact.abs().max()


@needs_kernel
@pytest.mark.skipif("vnni" not in LAYOUTS, reason="no AVX-512 VNNI")
def test_the_vnni_path_rounds_the_inputs_as_llama_cpp_q8_0():
    """Against torch's own int8 rounding (d = max|x_g| / 127, x8 = round(x / d), an all-zero group 0): the same
    products to float32 summation order (1e-5 of sum |x8 d| |w|), far inside `int8_rounding`."""
    torch.manual_seed(3)
    w, x = torch.randn(96, 8960) * 0.05, torch.randn(5, 8960)
    x[1, 64:96] = 0  # an all-zero group
    packed = int4_block.pack(*quantize_int4(w), "vnni")
    deq = int4_block.dense(*packed, "vnni")
    g = x.reshape(5, -1, 32)
    amax = g.abs().amax(-1, keepdim=True)
    xq = (torch.round(g * torch.where(amax > 0, 127 / amax, 0)) * (amax / 127)).reshape(x.shape)
    ref = xq.double() @ deq.double().t()
    y = int4_block.block_mm(x, *packed, "vnni")
    assert ((y - ref).abs() <= 1e-5 * (xq.abs().double() @ deq.abs().double().t())).all()
    # and it does round them: off the unrounded product by more than the summation order allows
    assert ((y - x.double() @ deq.double().t()).abs() > 1e-4 * (x.abs().double() @ deq.abs().double().t())).any()


@needs_kernel
@pytest.mark.skipif("vnni" not in LAYOUTS, reason="no int8-activation path on this CPU")
def test_the_int8_path_gives_the_scalar_reference_s_bits():
    """int4_block_mm_q8 on this CPU's instruction set (AVX-512 VNNI or AVX2) against tests/models/csrc/
    int4_q8_reference.c, the path's float32 operations one at a time in the AVX-512 code's order: equal bits, so
    a row gets the same numbers on both (last superblocks of 3, 2, 1, 4, 8, 12 and 16 groups; an all-zero group;
    300 rows: several blocks of rows)."""
    reference = native.open_library(REFERENCE)
    torch.manual_seed(9)
    for shape in ((50, 96), (7, 64), (3, 32), (5, 640), (40, 8960), (33, 896), (70, 1536), (9, 4864)):
        packed = int4_block.pack(*quantize_int4(torch.randn(shape) * 0.05), "vnni")
        for rows in (1, 2, 6, 7, 13) + ((300,) if shape == (9, 4864) else ()):
            x = torch.randn(rows, shape[1]) * 3
            x[0, :32] = 0  # an all-zero group
            y = int4_block.block_mm(x, *packed, "vnni")
            want = torch.empty_like(y)
            reference.int4_q8_reference(x.data_ptr(), rows, shape[1], packed[0].data_ptr(), packed[1].data_ptr(),
                                        want.data_ptr(), shape[0])
            assert torch.equal(y, want), (shape, rows, (y - want).abs().max())


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_gets_the_same_bits_alone_in_a_block_and_on_any_thread_count(threads):
    """Row independence: so int4 strict greedy equals AR greedy through the linear layers by construction."""
    torch.manual_seed(4)
    previous = torch.get_num_threads()
    try:
        for shape in SHAPES:
            w = torch.randn(shape) * 0.05
            lin = Linear(w, "int4", int4_impl="block")
            assert lin.block is not None
            x = torch.randn(13, shape[1])
            torch.set_num_threads(threads)
            alone = torch.cat([lin(x[i:i + 1]) for i in range(13)])
            for rows in (2, 4, 6, 9, 10, 13):
                assert torch.equal(lin(x[:rows]), alone[:rows]), (shape, rows)
            torch.set_num_threads(3 - threads)
            assert torch.equal(lin(x), alone), shape
    finally:
        torch.set_num_threads(previous)


@needs_kernel
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_prompt_s_rows_get_the_bits_of_single_rows_on_either_path(layout):
    """A prompt of 300 rows (the VNNI path's blocks of rows whose int8 inputs stay in cache: several here) gives
    each row the bits it gets alone, on the path of this CPU and on the bf16 one."""
    torch.manual_seed(8)
    for shape in ((70, 1536), (9, 8960)):
        packed = int4_block.pack(*quantize_int4(torch.randn(shape) * 0.05), layout)
        x = torch.randn(300, shape[1])
        y = int4_block.block_mm(x, *packed, layout)
        for i in (0, 1, 5, 6, 131, 132, 133, 299):
            assert torch.equal(y[i:i + 1], int4_block.block_mm(x[i:i + 1], *packed, layout)), (shape, i)
        assert torch.equal(y[7:12], int4_block.block_mm(x[7:12], *packed, layout))


@needs_kernel
def test_block_and_aten_kernels_agree_and_store_the_same_bytes():
    torch.manual_seed(5)
    w, x = torch.randn(640, 512) * 0.05, torch.randn(6, 512)
    block, aten = Linear(w, "int4", int4_impl="block"), Linear(w, "int4", int4_impl="aten")
    assert block.block is not None and aten.packed is not None and block.nbytes == aten.nbytes
    # aten rounds x and w to bfloat16 (2^-9 each) and its output (2^-9), and sums in its own order; the block
    # kernel's bf16 path rounds x and w alike, its VNNI path rounds x to int8 (`int8_rounding`) and keeps w in
    # float32: within 2^-7 of the largest output (bf16), within those roundings output by output (vnni)
    y, deq = block(x), dequantize_int4(*quantize_int4(w))
    if int4_block.path() == "bf16":
        assert (y - aten(x)).abs().max() <= 2 ** -7 * y.abs().max(), (y - aten(x)).abs().max() / y.abs().max()
        assert torch.equal(block.dense(), deq.bfloat16().float())
    else:
        bound = int8_rounding(x, deq) + 2 ** -7 * (x.abs().double() @ deq.abs().double().t())
        assert ((y - aten(x)).abs() <= bound + 2 ** -8 * aten(x).abs()).all()
        assert torch.equal(block.dense(), int4_block.dense(*block.block))


@needs_kernel
def test_the_kernel_builds_here():
    assert int4_block.kernel() is not None


def test_without_a_compiler_int4_falls_back_to_aten_with_one_warning_line(tmp_path, forker):
    """RELAXSPEC_INT4_KERNEL=block asks for the block kernel; a build that fails is one warning, then aten."""
    code = ("import warnings, torch\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from relaxspec.models.quant import Linear\n"
            "    lin = Linear(torch.randn(64, 96), 'int4')\n"
            "    y = lin(torch.randn(3, 96))\n"
            "print(lin.block is None, lin.packed is not None, tuple(y.shape))\n"
            "print(len(caught)); print(caught[0].message if caught else '')\n")
    env = {"CC": "/bin/false", "RELAXSPEC_CACHE": str(tmp_path), "RELAXSPEC_INT4_KERNEL": "block",
           "RELAXSPEC_NATIVE": "1"}  # (a process of its own, relaxspec imported there: conftest.forker)
    out = forker.run(["-c", code], cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    used, count, message = out.stdout.strip().splitlines()
    assert (used, count) == ("True True (3, 64)", "1")  # aten's kernel, one warning
    assert message.startswith("relaxspec int4 block kernel unavailable (") and "aten" in message


def test_relaxspec_native_0_turns_the_int4_kernel_off_silently(forker, tmp_path):
    """RELAXSPEC_NATIVE=0 turns off every native kernel, int4's too: aten's kernel, no build, no warning."""
    code = ("import warnings, torch\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from relaxspec.models import int4_block\n"
            "    from relaxspec.models.quant import Linear\n"
            "    lin = Linear(torch.randn(64, 96), 'int4', int4_impl='block')\n"
            "    y = lin(torch.randn(3, 96))\n"
            "print(int4_block.kernel() is None, lin.block is None, lin.packed is not None, len(caught))\n")
    out = forker.run(["-c", code], cwd=tmp_path, env={"RELAXSPEC_NATIVE": "0"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True", "True", "0"]


def test_relaxspec_native_0_turns_the_block_kernel_off_too(forker, tmp_path):
    """RELAXSPEC_NATIVE=0 turns off every kernel relaxspec builds, this one included: int4 runs aten's kernel, with
    no build and no warning, for a weight quantized here and for a file's own codes (quant.Int4Codes); bfloat16
    oneDNN's alone."""
    code = ("import warnings, torch\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from relaxspec.models.quant import Int4Codes, Linear, quantize_int4\n"
            "    w = torch.randn(64, 96)\n"
            "    lins = [Linear(w, 'int4', int4_impl='block'), Linear(Int4Codes(*quantize_int4(w)), 'int4')]\n"
            "    ys = [lin(torch.randn(3, 96)) for lin in lins]\n"
            "    bf16 = Linear(w, 'bfloat16')\n"
            "print([(lin.block is None, lin.packed is not None) for lin in lins], len(caught), bf16.bf16_kernel)\n")
    out = forker.run(["-c", code], cwd=tmp_path, env={"RELAXSPEC_NATIVE": "0", "RELAXSPEC_INT4_KERNEL": "block"},
                     timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[(True, True), (True, True)] 0 False", out.stdout + out.stderr[-2000:]
    assert "int4 block kernel" not in out.stderr


@needs_kernel
def test_the_block_kernel_runs_a_model_and_a_verify_block_gets_the_logits_of_single_steps(monkeypatch):
    """Through a whole model (FastLlama's linears and the LM head): every row's numbers independent of the block,
    so a verify block gives each position the logits of single steps up to attention's own rounding."""
    from relaxspec.models.fast_llama import FastLlama
    from relaxspec.models.hf import CausalLM
    from helpers import tiny_llama

    monkeypatch.setenv("RELAXSPEC_INT4_KERNEL", "block")
    model = tiny_llama(seed=6)
    lm = CausalLM("m", model, None, FastLlama(model, "int4"))
    assert lm.fast.lm_head.block is not None
    ids = torch.randint(0, 256, (1, 9))
    block, _ = lm.forward(ids, lm.new_cache(), torch.ones_like(ids), torch.arange(9)[None])
    cache, steps = lm.new_cache(), []
    for t in range(9):
        logits, _ = lm.forward(ids[:, t:t + 1], cache, torch.ones_like(ids[:, :t + 1]), torch.tensor([[t]]))
        steps.append(logits)
    steps = torch.cat(steps, dim=1)
    assert (block - steps).abs().max() < 1e-4 * block.abs().max()
    assert torch.equal(block.argmax(-1), steps.argmax(-1))


@needs_bf16
@pytest.mark.parametrize("threads", [1, 2])
def test_bfloat16_weights_get_float32_sums_row_by_row(threads):
    """bf16_mm: each output the float32 sum of the bfloat16 products (against a float64 reference of the same
    rounded inputs and weights), never rounded to bfloat16 as oneDNN's GEMM rounds it (which ties logits), and a
    row's bits the same alone, in a block and on any thread count."""
    torch.manual_seed(5)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for out, inputs in ((37, 96), (7, 64), (1030, 1536), (5, 32)):
            w = (torch.randn(out, inputs) * 0.05).to(torch.bfloat16)
            x = torch.randn(13, inputs)
            y = int4_block.bf16_mm(x, w)
            reference = x.to(torch.bfloat16).double() @ w.double().t()
            bound = 2 * inputs * 2 ** -24 * (x.to(torch.bfloat16).double().abs() @ w.double().abs().t())
            assert ((y.double() - reference).abs() <= bound).all(), (out, inputs)
            assert not torch.equal(y, y.bfloat16().float())  # float32 outputs, not bfloat16 ones
            alone = torch.cat([int4_block.bf16_mm(x[i:i + 1], w) for i in range(13)])
            for rows in (2, 4, 10, 13):
                assert torch.equal(int4_block.bf16_mm(x[:rows], w), alone[:rows]), (out, rows)
    finally:
        torch.set_num_threads(previous)
    with pytest.raises(ValueError, match="a multiple of 32"):
        int4_block.bf16_mm(torch.randn(2, 48), torch.randn(3, 48).to(torch.bfloat16))


@needs_bf16
def test_a_bfloat16_linear_runs_the_kernel_up_to_bf16_rows_and_onednn_for_a_prompt():
    """Linear in bfloat16: calls of up to BF16_ROWS rows (decode steps, verify blocks) through bf16_mm (float32
    outputs, a row's bits the same alone and in a block; 64 rows of 8960 inputs span several blocks of rows);
    a prompt's rows through oneDNN (outputs rounded to bfloat16); without the kernel (48 inputs), oneDNN."""
    torch.manual_seed(6)
    rows = int4_block.BF16_ROWS
    for shape in ((300, 256), (70, 1536), (9, 8960)):
        w = torch.randn(shape) * 0.05
        lin = Linear(w, "bfloat16")
        assert lin.bf16_kernel
        x = torch.randn(rows + 1, shape[1])
        y = lin(x[:rows])
        assert not torch.equal(y, y.bfloat16().float())  # float32 sums
        for i in (0, 1, 9, 10, 11, 31, rows - 1):
            assert torch.equal(y[i:i + 1], lin(x[i:i + 1])), (shape, i)
        assert torch.equal(y[7:12], lin(x[7:12]))
        prompt = lin(x)
        assert torch.equal(prompt, prompt.bfloat16().float())  # oneDNN's outputs: bfloat16 values
        assert torch.allclose(prompt[:rows], y, rtol=2 ** -7, atol=1e-5)
    assert not Linear(torch.randn(8, 48), "bfloat16").bf16_kernel

"""The `file` weight format: a GGUF file's matrices in their own types (models/gguf_block.py, its C kernel).

Each type's layout reads back the `gguf` package's dequantization bit for bit; the kernel multiplies by those values
(its inputs rounded to int8 per 32, as llama.cpp's Q8_0) on both of its paths, which give the same bits; a row gets
the same bits alone, in a verify block or in a prompt; and a small random Qwen2 GGUF of every type runs through
FastLlama against transformers on the file's dequantized weights."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from relaxspec import native
from relaxspec.models import gguf_block, load_model
from relaxspec.models.device import resolve_format
from relaxspec.models.gguf_block import KINDS, BlockCodes
from relaxspec.models.quant import Linear
from helpers import ROOT, conversions, inside, logits_of, mapped_ranges, stderr_lines, weights_file, write_qwen2  # noqa: F401
from helpers import weight_cache_folder as cache  # noqa: F401  (fixtures: conversions, cache)

# Skipped only where the kernel cannot be built here (no compiler, kernels off); where it can, a build that fails
# fails these tests (kernel() None).
needs_kernel = pytest.mark.skipif(native.compiler() is None or not native.enabled(),
                                  reason="no C compiler, or RELAXSPEC_NATIVE=0")
# The paths this CPU runs: the portable one everywhere, vnni where it has AVX-512 VNNI.
PATHS = ["portable"] + (["vnni"] if native.compiler() and native.enabled() and gguf_block.path() == "vnni" else [])
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q6_K": 210}
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def random_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A tensor [rows, cols] of `kind` made of random bytes (every code, sub-scale and high bit), its float16 scales
    small and finite, of either sign, some of them subnormal, so that its weights are of a trained model's size."""
    rng = np.random.default_rng(seed)
    n = cols // gguf_block.BLOCK[kind]
    blocks = rng.integers(0, 256, (rows, n, BLOCK_BYTES[kind]), dtype=np.uint8)
    for at in HALVES[kind]:
        d = rng.uniform(0.5, 1.0, (rows, n)) * (1e-4 if gguf_block.BLOCK[kind] == 256 else 2e-3)
        d = np.where(rng.random((rows, n)) < 0.1, 2.0 ** -20, d) * rng.choice([-1, 1], (rows, n))  # subnormal
        blocks[..., at:at + 2] = d.astype(np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def shapes(kind: str):
    """Matrices [out, in] whose last superblock is whole or holds fewer lanes (in / 32 = 16 k + r)."""
    if gguf_block.BLOCK[kind] == 256:
        return [(7, 256), (9, 1536), (5, 8960)]  # r = 8, 0, 8
    return [(7, 96), (9, 512), (5, 896), (3, 1184)]  # r = 3, 0, 12, 5


def file_matrix(kind: str, shape, seed: int = 0):
    raw = random_blocks(kind, *shape, seed=seed)
    return BlockCodes.from_file(kind, raw, shape[1]), dequantize(raw, GGMLQuantizationType[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_each_type_reads_back_the_files_values_bit_for_bit(kind):
    for shape in shapes(kind):
        weight, reference = file_matrix(kind, shape)
        assert weight.shape == shape and reference.shape == shape
        assert weight.segments[0][1].shape == (shape[0], gguf_block.row_bytes(kind, shape[1]))
        dense = weight.dense().numpy()
        assert dense.dtype == np.float32 and np.isfinite(dense).all()
        assert np.array_equal(dense.view(np.uint32), reference.astype(np.float32).view(np.uint32)), (kind, shape)
        # the rows of a one-segment matrix and a stack of two read back as the rows and the stack
        rows = torch.tensor([shape[0] - 1, 0])
        assert torch.equal(weight[rows].dense(), torch.from_numpy(reference[rows.numpy()]))
        both = BlockCodes.cat([weight, weight[rows]])
        assert len(both.segments) == 1 and torch.equal(both.dense(), torch.cat([weight.dense(), weight[rows].dense()]))


@needs_kernel
def test_the_layout_sizes_agree_with_the_kernel_and_mixed_stacks_keep_each_type():
    for kind in KINDS:
        for _, cols in shapes(kind):
            assert gguf_block.kernel().gguf_block_row_bytes(KINDS.index(kind), cols) == gguf_block.row_bytes(kind, cols)
    q, k = file_matrix("Q4_K", (6, 512))[0], file_matrix("Q6_K", (3, 512), seed=1)[0]
    stack = BlockCodes.cat([q, k, q])
    assert [kind for kind, _ in stack.segments] == ["Q4_K", "Q6_K", "Q4_K"]
    x = torch.randn(3, 512)
    assert torch.equal(gguf_block.mm(x, stack), torch.cat([gguf_block.mm(x, q), gguf_block.mm(x, k),
                                                           gguf_block.mm(x, q)], dim=1))
    # a Linear in the file format reads some rows alone (one tensor) or off the whole (a stack of several)
    rows = torch.tensor([5, 0, 2])
    for weight in (q, stack):
        lin = Linear(weight, "file")
        assert lin.gguf is not None and torch.equal(lin.dense(rows), weight.dense()[rows])


def input_rounding(xq: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What float32 sums may move each output of xq @ w^T: 1e-5 of sum |xq| |w| (summation order; in <= 8960)."""
    return 1e-5 * (xq.abs().double() @ w.abs().double().t()) + 1e-12


@needs_kernel
@pytest.mark.parametrize("layout", PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_kernel_multiplies_by_the_files_values_on_each_path(kind, layout):
    # Stated tolerance: the kernel sums exact integer dot products of the codes and the int8 inputs, scaled in
    # float32; against the same quantized inputs (torch's own rounding, gguf_block.quantized_inputs) times the
    # gguf package's dequantized weights in float64 it differs by float32 rounding only (`input_rounding`).
    torch.manual_seed(1)
    for shape in shapes(kind):
        weight, reference = file_matrix(kind, shape)
        w = torch.from_numpy(reference)
        for rows in (1, 3, 4, 5, 16, 41):
            x = torch.randn(rows, shape[1])
            y = gguf_block.mm(x, weight, layout)
            xq = gguf_block.quantized_inputs(x)
            ref = xq.double() @ w.double().t()
            assert y.dtype == torch.float32 and y.shape == (rows, shape[0])
            assert ((y - ref).abs() <= input_rounding(xq, w)).all(), (shape, rows, ((y - ref).abs()).max())


@needs_kernel
def test_the_inputs_are_rounded_to_int8_per_32_as_llama_cpp_q8_0():
    """Against the unrounded product the outputs move by more than float32 sums do (the inputs are rounded), by no
    more than d / 2 = max|x_g| / 254 per input (times 1 + 2^-10 for d's own rounding); an all-zero group is 0."""
    weight, reference = file_matrix("Q8_0", (64, 1024))
    w = torch.from_numpy(reference).double()
    torch.manual_seed(2)
    x = torch.randn(5, 1024)
    x[1, 64:96] = 0
    y = gguf_block.mm(x, weight).double()
    exact = x.double() @ w.t()
    amax = x.abs().reshape(5, -1, 32).amax(-1).repeat_interleave(32, dim=1).double()
    bound = (amax / 254 * (1 + 2 ** -10)) @ w.abs().t() + input_rounding(x, w.float())
    assert ((y - exact).abs() <= bound).all()
    assert ((y - exact).abs() > input_rounding(x, w.float())).any()
    assert torch.equal(gguf_block.quantized_inputs(x)[1, 64:96], torch.zeros(32))


@needs_kernel
@pytest.mark.skipif("vnni" not in PATHS, reason="no AVX-512 VNNI here: one path")
@pytest.mark.parametrize("kind", KINDS)
def test_both_paths_give_the_same_bits(kind):
    torch.manual_seed(3)
    for shape in shapes(kind):
        weight, _ = file_matrix(kind, shape, seed=2)
        x = torch.randn(9, shape[1]) * 3
        assert torch.equal(gguf_block.mm(x, weight, "vnni"), gguf_block.mm(x, weight, "portable")), shape


@needs_kernel
@pytest.mark.parametrize("layout", PATHS)
@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_gets_the_same_bits_alone_in_a_block_and_in_a_prompt(layout, threads):
    """Row independence, on any thread count: so strict greedy equals AR greedy through these layers."""
    torch.manual_seed(4)
    previous = torch.get_num_threads()
    try:
        for kind, shape in (("Q6_K", (40, 8960)), ("Q5_0", (70, 896)), ("Q4_K", (33, 1536))):
            weight, _ = file_matrix(kind, shape)
            x = torch.randn(300 if layout == "vnni" else 40, shape[1])  # (a prompt: several blocks of rows)
            torch.set_num_threads(threads)
            y = gguf_block.mm(x, weight, layout)
            for i in (0, 1, 3, 4, 5, 17, x.shape[0] - 1):
                assert torch.equal(y[i:i + 1], gguf_block.mm(x[i:i + 1], weight, layout)), (kind, i)
            for rows in (2, 4, 6, 16):
                assert torch.equal(gguf_block.mm(x[5:5 + rows], weight, layout), y[5:5 + rows]), (kind, rows)
            torch.set_num_threads(3 - threads)
            assert torch.equal(gguf_block.mm(x, weight, layout), y), kind
    finally:
        torch.set_num_threads(previous)


# ------------------------------------------------------------------ a model


TYPES = {"q": "Q4_K", "k": "Q5_0", "v": "Q6_K", "o": "Q8_0", "gate": "Q4_0", "up": "Q5_1", "down": "Q4_1",
         "head": "Q6_K", "embed": "Q4_K"}


@pytest.fixture(scope="module")
def typed_file(tmp_path_factory):
    return write_qwen2(tmp_path_factory.mktemp("gguf") / "every-type.gguf", TYPES)


@needs_kernel
def test_a_qwen2_gguf_runs_in_its_own_types_against_transformers_on_its_weights(typed_file, capsys):
    lm = load_model(typed_file, dtype="file", weight_cache=False)
    assert lm.weight_format == "file" and lm.backend == "fast"
    note = capsys.readouterr().err
    assert "every matrix in the file's own type (" in note and "2 Q6_K" not in note and "3 Q6_K" in note, note
    qkv, o, gate_up, down = (lm.fast.layers[0][i] for i in (1, 2, 4, 5))
    assert [[kind for kind, _ in lin.gguf.segments] for lin in (qkv, o, gate_up, down, lm.fast.lm_head)] == [
        ["Q4_K", "Q5_0", "Q6_K"], ["Q8_0"], ["Q4_0", "Q5_1"], ["Q4_1"], ["Q6_K"]]
    assert lm.fast.embed.dtype == torch.float32
    reference = load_model(typed_file, dtype="float32", backend="transformers")  # gguf's dequantization
    state, weights = lm.state_dict(), reference.model.state_dict()
    assert sorted(state) == sorted(weights)
    for name in weights:  # the weights it multiplies by are the file's, bit for bit, the head and embedding too
        assert torch.equal(state[name], weights[name]), name
    a, b = logits_of(lm), logits_of(reference)
    # the kernel rounds every linear's input to int8 per 32 (as llama.cpp): measured 1.0 % of the largest logit
    # here, against 15 % for int4 (which re-quantizes the 5-, 6- and 8-bit matrices to 4 bits)
    assert (a - b).abs().max() < 0.03 * b.abs().max(), (a - b).abs().max() / b.abs().max()
    int4 = logits_of(load_model(typed_file, dtype="int4", weight_cache=False))
    assert (a - b).abs().max() < 0.5 * (int4 - b).abs().max()


@needs_kernel
def test_a_tied_head_is_the_embeddings_tensor_in_its_type_and_strict_greedy_equals_ar(typed_file, tmp_path):
    from relaxspec.engine import generate

    tied = write_qwen2(tmp_path / "tied.gguf", {"head": None, "embed": "Q8_0", "q": "Q6_K"}, layers=1)
    lm = load_model(tied, dtype="file", weight_cache=False)
    assert lm.model.config.tie_word_embeddings and [k for k, _ in lm.fast.lm_head.gguf.segments] == ["Q8_0"]
    reference = load_model(tied, dtype="float32", backend="transformers")
    assert torch.equal(lm.state_dict()["lm_head.weight"], reference.model.state_dict()["lm_head.weight"])
    a, b = logits_of(lm), logits_of(reference)
    assert (a - b).abs().max() < 0.03 * b.abs().max()
    verifier = load_model(typed_file, dtype="file", weight_cache=False)
    prompts = ["def ab(x):", "print(ab)"]
    ar = generate(verifier, None, prompts, method="ar", max_new_tokens=12, temperature=0.0, chat_template="off")
    strict = generate(verifier, lm, prompts, method="strict", draft_length=3, max_new_tokens=12, temperature=0.0,
                      chat_template="off")
    assert [r.token_ids for r in strict.results] == [r.token_ids for r in ar.results]
    assert min(len(r.token_ids) for r in ar.results) > 4


@needs_kernel
def test_a_matrix_of_a_type_without_a_kernel_runs_in_float32_and_the_line_says_so(tmp_path, capsys):
    path = write_qwen2(tmp_path / "f32.gguf", {"o": "F32"}, layers=1)
    lm = load_model(path, dtype="file", weight_cache=False)
    assert lm.fast.layers[0][2].format == "float32" and lm.fast.layers[0][1].format == "file"
    assert "without a kernel, in float32: 1 F32" in capsys.readouterr().err
    reference = load_model(path, dtype="float32", backend="transformers")
    assert (logits_of(lm) - logits_of(reference)).abs().max() < 0.03 * logits_of(reference).abs().max()


@needs_kernel
def test_the_weight_cache_keeps_the_format_under_its_own_key_and_maps_it(typed_file, cache, conversions, capsys):
    first = load_model(typed_file, dtype="file")
    expected = logits_of(first)
    path = weights_file(cache, "file")
    assert path.parent.name.endswith("-file-blocks")
    conversions["n"] = 0
    second = load_model(typed_file, dtype="file")
    assert conversions["n"] == 0  # nothing read from the GGUF file
    assert any("every matrix in the file's own type" in line for line in stderr_lines(capsys))
    assert torch.equal(logits_of(second), expected)
    ranges = mapped_ranges(path)
    assert inside(second.fast.layers[0][1].gguf.segments[1][1], ranges) and inside(second.fast.embed, ranges)
    assert [k for k, _ in second.fast.layers[0][1].gguf.segments] == ["Q4_K", "Q5_0", "Q6_K"]


def test_file_is_refused_off_a_cpu_and_for_a_model_without_the_files_types():
    with pytest.raises(ValueError, match="runs on a CPU only"):
        resolve_format("file", torch.device("meta"))
    assert resolve_format("file", torch.device("cpu")) == (torch.float32, "file")
    with pytest.raises(ValueError, match="--dtype file runs a qwen2 GGUF") as error:
        load_model("verifier", dtype="file")
    assert "\n" not in str(error.value)


def test_without_native_kernels_the_file_format_runs_the_same_values_in_float32(typed_file, tmp_path):
    """RELAXSPEC_NATIVE=0: no build; every matrix dequantized to float32 (the file's values, unrounded inputs),
    under the weight cache's own key for that layout."""
    code = ("import sys, torch; sys.path.insert(0, 'tests')\n"
            "from relaxspec.models import load_model\n"
            "from helpers import logits_of\n"
            f"lm = load_model({str(typed_file)!r}, dtype='file')\n"
            "ref = load_model(" + repr(str(typed_file)) + ", dtype='float32', backend='transformers')\n"
            "a, b = logits_of(lm), logits_of(ref)\n"
            "print(lm.fast.layers[0][1].format, lm.fast.lm_head.format, bool((a - b).abs().max() < 1e-3))\n")
    env = {**os.environ, "RELAXSPEC_NATIVE": "0", "RELAXSPEC_WEIGHT_CACHE_DIR": str(tmp_path / "weights"),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["float32", "float32", "True"], out.stdout + out.stderr[-2000:]
    entries = sorted(p.name.split("-", 1)[1] for p in (tmp_path / "weights").iterdir() if len(p.name) > 64)
    assert entries == ["file-float32", "tokenizer"]  # (the weights' entry under that layout's key, the tokenizer's)


@needs_kernel
def test_the_benchmark_script_runs_on_a_small_file(typed_file):
    """benchmarks/file_format.py (left out of test_benchmarks_run: it needs a qwen2 GGUF file) on the small one."""
    root = ROOT
    done = subprocess.run([sys.executable, "benchmarks/file_format.py", "--models", str(typed_file), "--prompts", "2",
                           "--max-new-tokens", "6", "--threads", "1", "--closeness", "float32",
                           "--repeats", "2"], cwd=root,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(f"| {typed_file} |")]
    assert [row.split(" | ")[1] for row in rows] == ["int4", "file"], done.stdout
    assert rows[0].split(" | ")[4] == "1.00 / 1.00"  # int4 against itself

"""The C sampler (acceptance/fused.py) against the torch path it replaces on float32 CPU tensors.

`process_logits_unchecked` and `sample_with_uniform` dispatch to the kernels when they are loaded; the torch
path is the reference, reached here by setting the loaded library to None (and, once, in a subprocess with
RELAXSPEC_NATIVE=0). Processed distributions: the same kept tokens, probabilities within 1e-6 relative; samples:
the same indices.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relaxspec.acceptance import fused
from relaxspec.acceptance.processing import process_logits_unchecked, sample_with_uniform
from helpers import NEEDS_KERNELS, kernel_loaded  # noqa: F401  (kernel_loaded: autouse)

pytestmark = NEEDS_KERNELS


ROOT = Path(__file__).resolve().parents[2]
REL = 1e-6  # kernel vs torch, relative


def torch_path(fn, *args):
    """fn(*args) on the torch path (the kernels' library set to None for the call)."""
    with fused.disabled():
        assert not fused.serves(torch.ones(1))
        return fn(*args)


def near_cut(z: torch.Tensor, top_p: float | None, eps: float = 2e-6) -> torch.Tensor:
    """[R, V] bool: tokens of logits z whose mass-before (float64, in stable descending order) lies within eps
    of top_p, where the float32 rounding of either path may decide the cut either way."""
    z = z.reshape(-1, z.shape[-1])
    if top_p is None or top_p >= 1.0:
        return torch.zeros(z.shape, dtype=torch.bool)
    sorted_z, order = z.double().sort(dim=-1, descending=True, stable=True)
    p = sorted_z.softmax(dim=-1)
    near = ((p.cumsum(dim=-1) - p - top_p).abs() < min(eps, top_p / 2))
    return torch.zeros(z.shape, dtype=torch.bool).scatter(-1, order, near)


def assert_same(kernel: torch.Tensor, ref: torch.Tensor, ambiguous: torch.Tensor | None = None) -> torch.Tensor:
    """The same kept tokens (except `ambiguous` ones [R, V], see near_cut) with the same probabilities; returns
    the rows whose kept sets are identical."""
    kernel, ref = kernel.reshape(-1, kernel.shape[-1]).double(), ref.reshape(-1, ref.shape[-1]).double()
    differ = (kernel > 0) != (ref > 0)
    if ambiguous is not None:
        assert not (differ & ~ambiguous).any(), "kept sets differ away from the top-p cut"
    else:
        assert not differ.any(), "kept sets differ"
    # Within a row, the tokens both keep agree to REL once a common factor is taken out: the mass of the
    # tokens only one keeps, and torch's float32 sum of V terms (the kernel sums in float64), which drifts
    # over a large V (measured 6e-6 at V = 49152) as a random walk of V roundings: 4 sqrt(V) 2^-24 allowed.
    ratio = torch.where((kernel > 0) & (ref > 0), kernel / ref, torch.nan)
    scale = ratio.nanmedian(dim=-1, keepdim=True).values
    rel = ((ratio / scale - 1).abs()).nan_to_num(0.0)
    assert rel.max().item() <= REL, f"probabilities differ by {rel.max().item():.3g} relative"
    only_one = ((kernel + ref) * differ).sum(dim=-1, keepdim=True)
    drift = (scale - 1).abs() - only_one
    assert drift.max().item() <= max(REL, 4 * math.sqrt(kernel.shape[-1]) * 2.0 ** -24), f"rows differ by {drift.max().item():.3g}"
    assert torch.allclose(kernel.sum(dim=-1), torch.ones(kernel.shape[0], dtype=torch.float64), atol=1e-5)
    return ~differ.any(dim=-1)


def tempered_top_k(z: torch.Tensor, temperature: float, k: int | None) -> torch.Tensor:
    """z / temperature with top-k applied (float32, as both paths compute it): what top-p then works on."""
    z = z / temperature
    if k is not None and k < z.shape[-1]:
        z = z.masked_fill(z < z.topk(k, dim=-1).values[..., -1:], float("-inf"))
    return z


def random_logits(rows: int, V: int, seed: int, scale: float = 3.0, neg_inf: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn((rows, V), generator=g) * scale
    if neg_inf:  # some rows with -inf entries (masked tokens), never the whole row
        masked = torch.rand((rows, V), generator=g) < 0.3
        masked[:, 0] = False
        masked[::2] = False
        z = z.masked_fill(masked, float("-inf"))
    return z


SETTINGS = [  # temperature, top_k, top_p
    (1.0, None, None), (0.7, None, 0.95), (0.7, None, None), (0.3, 20, None), (1.7, 5, 0.9), (0.7, None, 1.0),
    (1.0, None, 1e-6), (0.7, 1, 0.95), (1.2, 50, 0.5), (0.9, None, 0.999),
]


@pytest.mark.parametrize("V,rows", [(7, 400), (714, 200), (49152, 6)])
@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_process_matches_torch(V, rows, temperature, top_k, top_p):
    z = random_logits(rows, V, seed=V + rows)
    k = None if top_k is None else min(top_k, V)  # top_k >= V is off: V-1 below covers "almost off"
    kernel = process_logits_unchecked(z, temperature, k, top_p)
    ref = torch_path(process_logits_unchecked, z, temperature, k, top_p)
    masked = tempered_top_k(z, temperature, k)
    rows = assert_same(kernel, ref, near_cut(masked, top_p))
    # accuracy: exp in float64 of the same float32 z - max, renormalised over the kernel's kept set
    shifted = masked - masked.amax(dim=-1, keepdim=True)  # float32, as both paths compute it
    exact = shifted.double().masked_fill(kernel == 0, float("-inf")).softmax(dim=-1)
    rel = ((kernel.double() - exact).abs() / exact.clamp_min(1e-300))[rows]
    assert rows.any() and rel.max().item() <= REL


@pytest.mark.parametrize("V", [7, 714, 49152])
def test_top_k_of_almost_all_and_of_all(V):
    z = random_logits(8, V, seed=3)
    for k in (V - 1, V, V + 5):
        assert_same(process_logits_unchecked(z, 0.8, k, 0.97), torch_path(process_logits_unchecked, z, 0.8, k, 0.97),
                    near_cut(tempered_top_k(z, 0.8, k), 0.97))


def test_top_k_keeps_ties_with_the_kth_value():
    g = torch.Generator().manual_seed(1)
    z = torch.randn((50, 714), generator=g)
    kth = z.topk(10, dim=-1).values[:, 9:10]
    ties = torch.randint(0, 714, (50, 4), generator=g)
    z.scatter_(1, ties, kth.expand(-1, 4))  # up to 4 more tokens equal to the 10th largest
    expected = (z >= kth).sum(dim=-1)
    kernel = process_logits_unchecked(z, 0.7, 10, None)
    assert torch.equal((kernel > 0).sum(dim=-1), expected)
    assert (expected > 10).float().mean() > 0.9  # the ties are really there
    assert_same(kernel, torch_path(process_logits_unchecked, z, 0.7, 10, None))


@pytest.mark.parametrize("V", [714, 49152])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_top_p_ties_at_the_cut_keep_the_lowest_indices(V, temperature):
    # ten tokens of equal mass ~0.1 at scattered indices, the rest negligible: top_p 0.45 keeps exactly five,
    # the five lowest indices among the ten (the order of a stable descending sort)
    g = torch.Generator().manual_seed(V)
    rows = []
    for r in range(20):
        z = torch.full((V,), -40.0)
        tied = torch.randperm(V, generator=g)[:10]
        z[tied] = 5.0
        rows.append((z, tied.sort().values[:5]))
    z = torch.stack([row for row, _ in rows])
    kernel = process_logits_unchecked(z, temperature, None, 0.45)
    for (_, expected), got in zip(rows, kernel):
        assert torch.equal(got.nonzero().squeeze(-1), expected)
        assert torch.allclose(got[expected], torch.full((5,), 0.2))
    assert_same(kernel, torch_path(process_logits_unchecked, z, temperature, None, 0.45))


@pytest.mark.parametrize("keep", [10, 63, 64, 65, 100])
def test_top_p_ties_beyond_the_first_candidates(keep):
    # 1000 tokens of mass 0.001 each: the kernel's first 64 candidates hold only some of the ties, and the
    # set must still be the lowest indices, wherever it closes
    g = torch.Generator().manual_seed(keep)
    z = torch.full((3, 49152), -60.0)
    tied = torch.stack([torch.randperm(49152, generator=g)[:1000] for _ in range(3)])
    z.scatter_(1, tied, 0.0)
    top_p = (keep - 0.5) / 1000
    kernel = process_logits_unchecked(z, 1.0, None, top_p)
    for row, t in zip(kernel, tied):
        assert torch.equal(row.nonzero().squeeze(-1), t.sort().values[:keep])
    assert_same(kernel, torch_path(process_logits_unchecked, z, 1.0, None, top_p))


def test_top_p_mass_reaching_the_target_exactly_closes_the_set():
    # four tokens of mass 1/4 (exact in binary): the first two hold 0.5, so top_p = 0.5 keeps two, 0.75 three
    z = torch.tensor([[0.0, float("-inf"), 0.0, 0.0, float("-inf"), 0.0]])
    for top_p, kept in ((0.5, [0, 2]), (0.75, [0, 2, 3]), (0.25, [0]), (0.2500001, [0, 2])):
        for path in (process_logits_unchecked, lambda *a: torch_path(process_logits_unchecked, *a)):
            assert path(z, 1.0, None, top_p).nonzero()[:, 1].tolist() == kept


def test_a_set_that_closes_late_grows_past_the_first_candidates():
    # flat rows: the top-p set holds hundreds of tokens, beyond the kernel's first 64 candidates
    z = random_logits(4, 49152, seed=9, scale=0.05, neg_inf=False)
    kernel = process_logits_unchecked(z, 1.0, None, 0.9)
    assert ((kernel > 0).sum(dim=-1) > 40000).all()
    assert_same(kernel, torch_path(process_logits_unchecked, z, 1.0, None, 0.9), near_cut(z, 0.9))


def test_leading_dims_dtypes_and_strides():
    z = random_logits(24, 714, seed=5).view(2, 3, 4, 714)
    out = process_logits_unchecked(z, 0.7, None, 0.95)
    assert out.shape == z.shape and out.dtype == torch.float32
    assert_same(out, torch_path(process_logits_unchecked, z, 0.7, None, 0.95), near_cut(z.view(-1, 714) / 0.7, 0.95))
    strided = z.view(24, 714).t().contiguous().t()  # the same values, not contiguous
    assert not strided.is_contiguous()
    assert torch.equal(process_logits_unchecked(strided, 0.7, None, 0.95), out.view(24, 714))
    half = z.to(torch.bfloat16)  # upcast to float32, then the kernel
    assert_same(process_logits_unchecked(half, 0.7, None, 0.95),
                torch_path(process_logits_unchecked, half, 0.7, None, 0.95), near_cut(half.float().view(-1, 714) / 0.7, 0.95))
    double = z.double()  # float64: the torch path, untouched
    assert torch.equal(process_logits_unchecked(double, 0.7, None, 0.95),
                       torch_path(process_logits_unchecked, double, 0.7, None, 0.95))


@pytest.mark.parametrize("z", [[[3.0]], [[1.0, 1.0]], [[3e37, -3e37, 0.0]], [[-1e30, float("-inf"), -1e30 + 1e24]]])
def test_edge_rows(z):
    z = torch.tensor(z)
    for settings in ((0.7, None, 0.95), (1.0, 1, None), (0.7, 1, 0.5), (1.0, None, 1e-9), (2.0, None, None)):
        kernel = process_logits_unchecked(z, *settings)
        ref = torch_path(process_logits_unchecked, z, *settings)
        assert torch.allclose(kernel, ref, rtol=1e-6, atol=0), (settings, kernel, ref)
        u = torch.tensor([0.0, 0.5, 1.0 - 2.0 ** -53], dtype=torch.float64)
        w = kernel.expand(3, -1).contiguous()
        assert torch.equal(sample_with_uniform(w, u), torch_path(sample_with_uniform, w, u))
    empty = torch.zeros((0, 5))
    assert process_logits_unchecked(empty, 0.7, None, 0.95).shape == (0, 5)


def cdf_steps(w: torch.Tensor) -> torch.Tensor:
    c = w.double().cumsum(dim=-1)
    return c / c[:, -1:]


@pytest.mark.parametrize("V", [7, 714, 49152])
def test_sample_matches_torch(V):
    rows = 64 if V < 49152 else 8
    g = torch.Generator().manual_seed(V)
    probs = process_logits_unchecked(random_logits(rows, V, seed=V), 0.8, None, 0.9)  # zeros where cut
    weights = torch.rand((rows, V), generator=g) * (torch.rand((rows, V), generator=g) < 0.5)  # unnormalised
    weights[:, 0] = 0.5
    for w in (probs, weights):
        for _ in range(20):
            u = torch.rand(rows, generator=g, dtype=torch.float64)
            gap = (cdf_steps(w) - u.unsqueeze(-1)).abs().min(dim=-1).values
            keep = gap > 1e-9
            got = sample_with_uniform(w, u)
            ref = torch_path(sample_with_uniform, w, u)
            assert got.dtype == torch.int64 and got.shape == (rows,)
            assert torch.equal(got[keep], ref[keep])
            assert (w.gather(1, got.unsqueeze(-1)) > 0).all()


def test_sample_takes_strided_and_float32_uniforms():
    g = torch.Generator().manual_seed(2)
    w = process_logits_unchecked(random_logits(16, 714, seed=2), 0.9, None, 0.99)
    table = torch.rand((16, 5), generator=g, dtype=torch.float64)
    column = table[:, 3]  # as CounterDraws reads a round's table
    assert not column.is_contiguous()
    assert torch.equal(sample_with_uniform(w, column), sample_with_uniform(w, column.contiguous()))
    u32 = column.float()
    assert torch.equal(sample_with_uniform(w, u32), torch_path(sample_with_uniform, w, u32))


def test_sample_never_returns_a_zero_weight():
    w = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0, 0.0], [0.0, 0.0, 1e-30, 0.0, 1.0, 0.0], [0.2, 0.0, 0.0, 0.0, 0.0, 0.0]])
    last_positive = torch.tensor([3, 4, 0])
    first_positive = torch.tensor([1, 2, 0])
    for u in (1.0 - 2.0 ** -53, 1.0 - 1e-12, math.nextafter(1.0, 0.0)):
        got = sample_with_uniform(w, torch.full((3,), u, dtype=torch.float64))
        assert torch.equal(got, last_positive)
    assert torch.equal(sample_with_uniform(w, torch.zeros(3, dtype=torch.float64)), first_positive)


def test_sample_follows_the_weights():
    """Monte Carlo: frequencies of 200k draws within 5 standard errors of the normalised weights."""
    w = torch.tensor([0.0, 3.0, 1.0, 0.0, 0.5, 0.5, 5.0, 0.0])
    n = 200_000
    u = torch.rand(n, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    got = sample_with_uniform(w.expand(n, -1).contiguous(), u)
    freq = torch.bincount(got, minlength=8).double() / n
    p = w.double() / w.sum()
    se = (p * (1 - p) / n).sqrt()
    assert (freq[p == 0] == 0).all()
    assert ((freq - p).abs() <= 5 * se + 1e-12).all(), (freq, p)


def test_disabled_kernels_give_the_torch_path(tmp_path):
    """RELAXSPEC_NATIVE=0 in a fresh process: no library, and the torch path's results, which the kernel's
    equal within tolerance."""
    script = (
        "import torch, sys\n"
        "from relaxspec.acceptance import fused\n"
        "from relaxspec.acceptance.processing import process_logits_unchecked, sample_with_uniform\n"
        "assert fused.library() is None\n"
        "g = torch.Generator().manual_seed(11)\n"
        "z = torch.randn((40, 714), generator=g) * 3\n"
        "u = torch.rand(40, generator=g, dtype=torch.float64)\n"
        "p = process_logits_unchecked(z, 0.7, None, 0.95)\n"
        "torch.save({'z': z, 'u': u, 'p': p, 'x': sample_with_uniform(p, u)}, sys.argv[1])\n"
    )
    out = tmp_path / "torch_path.pt"
    env = {**os.environ, "RELAXSPEC_NATIVE": "0", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", script, str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    saved = torch.load(out)
    p = process_logits_unchecked(saved["z"], 0.7, None, 0.95)
    assert_same(p, saved["p"], near_cut(saved["z"] / 0.7, 0.95))
    gap = (cdf_steps(p) - saved["u"].unsqueeze(-1)).abs().min(dim=-1).values
    keep = gap > 1e-6  # the probabilities differ in the last bits, so the cdf steps may move by ~1e-7
    assert keep.float().mean() > 0.8
    assert torch.equal(sample_with_uniform(p, saved["u"])[keep], saved["x"][keep])


def test_round_table_equals_the_reference_streams_and_the_numpy_path():
    # A round's uniforms in one C call: bit for bit the definition (random.stream_bits) and the numpy hash.
    import importlib

    import numpy as np

    random = importlib.import_module("relaxspec.acceptance.random")
    if fused.library() is None:
        pytest.skip("no native kernels")
    seeds = [1, 2, 3, 2 ** 62 + 5]
    keys = random.SequenceSeeds(seeds, "cpu")
    start = np.array([0, 5, 100, 2 ** 33 + 7])
    for width in (1, 3, 10):
        table = random.CounterDraws(keys.low, keys.high, None, width, (*keys.host, start))
        with fused.disabled():
            numpy_table = random.CounterDraws(keys.low, keys.high, None, width, (*keys.host, start))
        for purpose, got in ((random.ACCEPT, table._u24[torch.float64]), (random.DRAFT, table._u53[random.DRAFT]),
                             (random.TOKEN, table._u53[random.TOKEN])):
            want = numpy_table._u24[torch.float64] if purpose == random.ACCEPT else numpy_table._u53[purpose]
            assert torch.equal(got, want)
            for b, seed in enumerate(seeds):
                for i in range(got.shape[1]):
                    position = int(start[b]) + i
                    if purpose == random.ACCEPT:
                        ref = (random.stream_bits(seed, purpose, 0, position) >> 8) / 2 ** 24
                    else:
                        high, low = (random.stream_bits(seed, purpose, w, position) for w in (1, 2))
                        ref = ((high >> 5) * 2 ** 26 + (low >> 6)) / 2 ** 53
                    assert got[b, i].item() == ref

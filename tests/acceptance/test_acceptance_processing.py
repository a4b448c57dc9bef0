"""process_logits and the divergence helpers, on hand-made rows."""

import math

import pytest
import torch

from relaxspec.acceptance import entropy, jsd, process_logits, total_variation
from relaxspec.acceptance.processing import capped_ratio
from relaxspec.acceptance.random import TOKEN, GeneratorDraws

INF = float("inf")


def test_temperature_scales_logits():
    z = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    assert torch.allclose(process_logits(z, 0.5), torch.softmax(z / 0.5, -1))
    assert torch.allclose(process_logits(z), torch.softmax(z, -1))


def test_top_k_keeps_k_and_renormalises():
    z = torch.tensor([[3.0, 1.0, 2.0, 0.0, -1.0]])
    p = process_logits(z, 1.0, top_k=2)
    expect = torch.zeros(5)
    expect[[0, 2]] = torch.softmax(torch.tensor([3.0, 2.0]), -1)
    assert torch.allclose(p[0], expect)
    assert torch.equal(process_logits(z, top_k=10), process_logits(z))  # k >= V: no-op


def test_top_p_smallest_set_reaching_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    z = probs.log().unsqueeze(0)
    # 0.5 < 0.7 <= 0.8: the two most likely tokens.
    assert torch.allclose(process_logits(z, top_p=0.7)[0], torch.tensor([0.625, 0.375, 0, 0]))
    # Mass before token 3 is exactly 0.8 >= 0.8: dropped.
    assert torch.allclose(process_logits(z, top_p=0.8)[0], torch.tensor([0.625, 0.375, 0, 0]), atol=1e-6)
    # Tiny top_p keeps at least the argmax.
    assert torch.allclose(process_logits(z, top_p=1e-9)[0], torch.tensor([1.0, 0, 0, 0]))
    assert torch.allclose(process_logits(z, top_p=1.0), process_logits(z))


def test_top_k_then_top_p_order():
    z = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # top-k 3 renormalises to (4/9, 3/9, 2/9); top-p 0.7 then keeps 2 tokens.
    assert torch.allclose(process_logits(z, 1.0, top_k=3, top_p=0.7)[0], torch.tensor([4 / 7, 3 / 7, 0, 0]))


def test_temperature_zero_is_one_hot_first_argmax():
    z = torch.tensor([[1.0, 3.0, 3.0, -INF], [-INF, -INF, 0.0, -5.0]])
    p = process_logits(z, 0.0, top_k=1, top_p=0.5)
    assert torch.equal(p, torch.tensor([[0.0, 1, 0, 0], [0, 0, 1, 0]]))


def test_masked_logits_and_half_precision():
    z = torch.tensor([[0.0, -INF, 1.0]])
    p = process_logits(z, 0.8, top_k=2)
    assert p[0, 1] == 0 and torch.isclose(p.sum(), torch.tensor(1.0))
    ph = process_logits(z.half())
    assert ph.dtype == torch.float32 and torch.allclose(ph, process_logits(z), atol=1e-3)


def test_divergences():
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.3, 0.7]])
    q = torch.tensor([[0.0, 1.0], [0.5, 0.5], [0.6, 0.4]])
    m = (p[2] + q[2]) / 2
    ref = 0.5 * float((p[2] * (p[2] / m).log()).sum() + (q[2] * (q[2] / m).log()).sum())
    assert torch.allclose(jsd(p, q), torch.tensor([math.log(2), 0.0, ref]), atol=1e-6)
    assert torch.allclose(jsd(p, q), jsd(q, p), atol=1e-7)
    assert torch.allclose(total_variation(p, q), torch.tensor([1.0, 0.0, 0.3]))
    assert torch.allclose(entropy(p), torch.tensor([0.0, math.log(2), -(0.3 * math.log(0.3) + 0.7 * math.log(0.7))]))


def test_capped_ratio_conventions():
    num = torch.tensor([0.5, 0.2, 0.0, 0.3, 0.0])
    den = torch.tensor([0.25, 0.4, 0.0, 0.0, 0.5])
    # q(x) = 0 is a draft the drafter could not have made: rejected (as vLLM), whatever p(x).
    assert torch.equal(capped_ratio(num, den), torch.tensor([1.0, 0.5, 0.0, 0.0, 0.0]))
    assert capped_ratio(torch.tensor([1.0]), torch.tensor([1e-45])).item() == 1.0  # overflow -> 1


def test_generator_draws_sample_law_and_zero_weights():
    g = torch.Generator().manual_seed(0)
    w = torch.tensor([0.0, 1.0, 0.0, 3.0, 0.0]).repeat(100_000, 1)
    s = GeneratorDraws(g, w.shape[0], "cpu").sample(w, TOKEN)
    assert set(s.unique().tolist()) <= {1, 3}
    freq = (s == 3).double().mean().item()
    assert abs(freq - 0.75) <= 5 * math.sqrt(0.75 * 0.25 / 1e5)


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)])
def test_process_logits_rejects_bad_sampling_args(bad):
    with pytest.raises(ValueError):
        process_logits(torch.zeros(1, 3), **bad)


def _top_p_reference(z, top_p):
    """The definition: a stable descending sort, a token dropped once the more likely ones hold top_p."""
    sorted_z, order = z.sort(dim=-1, descending=True, stable=True)
    probs = sorted_z.softmax(dim=-1)
    drop = probs.cumsum(dim=-1) - probs >= top_p
    drop[..., 0] = False
    return ~torch.zeros_like(drop).scatter_(-1, order, drop)


@pytest.mark.parametrize("V", [700, 6000])  # a sort below 4096 tokens, topk with a growing k above
def test_top_p_keeps_the_defined_set_ties_lowest_index_first(V):
    torch.manual_seed(0)
    z = torch.randn(7, V) * torch.tensor([[0.5], [2.0], [5.0], [20.0], [1.0], [3.0], [1.0]])
    z[4] = torch.round(z[4] * 2)  # many exact ties, at every cut
    z[5, 10:200] = 9.0  # a tie among the most likely tokens: which of them are kept is defined by index
    z[6, V // 2:] = float("-inf")  # masked tokens
    z = z.double()  # float64: the two ways of summing the masses agree to far below any token's probability
    for top_p in (1e-6, 0.3, 0.77, 0.95, 0.999):
        kept = process_logits(z, top_p=top_p) > 0
        assert torch.equal(kept, _top_p_reference(z, top_p)), top_p
    tied = process_logits(z[5:6], top_p=0.3)[0, 10:200] > 0
    assert tied.any() and not tied.all() and torch.equal(tied, tied.sort(descending=True, stable=True).values)

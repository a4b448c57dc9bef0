"""PAD's two floor semantics, each against a transcription of its definition on hand-made tensors."""

import pytest
import torch

from relaxspec.acceptance import process_logits, relaxed_targets, verify

INF = float("inf")
V = 6


def _block():
    """Rows chosen to hit every branch: P(pivot) below / at / above the threshold, drafts the strict
    test accepts or not, and verifier probabilities on both sides of the floor (before and after
    temperature and top-k)."""
    z_p = torch.tensor([
        [3.0, 2.0, 0.0, -1.0, -6.0, -12.0],
        [0.5, 0.4, 0.3, 0.0, -3.0, -9.0],
        [4.0, -2.0, -2.5, -5.0, -8.0, -20.0],
        [1.0, 1.0, 0.9, 0.8, -4.0, -7.0],
    ])
    z_q = torch.tensor([
        [0.0, 3.0, 0.5, 0.0, 2.0, 1.0],
        [1.0, 0.0, 0.0, 2.0, 0.0, 3.0],
        [0.0, 0.0, 2.0, 0.0, 4.0, 0.0],
        [0.5, 0.0, 0.0, 0.0, 2.5, 0.0],
    ])
    rows = torch.arange(4).repeat_interleave(V * 3)  # every (row, draft token, pivot level)
    x = torch.arange(V).repeat_interleave(3).repeat(4)
    pivot = torch.tensor([0.2, 0.5, 0.8]).repeat(4 * V)
    B = rows.numel()
    target = torch.stack([z_p[rows], z_p[rows]], 1)  # [B, 2, V]; the second row is the bonus position
    draft = z_q[rows].unsqueeze(1)
    return target, draft, x.view(B, 1), pivot.view(B, 1)


def _authors_accept(target, draft, x, pivot, threshold, min_prob, temperature, top_k):
    """The authors' decode.py, as probabilities: final = (sd | non_pivotal) & extra, with
    sd = u <= p_i/q_i (P = min(1, ratio)) when sampling, argmax(p) == argmax(q) at temperature 0;
    non_pivotal = not (P(pivot) > threshold); extra = softmax(z_p / T)(x) >= min_prob when sampling
    (their logits_to_probs divides the logits in place), p_i/q_i >= min_prob of the untempered
    softmaxes at temperature 0 (their logits_to_probs is a plain softmax there). One convention is
    the library's, not theirs: a draft with q(x) = 0 (never sampled in their loop) fails the strict
    test (their p_i/0 = inf would pass it)."""
    z_p, z_q, xi = target[:, 0], draft[:, 0], x[:, 0:1]
    non_pivotal = ~(pivot[:, 0] > threshold)
    if temperature > 0:
        p = process_logits(z_p, temperature, top_k)
        q = process_logits(z_q, temperature, top_k)
        q_x = q.gather(1, xi)[:, 0]
        sd = torch.where(q_x > 0, (p.gather(1, xi)[:, 0] / q_x).clamp(max=1), 0.0)
        extra = (z_p / temperature).softmax(-1).gather(1, xi)[:, 0] >= min_prob
    else:
        p, q = z_p.softmax(-1), z_q.softmax(-1)
        sd = (p.argmax(-1) == q.argmax(-1)).float()
        extra = (p.gather(1, xi) / q.gather(1, xi))[:, 0] >= min_prob
    return torch.where(non_pivotal, 1.0, sd) * extra


def _classifier_accept(target, draft, x, pivot, threshold, min_prob, temperature, top_k):
    """Today's PAD: the strict test, or accept when P(pivot) < threshold and softmax(z_p)(x) >= min_prob."""
    z_p, z_q, xi = target[:, 0], draft[:, 0], x[:, 0:1]
    p = process_logits(z_p, temperature, top_k)
    q = process_logits(z_q, temperature, top_k)
    strict = torch.nan_to_num(p.gather(1, xi) / q.gather(1, xi), nan=0.0).clamp(max=1)[:, 0]
    strict = torch.where(q.gather(1, xi)[:, 0] > 0, strict, 0.0)
    harmless = (pivot[:, 0] < threshold) & (z_p.softmax(-1).gather(1, xi)[:, 0] >= min_prob)
    return torch.where(harmless, 1.0, strict)


@pytest.mark.parametrize("floor,transcription", [("authors", _authors_accept), ("classifier", _classifier_accept)])
@pytest.mark.parametrize("temperature,top_k", [(0.7, 3), (1.0, None), (0.0, None)])
@pytest.mark.parametrize("min_prob", [1e-4, 0.02, 0.3])
def test_floor_matches_its_transcription(floor, transcription, temperature, top_k, min_prob):
    target, draft, x, pivot = _block()
    threshold = 0.5
    got = relaxed_targets("pad", target, draft, x, temperature=temperature, top_k=top_k, threshold=threshold,
                          min_prob=min_prob, floor=floor, pivot_prob=pivot).accept_prob[:, 0]
    want = transcription(target, draft, x, pivot, threshold, min_prob, temperature, top_k)
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    # The cases that tell the two floors apart all occur in this block.
    other = _classifier_accept if floor == "authors" else _authors_accept
    assert not torch.allclose(want, other(target, draft, x, pivot, threshold, min_prob, temperature, top_k))


def test_pivot_prob_equal_to_the_threshold():
    """classifier: harmless iff P(pivot) < threshold; authors: non-pivotal iff P(pivot) <= threshold."""
    target, draft, x, pivot = _block()
    at = pivot == 0.5
    strict = relaxed_targets("strict", target, draft, x).accept_prob
    common = dict(threshold=0.5, min_prob=0.0, pivot_prob=pivot)
    cls = relaxed_targets("pad", target, draft, x, floor="classifier", **common).accept_prob
    auth = relaxed_targets("pad", target, draft, x, floor="authors", **common).accept_prob
    sel = at & (strict < 1)
    assert sel.any() and torch.equal(cls[sel], strict[sel]) and (auth[sel] == 1).all()


def test_authors_floor_rejects_what_the_strict_test_accepts():
    target, draft, x, pivot = _block()
    kw = dict(threshold=0.5, min_prob=0.3, pivot_prob=torch.ones_like(pivot))  # everything pivotal
    strict = relaxed_targets("strict", target, draft, x, temperature=0.7).accept_prob
    auth = relaxed_targets("pad", target, draft, x, temperature=0.7, floor="authors", **kw).accept_prob
    cls = relaxed_targets("pad", target, draft, x, temperature=0.7, floor="classifier", **kw).accept_prob
    assert torch.equal(cls, strict)  # all pivotal: the classifier floor is exactly strict
    assert ((auth == 0) & (strict > 0)).any() and (auth <= strict).all()


def test_threshold_zero_is_strict_only_with_the_classifier_floor():
    target, draft, x, pivot = _block()
    pivot = pivot.clone()
    pivot[::3] = 0.0  # P(pivot) = 0: non-pivotal for the authors even at threshold 0
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    strict = verify("strict", target, draft, x, temperature=0.7, generator=g())
    cls = verify("pad", target, draft, x, temperature=0.7, generator=g(), threshold=0.0, pivot_prob=pivot)
    auth = verify("pad", target, draft, x, temperature=0.7, generator=g(), threshold=0.0, pivot_prob=pivot,
                  floor="authors")
    assert torch.equal(cls.tokens, strict.tokens)
    assert not torch.equal(auth.accept_prob, strict.accept_prob)


def test_greedy_verify_keeps_the_longest_prefix_of_the_authors_mask():
    """At temperature 0 the authors' final mask is 0/1; verify keeps its longest all-ones prefix and
    then emits the verifier's argmax, as their decode loop does."""
    g = torch.Generator().manual_seed(5)
    B, N = 2000, 4
    target = 1.5 * torch.randn(B, N + 1, V, generator=g)
    draft = target[:, :N] + torch.randn(B, N, V, generator=g)
    x = draft.argmax(-1)
    pivot = torch.rand(B, N, generator=g)
    res = verify("pad", target, draft, x, temperature=0.0, threshold=0.5, min_prob=0.05, floor="authors",
                 pivot_prob=pivot)
    p, q = target[:, :N].softmax(-1), draft.softmax(-1)
    ratio = (p.gather(2, x[..., None]) / q.gather(2, x[..., None]))[..., 0]
    final = ((p.argmax(-1) == q.argmax(-1)) | ~(pivot > 0.5)) & (ratio >= 0.05)
    n = final.int().cumprod(1).sum(1)
    assert torch.equal(res.num_accepted, n)
    assert torch.equal(res.tokens.gather(1, n[:, None])[:, 0], target.argmax(-1).gather(1, n[:, None])[:, 0])
    assert len(set(n.tolist())) == N + 1

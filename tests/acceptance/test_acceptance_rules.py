"""Rule-specific facts: exact laws, orderings, formulas, and sanity for every rule."""

import math

import pytest
import torch

from relaxspec.acceptance import RULES, build_context, process_logits, relaxed_targets, verify
from relaxspec.acceptance.processing import jsd
from helpers import SAMPLINGS, assert_law, exact_first_law, random_block, run_mc, sample_drafts

M = 200_000
INF = float("inf")


def _inputs(method, shape, seed=0):
    if method != "pad":
        return {}
    return {"pivot_prob": torch.rand(shape, generator=torch.Generator().manual_seed(seed))}


# ---------------------------------------------------------------- every rule


@pytest.mark.parametrize("method", list(RULES))
@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_loop_samples_the_law_of_the_rule_targets(method, sampling):
    """The shared loop (gathered residual rows, fallback, cut) matches the dense targets."""
    target, draft = random_block(seed=21, B=1, N=2, V=8, bonus_draft=True)
    params = _inputs(method, (2,), seed=1)
    res = run_mc(method, target[0], draft[0], M, sampling, seed=6, **params)
    law = exact_first_law(method, target[0], draft[0], sampling, **params)
    assert_law(res.tokens[:, 0], law, f"{method} position 1")
    bonus = relaxed_targets(method, target, draft, torch.zeros(1, 2, dtype=torch.long), **sampling,
                            **{k: v[None] for k, v in params.items()}).bonus[0]
    all_acc = res.num_accepted == 2
    assert all_acc.sum() > 10_000
    assert_law(res.tokens[all_acc, 2], bonus, f"{method} bonus")


@pytest.mark.parametrize("method", list(RULES))
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.6])
def test_targets_are_well_defined(method, temperature):
    """No NaN (greedy and masked logits included); probabilities in range; normalised."""
    target, draft = random_block(seed=22, B=32, N=3, V=10, bonus_draft=True)
    target[:, :, 7] = -INF  # banned by the verifier
    draft[:, :, 3] = -INF  # banned by the drafter
    draft[:5, :, 7] = -INF
    x = torch.randint(0, 10, (32, 3), generator=torch.Generator().manual_seed(0))
    params = _inputs(method, (32, 3))
    tg = relaxed_targets(method, target, draft, x, temperature=temperature, top_k=6, **params)
    for t in (tg.accept_prob, tg.residual, tg.bonus):
        assert not t.isnan().any()
    assert ((tg.accept_prob >= 0) & (tg.accept_prob <= 1)).all()
    assert torch.allclose(tg.residual.sum(-1), torch.ones(32, 3), atol=1e-5) and (tg.residual >= 0).all()
    assert torch.allclose(tg.bonus.sum(-1), torch.ones(32), atol=1e-5)
    res = verify(method, target, draft, x, temperature=temperature, top_k=6, **params)
    assert ((res.tokens >= -1) & (res.tokens < 10)).all()


@pytest.mark.parametrize("method", list(RULES))
def test_gathered_residual_rows_equal_dense_rows(method):
    target, draft = random_block(seed=23, B=16, N=4, V=30)
    x = torch.randint(0, 30, (16, 4), generator=torch.Generator().manual_seed(0))
    ctx = build_context(target, draft, x, temperature=0.8, top_k=20)
    rule = RULES[method]
    params = rule.validate(_inputs(method, (16, 4)), batch_shape=(16, 4))
    dense = rule.residual(ctx.drafts(), **params)
    b, i = torch.arange(16), torch.randint(0, 4, (16,), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(rule.residual(ctx.rows(b, i), **params), dense[b, i])


def test_relaxed_only_marks_bent_positions():
    target, draft = random_block(seed=24, B=20000, N=3, V=10, noise=2.0)
    x = sample_drafts(draft, 3, SAMPLINGS["t1"], seed=0)
    res = verify("ensemble", target, draft, x, weight=0.0, generator=torch.Generator().manual_seed(0))
    assert (res.num_accepted == 3).all()  # w = 0 accepts everything
    # Exactly the kept positions the strict test would have rejected with the same u.
    freq = res.relaxed_only.double().mean()
    expect = (1 - res.strict_accept_prob.double()).mean()
    assert abs(freq - expect) < 5 * math.sqrt(expect * (1 - expect) / 60000) + 1e-3
    assert not (res.relaxed_only & (res.strict_accept_prob >= 1)).any()


# ---------------------------------------------------------------- ensemble


@pytest.mark.parametrize("weight", [0.8, 0.0])
def test_ensemble_output_law_is_the_mixture(weight):
    sampling = SAMPLINGS["t07_k5_p09"]
    target, draft = random_block(seed=25, B=1, N=2, V=8, noise=1.5)
    res = run_mc("ensemble", target[0], draft[0], M, sampling, seed=8, weight=weight)
    p = process_logits(target[0], **sampling)
    q = process_logits(draft[0], **sampling)
    for k in range(2):
        assert_law(res.tokens[res.num_accepted >= k, k], weight * p[k] + (1 - weight) * q[k], f"ensemble pos {k + 1}")
    # The rule's targets imply the same law exactly.
    assert torch.allclose(exact_first_law("ensemble", target[0], draft[0], sampling, weight=weight).float(),
                          weight * p[0] + (1 - weight) * q[0], atol=1e-5)


# ---------------------------------------------------------------- fuzzy / r-fuzzy


def test_fuzzy_and_rfuzzy_same_output_law_on_mixed_gates():
    sampling = SAMPLINGS["t1"]
    V, G, per = 8, 4, 100_000
    g = torch.Generator().manual_seed(26)
    target = 1.5 * torch.randn(G, 2, V, generator=g)
    noise = torch.tensor([0.1, 0.2, 2.0, 3.0])[:, None, None]  # two close drafters, two far
    draft = target[:, :1] + noise * torch.randn(G, 1, V, generator=g)
    p, q = process_logits(target[:, 0]), process_logits(draft[:, 0])
    d = jsd(p, q)
    threshold = 0.1
    passes = d < threshold
    assert passes.tolist() == [True, True, False, False], d
    t = target.repeat_interleave(per, 0)
    dl = draft.repeat_interleave(per, 0)
    x = sample_drafts(dl, 1, sampling, seed=1)
    group = torch.arange(G).repeat_interleave(per)
    out = {}
    for method in ("fuzzy", "r-fuzzy"):
        res = verify(method, t, dl, x, threshold=threshold, generator=torch.Generator().manual_seed(2))
        out[method] = res
        for j in range(G):
            expect = q[j] if passes[j] else p[j]  # both rules emit q or p at a position
            assert_law(res.tokens[group == j, 0], expect, f"{method} group {j}")
    assert (out["r-fuzzy"].accept_prob >= out["fuzzy"].accept_prob).all()
    # r-fuzzy accepts strictly more on the failing groups (strict test instead of 0).
    assert out["r-fuzzy"].accepted[group >= 2].double().mean() > 0.1
    assert not out["fuzzy"].accepted[group >= 2].any()


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.2, 0.3, 0.7])
def test_rfuzzy_accepts_at_least_as_often_as_fuzzy(threshold):
    target, draft = random_block(seed=27, B=256, N=4, V=16, noise=0.8)
    x = sample_drafts(draft, 4, SAMPLINGS["t1"], seed=0)
    a = relaxed_targets("fuzzy", target, draft, x, threshold=threshold).accept_prob
    b = relaxed_targets("r-fuzzy", target, draft, x, threshold=threshold).accept_prob
    assert (b >= a).all()


# ---------------------------------------------------------------- cactus / mentored


@pytest.mark.parametrize("method,grid", [
    ("cactus", [0.0, 1e-3, 0.1, 0.25, 1.0, 10.0, 1e3]),
    ("mentored", [0.0, 0.01, 0.3, 0.7, 0.95, 0.999]),
])
@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.0])
def test_acceptance_at_least_strict_and_monotone(method, grid, temperature):
    target, draft = random_block(seed=28, B=256, N=4, V=16)
    x = sample_drafts(draft, 4, dict(temperature=1.0), seed=0)
    name = {"cactus": "delta", "mentored": "alpha"}[method]
    strict = relaxed_targets("strict", target, draft, x, temperature=temperature).accept_prob
    prev = strict
    for v in grid:
        a = relaxed_targets(method, target, draft, x, temperature=temperature, **{name: v}).accept_prob
        assert (a >= strict).all() and (a >= prev).all(), (method, v)
        prev = a
    if temperature > 0:
        assert (prev > strict).any()


def test_cactus_formula():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    target = p.log().view(1, 1, 3).expand(1, 2, 3)
    draft = q.log().view(1, 1, 3)
    delta = 0.1
    h = min(1.0, 0.3 + math.sqrt(2 * delta * 0.3 * 0.7))
    H = p * (1 - h) / 0.7
    H[1] = h
    tg = relaxed_targets("cactus", target, draft, torch.tensor([[1]]), delta=delta)
    assert math.isclose(tg.accept_prob.item(), min(1.0, h / 0.6), rel_tol=1e-5)
    r = (H - q).clamp_min(0)
    assert torch.allclose(tg.residual[0, 0], r / r.sum(), atol=1e-6)


def test_mentored_formula():
    target = torch.tensor([0.5, 0.3, 0.2]).log().view(1, 1, 3).expand(1, 2, 3)
    draft = torch.tensor([0.2, 0.6, 0.2]).log().view(1, 1, 3)
    tg = relaxed_targets("mentored", target, draft, torch.tensor([[1]]), alpha=0.3)
    assert math.isclose(tg.accept_prob.item(), 0.3 / (0.7 * 0.6), rel_tol=1e-5)


# ---------------------------------------------------------------- cascades


def test_spec_casc_opt_gate():
    p = torch.tensor([0.6, 0.3, 0.1])
    q_close = torch.tensor([0.5, 0.3, 0.2])  # max q 0.5; TV 0.1
    t = p.log().view(1, 1, 3).expand(2, 2, 3)
    d = torch.stack([q_close, q_close]).log().view(2, 1, 3)
    x = torch.tensor([[2], [2]])
    strict = min(1.0, 0.1 / 0.2)
    for alpha, expect in [(0.0, strict), (-0.1, strict), (1.0, 1.0), (2.0, 1.0), (1e30, 1.0), (-1e30, strict)]:
        a = relaxed_targets("spec-casc-opt", t, d, x, alpha=alpha).accept_prob
        assert torch.allclose(a, torch.full((2, 1), expect)), alpha  # gate: 0.5 >= 0.6 - 0.1·α


def test_spec_casc_tok_formula():
    z_p = torch.tensor([2.0, 1.9, 0.0, -1.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    T = 0.5
    p = torch.softmax(z_p / T, -1)
    pt = torch.softmax(z_p, -1)
    target = z_p.view(1, 1, 4).expand(1, 2, 4)
    draft = (q.log() * T).view(1, 1, 4)  # processed at temperature T, this is q again
    for alpha in (0.0, 0.35, 0.8, 1.0):
        in_a = pt >= (1 - alpha) * pt.max()
        pi = q * in_a + q[~in_a].sum() * p
        for xv in range(4):
            tg = relaxed_targets("spec-casc-tok", target, draft, torch.tensor([[xv]]), temperature=T, alpha=alpha)
            assert math.isclose(tg.accept_prob.item(), min(1.0, float(pi[xv] / q[xv])), rel_tol=1e-5, abs_tol=1e-7)
            r = (pi - q).clamp_min(0)
            if r.sum() > 1e-6:
                assert torch.allclose(tg.residual[0, 0], r / r.sum(), atol=1e-5)
    # α = 1: π = q, everything is accepted.
    assert (relaxed_targets("spec-casc-tok", target, draft, torch.tensor([[3]]), alpha=1.0).accept_prob == 1).all()


# ---------------------------------------------------------------- typical


def test_typical_ignores_the_drafter():
    target, draft = random_block(seed=29, B=128, N=4, V=20)
    other = torch.randn(128, 4, 20, generator=torch.Generator().manual_seed(5)) * 4
    x = torch.randint(0, 20, (128, 4), generator=torch.Generator().manual_seed(6))
    for sampling in (SAMPLINGS["t1"], SAMPLINGS["t07_k5_p09"], dict(temperature=0.0)):
        a = verify("typical", target, draft, x, **sampling, generator=torch.Generator().manual_seed(1))
        b = verify("typical", target, other, x, **sampling, generator=torch.Generator().manual_seed(1))
        assert torch.equal(a.accept_prob, b.accept_prob) and torch.equal(a.tokens, b.tokens)
    assert RULES["typical"].reads_q is False


def test_typical_formula_and_argmax_residual():
    p = torch.tensor([0.7, 0.2, 0.06, 0.04])
    target = p.log().view(1, 1, 4).expand(1, 2, 4)
    draft = torch.zeros(1, 1, 4)
    h = -(p * p.log()).sum()
    thr = min(0.09, 0.3 * math.exp(-h))
    for xv in range(4):
        tg = relaxed_targets("typical", target, draft, torch.tensor([[xv]]))
        assert tg.accept_prob.item() == float(p[xv] > thr)
        assert torch.equal(tg.residual[0, 0], torch.tensor([1.0, 0, 0, 0]))


# ---------------------------------------------------------------- spec-cont-dec


def test_spec_cont_dec_stays_in_the_verifier_support():
    B, N, V = 50_000, 3, 16
    target, draft = random_block(seed=30, B=1, N=N, V=V, noise=2.0, bonus_draft=True)
    sampling = dict(temperature=1.0, top_k=3)
    res = run_mc("spec-cont-dec", target[0], draft[0], B, sampling, seed=3, beta=1.0)
    support = process_logits(target[0], **sampling) > 0  # [N+1, V]
    emitted = res.tokens >= 0
    pos = torch.arange(N + 1).expand(B, N + 1)
    assert support[pos[emitted], res.tokens[emitted]].all()
    # Drafts outside the support were proposed, and never accepted.
    assert (res.strict_accept_prob == 0).any()
    assert (res.accept_prob[res.strict_accept_prob == 0] == 0).all()


def test_spec_cont_dec_formula_and_relaxed_bonus():
    z_p = torch.tensor([[1.0, 0.5, 0.0, -2.0], [0.3, 0.2, 0.1, 0.0]])
    z_q = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, -INF, 0.0, 0.0]])
    target = z_p.unsqueeze(0)
    beta, T = 0.5, 0.8
    sampling = dict(temperature=T, top_k=3)
    pi = torch.softmax(((1 + beta) * z_p - beta * z_q) / T, -1)
    support = process_logits(z_p, **sampling) > 0
    pi = pi * support
    pi = pi / pi.sum(-1, keepdim=True)
    # Position 1 (drafter row 0) and the relaxed bonus (drafter row 1 has a -inf logit).
    tg = relaxed_targets("spec-cont-dec", target, z_q.unsqueeze(0), torch.tensor([[0]]), beta=beta, **sampling)
    q0 = process_logits(z_q[0], **sampling)
    assert math.isclose(tg.accept_prob.item(), min(1.0, float(pi[0, 0] / q0[0])), rel_tol=1e-5)
    assert torch.equal(tg.bonus[0], torch.tensor([0.0, 1.0, 0.0, 0.0]))  # +inf contrast wins, in support
    # Without the drafter's bonus-position row: an error, not a silent fall-back to p.
    for fn in (relaxed_targets, verify):
        with pytest.raises(ValueError, match=r"rule 'spec-cont-dec' needs the drafter's row at the bonus position"):
            fn("spec-cont-dec", target, z_q[:1].unsqueeze(0), torch.tensor([[0]]), beta=beta, **sampling)


# ---------------------------------------------------------------- pad


def test_pad_classifier_branch():
    p = torch.tensor([0.5, 0.49995, 0.00005])
    q = torch.tensor([0.1, 0.1, 0.8])
    target = p.log().view(1, 1, 3).expand(3, 2, 3)
    draft = q.log().view(1, 1, 3).expand(3, 1, 3)
    x = torch.tensor([[1], [2], [1]])
    pivot = torch.tensor([[0.2], [0.2], [0.6]])
    a = relaxed_targets("pad", target, draft, x, pivot_prob=pivot, threshold=0.5).accept_prob[:, 0]
    strict = relaxed_targets("strict", target, draft, x).accept_prob[:, 0]
    assert a[0] == 1.0  # harmless by the classifier (strict would also accept: p/q > 1)
    assert torch.isclose(a[1], strict[1]) and a[1] < 1e-3  # p(x) < min_prob: strict test only
    assert a[2] == 1.0  # P(pivot) 0.6 >= 0.5, but the strict test accepts (p/q > 1)
    pivot2 = torch.tensor([[0.6], [0.2], [0.1]])
    x2 = torch.tensor([[2], [2], [2]])
    a2 = relaxed_targets("pad", target, draft, x2, pivot_prob=pivot2, threshold=0.5, min_prob=0.0).accept_prob[:, 0]
    assert torch.allclose(a2, torch.tensor([float(strict[1]), 1.0, 1.0]))


def test_rules_listing_is_complete():
    assert list(RULES) == ["strict", "cactus", "mentored", "fuzzy", "r-fuzzy", "spec-casc-opt",
                           "spec-casc-tok", "ensemble", "spec-cont-dec", "typical", "threshold", "topk-delta",
                           "topk-ratio", "fly", "regret-budget", "pad"]
    for name, rule in RULES.items():
        assert rule.name == name and rule.description
        for spec in rule.params.values():
            checked = rule.validate({spec.name: spec.default, **_inputs(name, (1, 1))})
            assert checked[spec.name] == spec.default
            for v in spec.grid:
                rule.validate({spec.name: v, **_inputs(name, (1, 1))})
            assert spec.range_str()
    assert RULES["cactus"].params["delta"].grid == (0.1, 0.25, 1.0, 10.0)
    assert RULES["spec-casc-opt"].params["alpha"].grid == (-0.1, 0.0, 0.05)
    assert RULES["typical"].params["epsilon"].default == 0.09 and RULES["typical"].params["delta"].default == 0.3
    assert "pivot_prob" in RULES["pad"].inputs


def test_pad_greedy_classifier_branch_uses_the_untempered_probability():
    """At temperature 0 the processed p is one-hot; the min_prob floor must read softmax(z_p) instead."""
    from relaxspec.acceptance import verify

    target = torch.tensor([[[2.0, 1.5, -9.0], [0.0, 0.0, 0.0]]])  # argmax 0; token 1 plausible, token 2 not
    draft = torch.tensor([[[0.0, 3.0, 0.0]]])
    for token, expected in [(1, 1), (2, 0)]:
        res = verify("pad", target, draft, torch.tensor([[token]]), temperature=0.0, threshold=0.5,
                     pivot_prob=torch.zeros(1, 1))
        assert int(res.num_accepted) == expected
    strict = verify("pad", target, draft, torch.tensor([[1]]), temperature=0.0, threshold=0.0,
                    pivot_prob=torch.zeros(1, 1))
    assert int(strict.num_accepted) == 0


@pytest.mark.parametrize("method", list(RULES))
@pytest.mark.parametrize("greedy", [False, True])
def test_num_drafts_verifies_each_row_as_its_own_shorter_block(method, greedy):
    """verify(num_drafts=k): row b's result is that of the block cut to its first k[b] drafts (its token
    after them from the rule's bonus at position k[b]), with the same per-sequence draws; k = 0 samples
    the verifier's position 0 like an AR step. So a row's result does not depend on the block's width."""
    from relaxspec.acceptance import SequenceSeeds

    B, N, V = 6, 4, 12
    target, draft = random_block(seed=5, B=B, N=N, V=V, bonus_draft=True)
    sampling = dict(temperature=0.0 if greedy else 0.9, top_p=None if greedy else 0.95)
    tokens = sample_drafts(draft, N, sampling, seed=2)
    k = torch.tensor([4, 2, 0, 1, 3, 0])
    seeds = SequenceSeeds(range(B), torch.device("cpu"))
    start = torch.arange(B) * 7
    params = _inputs(method, (B, N), seed=3)
    extra = RULES[method].extra_draft_passes
    ragged = verify(method, target, draft if extra else draft[:, :N], tokens, **sampling, num_drafts=k,
                    random=seeds.at(start, N), **params)
    # the token after the kept drafts, as the engine reads it
    assert torch.equal(ragged.last_token, ragged.tokens.gather(1, ragged.num_accepted[:, None]).squeeze(1))
    assert (ragged.tokens >= 0).sum(dim=1).tolist() == (ragged.num_accepted + 1).tolist()
    for b in range(B):
        one = SequenceSeeds([b], torch.device("cpu")).at(start[b:b + 1], N)
        if k[b] == 0:
            if greedy:
                assert ragged.tokens[b, 0] == target[b, 0].argmax()
            else:
                assert ragged.tokens[b, 0] == one.sample(process_logits(target[b:b + 1, 0], **sampling), 3)
            assert ragged.num_accepted[b] == 0
            continue
        n = int(k[b])
        alone = verify(method, target[b:b + 1, :n + 1], draft[b:b + 1, :n + extra], tokens[b:b + 1, :n], **sampling,
                       random=one, **{name: value[b:b + 1, :n] for name, value in params.items()})
        assert ragged.num_accepted[b] == alone.num_accepted[0], b
        assert torch.equal(ragged.tokens[b, :n + 1], alone.tokens[0]), b
        assert not ragged.accepted[b, n:].any()

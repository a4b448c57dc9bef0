"""What each rule declares (needs, one-hot-q validity, temperature-0 behaviour), checked against
what it does; the temperature-0 settings; float32 upcast; edge cases of the reference."""

import math

import pytest
import torch

from relaxspec.acceptance import RULES, check_one_hot_q, process_logits, relaxed_targets, verify
from helpers import random_block

INF = float("inf")
SAMPLING = dict(temperature=0.8, top_k=6)


def _inputs(method, shape, seed=0):
    if "pivot_prob" not in RULES[method].inputs:
        return {}
    return {"pivot_prob": torch.rand(shape, generator=torch.Generator().manual_seed(seed))}


def _targets(method, target, draft, x, **kw):
    tg = relaxed_targets(method, target, draft, x, **kw, **_inputs(method, tuple(x.shape)))
    return torch.cat([tg.accept_prob.flatten(), tg.residual.flatten(), tg.bonus.flatten()])


# ---------------------------------------------------------------- needs


@pytest.mark.parametrize("method", list(RULES))
def test_reads_q_declaration_matches_behaviour(method):
    """A rule reads q iff changing the drafter (logits and so q) changes its targets."""
    target, draft = random_block(seed=40, B=64, N=3, V=12, bonus_draft=True)
    other = draft + 2.0 * torch.randn(draft.shape, generator=torch.Generator().manual_seed(1))
    x = torch.randint(0, 12, (64, 3), generator=torch.Generator().manual_seed(2))
    for sampling in (SAMPLING, dict(temperature=1.0)):
        same = torch.equal(_targets(method, target, draft, x, **sampling),
                           _targets(method, target, other, x, **sampling))
        assert same == (not RULES[method].reads_q), (method, sampling)


@pytest.mark.parametrize("method", list(RULES))
def test_extra_draft_passes_declaration_matches_behaviour(method):
    """The bonus-position drafter row matters iff the rule declares the extra pass; without the row
    such a rule is an error."""
    rule = RULES[method]
    target, draft = random_block(seed=41, B=64, N=3, V=12, bonus_draft=True)
    moved = draft.clone()
    moved[:, -1] += 3.0 * torch.randn(64, 12, generator=torch.Generator().manual_seed(3))
    x = torch.randint(0, 12, (64, 3), generator=torch.Generator().manual_seed(4))
    same = torch.equal(_targets(method, target, draft, x, **SAMPLING), _targets(method, target, moved, x, **SAMPLING))
    assert same == (rule.extra_draft_passes == 0)
    assert rule.extra_draft_passes in (0, 1)
    if rule.extra_draft_passes:
        with pytest.raises(ValueError, match=rf"rule '{method}' needs the drafter's row at the bonus position"):
            verify(method, target, draft[:, :3], x, **SAMPLING, **_inputs(method, (64, 3)))
    else:
        verify(method, target, draft[:, :3], x, **SAMPLING, **_inputs(method, (64, 3)))


def test_declared_needs():
    assert {n for n, r in RULES.items() if r.extra_draft_passes} == {"spec-cont-dec"}
    assert {n for n, r in RULES.items() if not r.reads_q} == {"typical", "threshold"}
    assert {n for n, r in RULES.items() if r.greedy_closed_form} == {"strict"}
    assert {n for n, r in RULES.items() if r.inputs} == {"pad"}
    for rule in RULES.values():
        assert rule.one_hot_q and rule.at_greedy and rule.needs_text()
    assert "uses_draft_probs" not in dir(RULES["typical"])


# ---------------------------------------------------------------- one-hot q


ONE_HOT_REFUSED = {"ensemble", "spec-casc-opt", "spec-cont-dec"}


def test_check_one_hot_q_refuses_exactly_the_declared_rules():
    refused = set()
    for name, rule in RULES.items():
        for arg in (name, rule):
            try:
                check_one_hot_q(arg)
            except ValueError as e:
                assert str(e).startswith(f"rule {name!r} needs a drafter that gives its distribution q")
                assert rule.one_hot_q in str(e)
                refused.add(name)
    assert refused == ONE_HOT_REFUSED == {n for n, r in RULES.items() if not r.valid_with_one_hot_q}
    with pytest.raises(ValueError, match="unknown acceptance method"):
        check_one_hot_q("bogus")


def _one_hot_block(V=10, B=200, seed=42):
    """Verifier logits with banned tokens, drafts x and a drafter one-hot on x (log δ_x)."""
    g = torch.Generator().manual_seed(seed)
    target = 1.5 * torch.randn(B, 2, V, generator=g)
    target[:, :, :3] = -INF  # p(x) = 0 for x in {0, 1, 2}
    x = torch.randint(0, V, (B, 1), generator=g)
    draft = torch.full((B, 1, V), -INF).scatter(-1, x.unsqueeze(-1), 0.0)
    bonus_row = torch.zeros(B, 1, V)  # only spec-cont-dec reads it
    return target, torch.cat([draft, bonus_row], 1), x


@pytest.mark.parametrize("method", list(RULES))
def test_one_hot_q_refusal_follows_the_math(method):
    """With q one-hot on x, accepted rules stay controlled by the verifier (at their defaults they
    never accept a draft with p(x) = 0); ensemble and spec-casc-opt then accept such drafts."""
    target, draft, x = _one_hot_block()
    banned = x[:, 0] < 3
    tg = relaxed_targets(method, target, draft, x, temperature=1.0, **_inputs(method, (200, 1)))
    a = tg.accept_prob[:, 0]
    if method in ("ensemble", "spec-casc-opt"):
        assert (a[banned] > 0).all(), method
    else:
        assert (a[banned] == 0).all(), method
    assert banned.any() and (~banned).any()


def test_one_hot_q_formulas():
    target, draft, x = _one_hot_block()
    p_x = process_logits(target[:, 0]).gather(-1, x)[:, 0]
    acc = {m: relaxed_targets(m, target, draft, x, **kw).accept_prob[:, 0]
           for m, kw in [("strict", {}), ("mentored", dict(alpha=0.5)), ("ensemble", dict(weight=0.9))]}
    assert torch.allclose(acc["strict"], p_x)  # min(1, p(x)/1)
    assert torch.allclose(acc["mentored"], (p_x / 0.5).clamp(max=1))
    assert torch.allclose(acc["ensemble"], 0.1 + 0.9 * p_x)  # the drafted token unchecked with prob 0.1
    # spec-cont-dec: the contrast with a point mass is +inf off x, so its target is uniform on the
    # rest of p's support, whatever p is there: the verifier's preferences are gone.
    tg = relaxed_targets("spec-cont-dec", target, draft, x, beta=0.5)
    support = (process_logits(target[:, 0]) > 0) & (torch.arange(10) != x)
    assert torch.allclose(tg.residual[:, 0], support / support.sum(-1, keepdim=True))


# ---------------------------------------------------------------- temperature 0


EXACTLY_STRICT_AT_GREEDY = {"strict", "cactus", "mentored", "fuzzy", "r-fuzzy", "spec-cont-dec", "typical",
                            "threshold"}


def _greedy_block(B=3000, N=3, V=8, seed=43):
    """Near ties in the verifier (so top sets have several tokens); drafts are the drafter's argmax."""
    g = torch.Generator().manual_seed(seed)
    target = 0.5 * torch.randn(B, N + 1, V, generator=g)
    draft = target[:, :N + 1] + 0.7 * torch.randn(B, N + 1, V, generator=g)
    return target, draft, draft[:, :N].argmax(-1)


@pytest.mark.parametrize("method", list(RULES))
def test_temperature_zero_rule_and_strict_settings(method):
    """greedy="rule" (default): each rule on one-hot p and q; exactly strict for the rules that say
    so, more accepting for the others. greedy="strict": every rule is strict argmax matching."""
    target, draft, x = _greedy_block()
    inputs = _inputs(method, tuple(x.shape))
    if inputs:
        inputs["pivot_prob"] = inputs["pivot_prob"] * 0.6  # often harmless at the default threshold
    strict = verify("strict", target, draft, x, temperature=0.0)
    forced = verify(method, target, draft, x, temperature=0.0, greedy="strict", **inputs)
    assert torch.equal(forced.tokens, strict.tokens) and torch.equal(forced.accept_prob, strict.accept_prob)
    rule = verify(method, target, draft, x, temperature=0.0, generator=torch.Generator().manual_seed(0), **inputs)
    if method in EXACTLY_STRICT_AT_GREEDY:
        assert torch.equal(rule.tokens, strict.tokens), method
    else:
        assert (rule.num_accepted >= strict.num_accepted).all()
        assert (rule.num_accepted > strict.num_accepted).any(), method
    with pytest.raises(ValueError, match=r"greedy must be one of rule, strict, got 'argmax'"):
        verify(method, target, draft, x, temperature=0.0, greedy="argmax", **inputs)


# points beyond the search grids where a rule's greedy_point changes: accept-every-draft settings
GREEDY_POINTS_BEYOND_THE_GRID = {"fuzzy": [{"threshold": 1.0}], "r-fuzzy": [{"threshold": math.log(2)}],
                                 "threshold": [{"single": 0.0}], "spec-casc-opt": [{"alpha": 3.0}]}


@pytest.mark.parametrize("method", list(RULES))
def test_greedy_point_names_the_tokens_a_point_emits_at_temperature_zero(method):
    """tune searches a point at T = 0 as its rule's greedy_point (space.search_space): None must emit strict's
    tokens (AR greedy's), another point the same tokens as the point it names."""
    from relaxspec.tune.space import strength_points

    target, draft, x = _greedy_block()
    inputs = _inputs(method, tuple(x.shape))

    def tokens(params):
        return verify(method, target, draft, x, temperature=0.0, generator=torch.Generator().manual_seed(0),
                      **params, **inputs).tokens
    strict = verify("strict", target, draft, x, temperature=0.0).tokens
    rule = RULES[method]
    points = strength_points(method) + GREEDY_POINTS_BEYOND_THE_GRID.get(method, [])
    for params in points:
        point = rule.greedy_point(params)
        assert torch.equal(tokens(params), strict if point is None else tokens(point)), (params, point)
    relaxing = [p for p in points if rule.greedy_point(p) is not None]
    assert bool(relaxing) == (method not in EXACTLY_STRICT_AT_GREEDY or method in GREEDY_POINTS_BEYOND_THE_GRID)
    assert all(not torch.equal(tokens(p), strict) for p in relaxing), method


def test_greedy_closed_form_rules_ignore_the_greedy_setting():
    target, draft, x = _greedy_block()
    for name, rule in RULES.items():
        if rule.greedy_closed_form:
            a = verify(name, target, draft, x, temperature=0.0)
            b = verify(name, target, draft, x, temperature=0.0, greedy="strict")
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accepted, b.accepted)


@pytest.mark.parametrize("temperature", [1e-6, 9.9e-6, 1e-39, 1e-300, 5e-324])
def test_tiny_temperatures_are_greedy(temperature):
    target, draft, x = _greedy_block(B=500)
    for method in RULES:
        inputs = _inputs(method, tuple(x.shape))
        ref = verify(method, target, draft, x, temperature=0.0, generator=torch.Generator().manual_seed(1), **inputs)
        got = verify(method, target, draft, x, temperature=temperature, generator=torch.Generator().manual_seed(1),
                     **inputs)
        assert not got.accept_prob.isnan().any()
        assert torch.equal(got.tokens, ref.tokens), method
    assert torch.equal(process_logits(target, temperature), process_logits(target, 0.0))
    assert not torch.equal(process_logits(target, 1e-5), process_logits(target, 0.0))  # 1e-5 samples


# ---------------------------------------------------------------- float32 upcast


@pytest.mark.parametrize("method", list(RULES))
def test_bf16_logits_give_the_float32_result(method):
    target, draft = random_block(seed=44, B=256, N=3, V=64, scale=4.0, noise=2.0, bonus_draft=True)
    target16, draft16 = target.bfloat16(), draft.bfloat16()
    x = torch.randint(0, 64, (256, 3), generator=torch.Generator().manual_seed(5))
    inputs = _inputs(method, (256, 3))
    params = dict(beta=1.0) if method == "spec-cont-dec" else {}
    sampling = dict(temperature=0.6, top_k=20)
    a = relaxed_targets(method, target16, draft16, x, **sampling, **params, **inputs)
    b = relaxed_targets(method, target16.float(), draft16.float(), x, **sampling, **params, **inputs)
    for ta, tb in ((a.accept_prob, b.accept_prob), (a.residual, b.residual), (a.bonus, b.bonus)):
        assert ta.dtype == torch.float32 and torch.equal(ta, tb)
    ra = verify(method, target16, draft16, x, generator=torch.Generator().manual_seed(6), **sampling, **params, **inputs)
    rb = verify(method, target16.float(), draft16.float(), x, generator=torch.Generator().manual_seed(6),
                **sampling, **params, **inputs)
    assert torch.equal(ra.tokens, rb.tokens) and ra.accept_prob.dtype == torch.float32


# ---------------------------------------------------------------- edge cases


def test_a_draft_the_drafter_could_not_make_is_rejected():
    """q(x) = 0 (the drafter's logit is -inf) with p(x) > 0: rejected by every rule whose test
    divides by q(x), even where a gate would accept (as vLLM and the reference); FSD's gate and
    PAD's classifier branch do not read q(x), ensemble w = 0 accepts everything, typical ignores q."""
    V = 6
    p = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1, 0.0])
    target = p.log().view(1, 1, V).expand(1, 2, V)
    q = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1, 0.0]).roll(1)  # q(0) = 0
    draft = q.log().view(1, 1, V).expand(1, 2, V)
    x = torch.tensor([[0]])
    expect = {"strict": 0, "cactus": 0, "mentored": 0, "r-fuzzy": 0, "spec-casc-opt": 0, "spec-casc-tok": 0,
              "spec-cont-dec": 0, "fuzzy": 1, "typical": 1, "pad": 1}
    params = {"r-fuzzy": dict(threshold=1.0), "fuzzy": dict(threshold=1.0), "spec-casc-opt": dict(alpha=100.0),
              "spec-casc-tok": dict(alpha=1.0), "pad": dict(threshold=0.5, pivot_prob=torch.zeros(1, 1))}
    for method, want in expect.items():
        a = relaxed_targets(method, target, draft, x, **params.get(method, {})).accept_prob.item()
        assert a == want, method
    assert relaxed_targets("ensemble", target, draft, x, weight=0.5).accept_prob.item() == 0
    assert relaxed_targets("ensemble", target, draft, x, weight=0.0).accept_prob.item() == 1


def test_ensemble_weight_zero_always_accepts_and_is_in_the_default_grid():
    target, draft = random_block(seed=45, B=500, N=4, V=10, noise=3.0)
    target[:, :, 0] = -INF
    x = torch.randint(0, 10, (500, 4), generator=torch.Generator().manual_seed(7))
    res = verify("ensemble", target, draft, x, weight=0.0, temperature=0.7, top_k=3)
    assert (res.num_accepted == 4).all() and (res.accept_prob == 1).all()
    assert 0.0 in RULES["ensemble"].params["weight"].grid


def test_spec_cont_dec_overflowing_scores_are_an_error():
    target, draft = random_block(seed=46, B=4, N=2, V=8, bonus_draft=True)
    with pytest.raises(ValueError, match=r"rule 'spec-cont-dec': contrast scores overflow at beta=1e\+38"):
        verify("spec-cont-dec", target, draft, torch.zeros(4, 2, dtype=torch.long), beta=1e38)
    with pytest.raises(ValueError, match=r"contrast scores overflow"):  # finite beta, tiny temperature
        verify("spec-cont-dec", target * 1e33, draft * 1e33, torch.zeros(4, 2, dtype=torch.long), beta=100.0,
               temperature=1e-4)
    # A -inf drafter logit inside the support is a limit, not an overflow.
    draft[:, :, 5] = -INF
    verify("spec-cont-dec", target, draft, torch.zeros(4, 2, dtype=torch.long), beta=1e3)


def test_int32_draft_tokens_are_accepted():
    target, draft = random_block(seed=47, B=300, N=3, V=10, bonus_draft=True)
    x = torch.randint(0, 10, (300, 3), generator=torch.Generator().manual_seed(8))
    for method, sampling in [("strict", dict(temperature=0.0)), ("strict", SAMPLING), ("cactus", SAMPLING),
                             ("spec-cont-dec", SAMPLING)]:
        a = verify(method, target, draft, x, generator=torch.Generator().manual_seed(9), **sampling)
        b = verify(method, target, draft, x.int(), generator=torch.Generator().manual_seed(9), **sampling)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accept_prob, b.accept_prob)
        assert b.tokens.dtype == torch.long


def test_verify_result_has_no_num_emitted():
    target, draft = random_block(seed=48, B=2, N=2, V=5)
    res = verify("strict", target, draft, torch.zeros(2, 2, dtype=torch.long))
    assert not hasattr(res, "num_emitted")
    assert math.isclose(float((res.tokens >= 0).sum()), float((res.num_accepted + 1).sum()))


# ---------------------------------------------------------------- what the acceptance test trusts


def _grid_points(method):
    """Each point of the rule's paper grid over its numeric parameters (choice parameters at their defaults)."""
    import itertools
    axes = [(n, s.grid) for n, s in RULES[method].params.items() if s.grid and not isinstance(s.default, str)]
    return [dict(zip([n for n, _ in axes], combo)) for combo in itertools.product(*[g for _, g in axes])] or [{}]


@pytest.mark.parametrize("method", list(RULES))
def test_trusts_q_declaration_matches_behaviour(method):
    """A rule trusts q iff at some point of its grid it accepts, with positive probability, a draft the verifier
    gives probability 0 (here q is close to p elsewhere and more peaked, so every gate on q passes)."""
    target = torch.tensor([[2.0, 2.0, 1.0, 1.0, 0.0, -INF]] * 2)[None]  # [1, N+1 = 2, V = 6]
    draft = torch.tensor([[2.5, 2.0, 1.0, 1.0, 0.0, -3.0]] * 2)[None]
    x = torch.tensor([[5]])
    accepted = 0.0
    for point in _grid_points(method):
        kw = {"pivot_prob": torch.zeros(1, 1)} if "pivot_prob" in RULES[method].inputs else {}
        tg = relaxed_targets(method, target, draft, x, temperature=1.0, **point, **kw)
        accepted = max(accepted, float(tg.accept_prob[0, 0]))
    assert (accepted > 0) == RULES[method].trusts_q, (method, accepted)


@pytest.mark.parametrize("method", list(RULES))
def test_accepts_at_least_strict_declaration_matches_behaviour(method):
    """A rule that declares it accepts every draft at least as often as strict does so at every grid point (drafts
    sampled from q, random pivot probabilities); a rule that does not declare it falls below strict somewhere."""
    from helpers import sample_drafts
    target, draft = random_block(seed=43, B=256, N=3, V=12, scale=2.5, bonus_draft=True)
    lowest = INF
    for sampling in (dict(temperature=1.0), SAMPLING):
        x = sample_drafts(draft, 3, sampling, seed=5)
        strict = relaxed_targets("strict", target, draft[:, :3], x, **sampling).accept_prob
        for point in _grid_points(method):
            tg = relaxed_targets(method, target, draft, x, **sampling, **point, **_inputs(method, (256, 3)))
            lowest = min(lowest, float((tg.accept_prob - strict).min()))
    assert (lowest >= -1e-6) == RULES[method].accepts_at_least_strict, (method, lowest)

"""Every error path of verify / relaxed_targets / rule.validate."""

import math

import pytest
import torch

from relaxspec.acceptance import RULES, get_rule, relaxed_targets, verify

B, N, V = 3, 2, 5


def block():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, N + 1, V, generator=g), torch.randn(B, N, V, generator=g),
            torch.randint(0, V, (B, N), generator=g))


def raises(match, *args, fn=verify, **kwargs):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kwargs)


@pytest.mark.parametrize("fn", [verify, relaxed_targets])
def test_unknown_method_lists_known(fn):
    t, d, x = block()
    with pytest.raises(ValueError, match="unknown acceptance method 'bogus'.*strict, cactus.*pad"):
        fn("bogus", t, d, x)
    with pytest.raises(ValueError, match="unknown acceptance method"):
        get_rule(None)


@pytest.mark.parametrize("method,params,match", [
    ("strict", dict(alpha=0.1), r"rule 'strict' has no parameter 'alpha' \(its parameters: none\)"),
    ("cactus", dict(detla=1.0), r"rule 'cactus' has no parameter 'detla' \(its parameters: delta\)"),
    ("cactus", dict(delta=-0.1), r"rule 'cactus': parameter 'delta' must be in \[0, inf\)"),
    ("mentored", dict(alpha=1.0), r"rule 'mentored': parameter 'alpha' must be in \[0, 1\)"),
    ("mentored", dict(alpha=-0.01), r"\[0, 1\)"),
    ("ensemble", dict(weight=1.2), r"rule 'ensemble': parameter 'weight' must be in \[0, 1\]"),
    ("spec-casc-tok", dict(alpha=1.5), r"'alpha' must be in \[0, 1\]"),
    ("cactus", dict(delta=math.inf), r"'delta' must be in \[0, inf\)"),
    ("spec-cont-dec", dict(beta=math.inf), r"'beta' must be in \[0, inf\)"),
    ("spec-cont-dec", dict(beta=-1.0), r"'beta' must be in \[0, inf\)"),
    ("typical", dict(epsilon=2.0), r"'epsilon' must be in \[0, 1\]"),
    ("typical", dict(delta=-1.0), r"'delta' must be in \[0, inf\)"),
    ("fuzzy", dict(threshold=math.nan), r"'threshold' must be in \[0, inf\]"),
    ("fuzzy", dict(threshold=-0.01), r"rule 'fuzzy': parameter 'threshold' must be in \[0, inf\]"),
    ("r-fuzzy", dict(threshold=-1.0), r"rule 'r-fuzzy': parameter 'threshold' must be in \[0, inf\]"),
    ("spec-casc-opt", dict(alpha=-math.inf), r"rule 'spec-casc-opt': parameter 'alpha' must be in \(-inf, inf\)"),
    ("spec-casc-opt", dict(alpha=math.inf), r"'alpha' must be in \(-inf, inf\)"),
    ("pad", dict(floor="paper", pivot_prob=torch.zeros(B, N)),
     r"rule 'pad': parameter 'floor' must be one of classifier, authors, got 'paper'"),
    ("pad", dict(floor=1.0, pivot_prob=torch.zeros(B, N)), r"'floor' must be one of classifier, authors"),
    ("r-fuzzy", dict(threshold="0.2"), r"rule 'r-fuzzy': parameter 'threshold' must be a number"),
    ("spec-casc-opt", dict(alpha=True), r"must be a number"),
    ("pad", dict(threshold=1.5, pivot_prob=torch.zeros(B, N)), r"rule 'pad': parameter 'threshold' must be in \[0, 1\]"),
    ("pad", dict(min_prob=-1e-3, pivot_prob=torch.zeros(B, N)), r"'min_prob' must be in \[0, 1\]"),
])
def test_bad_parameters(method, params, match):
    t, d, x = block()
    raises(match, method, t, d, x, **params)
    raises(match, method, t, d, x, fn=relaxed_targets, **params)


def test_pivot_prob_checks():
    t, d, x = block()
    raises(r"rule 'pad': input 'pivot_prob' is required", "pad", t, d, x)
    raises(r"must have shape \[B, N\] = \[3, 2\], got \[3, 3\]", "pad", t, d, x, pivot_prob=torch.zeros(B, N + 1))
    raises(r"must lie in \[0, 1\]", "pad", t, d, x, pivot_prob=torch.full((B, N), 1.5))
    raises(r"must lie in \[0, 1\]", "pad", t, d, x, pivot_prob=torch.full((B, N), math.nan))
    raises(r"floating-point torch.Tensor", "pad", t, d, x, pivot_prob=[[0.1, 0.2]] * 3)
    raises(r"floating-point torch.Tensor", "pad", t, d, x, pivot_prob=torch.zeros(B, N, dtype=torch.long))
    raises(r"rule 'strict' has no parameter 'pivot_prob'.*'pivot_prob' is a parameter of: pad",
           "strict", t, d, x, pivot_prob=torch.zeros(B, N))


def test_shape_checks():
    t, d, x = block()
    raises(r"target_logits must be 3-D", "strict", t[0], d, x)
    raises(r"N >= 1", "strict", t[:, :1], d[:, :0], x[:, :0])
    raises(r"draft_logits must be 3-D", "strict", t, d[0], x)
    raises(r"draft_logits must have shape \[B, N, V\] or \[B, N\+1, V\]", "strict", t, d[:2], x)
    raises(r"draft_logits must have shape", "strict", t, d[:, :1], x)
    raises(r"draft_logits must have shape", "strict", t, torch.randn(B, N + 2, V), x)
    raises(r"vocabulary mismatch: target_logits has V=5, draft_logits has V=6", "strict", t, torch.randn(B, N, 6), x)
    raises(r"draft_tokens must have shape \[B, N\] = \[3, 2\]", "strict", t, d, x[:, :1])
    raises(r"draft_tokens must have shape", "strict", t, d, x[:2])
    raises(r"draft_tokens must be an int64 or int32 tensor \[B, N\], got torch.int16", "strict", t, d, x.short())
    raises(r"draft_tokens must be an int64 or int32 tensor", "strict", t, d, x.float())
    raises(r"draft_tokens must be an int64 or int32 tensor", "strict", t, d, x.tolist())
    raises(r"draft_tokens must lie in \[0, V\) = \[0, 5\)", "strict", t, d, torch.full((B, N), V))
    raises(r"draft_tokens must lie in \[0, V\) = \[0, 5\), or be -1", "strict", t, d, torch.full((B, N), -2))
    raises(r"draft_tokens must lie in \[0, V\) = \[0, 5\)$", "strict", t, d, torch.full((B, N), -1), fn=relaxed_targets)
    assert verify("strict", t, d, torch.full((B, N), -1)).num_accepted.tolist() == [0] * B  # (-1: no draft)
    raises(r"target_logits must be a floating-point tensor", "strict", t.long(), d, x)
    raises(r"target_logits must be a torch.Tensor", "strict", t.tolist(), d, x)
    # The extra drafter row at the bonus position is accepted by every rule.
    for method in RULES:
        kw = {"pivot_prob": torch.zeros(B, N)} if method == "pad" else {}
        verify(method, t, torch.randn(B, N + 1, V), x, **kw)


@pytest.mark.parametrize("which", ["target_logits", "draft_logits"])
def test_non_finite_logits(which):
    t, d, x = block()
    bad = (t if which == "target_logits" else d).clone()
    bad[1, 0, 2] = math.nan
    args = (bad, d) if which == "target_logits" else (t, bad)
    raises(rf"{which} contains NaN \(only -inf is allowed", "strict", *args, x)
    bad[1, 0, 2] = math.inf
    raises(rf"{which} contains \+inf \(only -inf is allowed", "strict", *args, x)
    bad[1, 0, :] = -math.inf
    raises(rf"{which} has a row where every logit is -inf", "strict", *args, x)
    bad[1, 0, :] = 0.0
    bad[1, 0, 3] = -math.inf  # masking is fine
    verify("strict", *args, x)


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-0.5), r"temperature must be a finite number >= 0"),
    (dict(temperature=math.inf), r"temperature must be a finite number >= 0"),
    (dict(temperature="hot"), r"temperature must be a number"),
    (dict(top_k=0), r"top_k must be None or an integer >= 1"),
    (dict(top_k=2.5), r"top_k must be None or an integer >= 1"),
    (dict(top_p=0.0), r"top_p must be None or a number in \(0, 1\]"),
    (dict(top_p=1.01), r"top_p must be None or a number in \(0, 1\]"),
])
def test_sampling_args(kwargs, match):
    t, d, x = block()
    raises(match, "strict", t, d, x, **kwargs)
    raises(match, "strict", t, d, x, fn=relaxed_targets, **kwargs)


def test_edge_values_are_accepted():
    t, d, x = block()
    for method, params in [("mentored", dict(alpha=0.0)), ("cactus", dict(delta=1e9)),
                           ("fuzzy", dict(threshold=math.inf)), ("spec-casc-opt", dict(alpha=-1e30)),
                           ("spec-casc-tok", dict(alpha=1.0)), ("ensemble", dict(weight=0)),
                           ("typical", dict(epsilon=0.0, delta=0.0))]:
        res = verify(method, t, d, x, top_k=1, top_p=1.0, **params)
        assert not res.accept_prob.isnan().any()


def test_draft_probs_given_are_used_as_q_and_checked():
    from relaxspec.acceptance import process_logits

    t, d, x = block()
    sampling = dict(temperature=0.7, top_p=0.9)
    q = process_logits(d, **sampling)
    plain = verify("strict", t, d, x, generator=torch.Generator().manual_seed(1), **sampling)
    given = verify("strict", t, d, x, generator=torch.Generator().manual_seed(1), draft_probs=q, **sampling)
    assert torch.equal(plain.tokens, given.tokens)
    assert torch.allclose(plain.accept_prob, given.accept_prob)
    uniform = torch.full_like(q, 1.0 / V)  # a different q must change the acceptance test
    other = verify("strict", t, d, x, generator=torch.Generator().manual_seed(1), draft_probs=uniform, **sampling)
    assert not torch.allclose(other.accept_prob, plain.accept_prob)
    raises(r"draft_probs must be a floating-point tensor \[B, N, V\] = \[3, 2, 5\], got torch.float32 \[3, 5\]",
           "strict", t, d, x, draft_probs=q[:, 0])
    raises(r"draft_probs must be a floating-point tensor", "strict", t, d, x, draft_probs=q[:, 0],
           temperature=0.0)  # greedy path too
    raises(r"draft_probs must be a floating-point tensor \[B, N, V\] = \[3, 2, 5\], got torch.int64",
           "strict", t, d, x, draft_probs=q.long())
    raises(r"draft_probs must be distributions: row \[1, 0\] sums to 0, not 1", "strict", t, d, x,
           draft_probs=q.index_fill(0, torch.tensor([1]), 0.0), temperature=0.0)
    raises(r"draft_probs must be probabilities: finite and >= 0", "strict", t, d, x, draft_probs=-q)

"""Every rule with a strict setting is exactly strict there; FSD at T = 0 is AR from p."""

import pytest
import torch

from relaxspec.acceptance import RULES, process_logits, relaxed_targets, verify
from helpers import SAMPLINGS, assert_law, random_block, run_mc

SAMPLINGS_ALL = {**SAMPLINGS, "greedy": dict(temperature=0.0, top_k=None, top_p=None)}

# The strict setting of each rule, as the brief's table gives it (RULES must agree).
STRICT_SETTINGS = {
    "cactus": dict(delta=0.0),
    "mentored": dict(alpha=0.0),
    "ensemble": dict(weight=1.0),
    "r-fuzzy": dict(threshold=0.0),
    "spec-cont-dec": dict(beta=0.0),
    "pad": dict(threshold=0.0, floor="classifier"),
    "topk-delta": dict(topk=0.0),
    "topk-ratio": dict(topk=0.0),
    "fly": dict(fly_window_size=0.0),
    "regret-budget": dict(budget=0.0, max_mismatches=0.0),
}


def _with_inputs(method, params, shape, seed=0):
    if method == "pad":
        pivot = torch.rand(shape, generator=torch.Generator().manual_seed(seed))
        pivot[..., 0] = 0.0  # P(pivot) = 0 is still not < 0
        params = {**params, "pivot_prob": pivot}
    return params


def test_rules_declare_these_strict_settings():
    declared = {name: rule.strict_params() for name, rule in RULES.items()}
    assert declared.pop("strict") == {}
    assert declared.pop("fuzzy") is None  # T = 0 is AR decoding, not strict SD
    assert declared.pop("typical") is None and declared.pop("spec-casc-tok") is None
    assert declared.pop("spec-casc-opt") is None
    assert declared.pop("threshold") is None  # lossless at single = acc = 1, but it treats q as one-hot  # alpha is finite (as the reference): strict only as a limit
    assert declared == STRICT_SETTINGS


@pytest.mark.parametrize("method,params", list(STRICT_SETTINGS.items()))
@pytest.mark.parametrize("sampling", SAMPLINGS_ALL.values(), ids=SAMPLINGS_ALL.keys())
def test_strict_setting_same_targets(method, params, sampling):
    target, draft = random_block(seed=11, B=64, N=4, V=12, bonus_draft=True)
    x = torch.randint(0, 12, (64, 4), generator=torch.Generator().manual_seed(1))
    ref = relaxed_targets("strict", target, draft, x, **sampling)
    got = relaxed_targets(method, target, draft, x, **sampling, **_with_inputs(method, params, (64, 4)))
    assert torch.allclose(got.accept_prob, ref.accept_prob, atol=1e-6)
    assert torch.allclose(got.residual, ref.residual, atol=1e-6)
    assert torch.allclose(got.bonus, ref.bonus, atol=1e-6)


@pytest.mark.parametrize("method,params", list(STRICT_SETTINGS.items()))
def test_strict_setting_same_output_law(method, params):
    sampling = SAMPLINGS["t1"]
    target, draft = random_block(seed=12, B=1, N=1, V=8, bonus_draft=True)
    params = _with_inputs(method, params, (1,))
    res = run_mc(method, target[0], draft[0], 200_000, sampling, seed=3, **params)
    p = process_logits(target[0], **sampling)
    for k in range(2):
        assert_law(res.tokens[res.num_accepted >= k, k], p[k], f"{method} at strict, position {k + 1}")
    assert not res.relaxed_only.any()


def test_fuzzy_zero_threshold_is_autoregressive_from_p():
    sampling = SAMPLINGS["t07_k5_p09"]
    target, draft = random_block(seed=13, B=1, N=2, V=8, noise=0.1)  # drafter close to p
    res = run_mc("fuzzy", target[0], draft[0], 200_000, sampling, seed=5, threshold=0.0)
    assert (res.accept_prob == 0).all() and (res.num_accepted == 0).all()
    assert (res.tokens[:, 1:] == -1).all()
    assert_law(res.tokens[:, 0], process_logits(target[0, 0], **sampling), "fuzzy T=0")


def test_pad_threshold_zero_matches_strict_uniform_for_uniform():
    # Same generator -> same uniforms -> the very same tokens as strict.
    target, draft = random_block(seed=14, B=4096, N=5, V=20)
    x = torch.randint(0, 20, (4096, 5), generator=torch.Generator().manual_seed(2))
    pivot = torch.rand(4096, 5, generator=torch.Generator().manual_seed(3))
    a = verify("strict", target, draft, x, generator=torch.Generator().manual_seed(9))
    b = verify("pad", target, draft, x, generator=torch.Generator().manual_seed(9),
               threshold=0.0, pivot_prob=pivot, min_prob=0.0)
    assert torch.equal(a.tokens, b.tokens)

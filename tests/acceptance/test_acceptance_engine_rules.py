"""The relaxations serving engines ship (threshold: SGLang; topk-delta: TensorRT-LLM; topk-ratio: vLLM PR #43184),
each checked against an independent plain-Python transcription of its source's logic on hand-made tensors, for
monotone acceptance as it relaxes, and (threshold at 1, 1) for losslessness."""

import math

import numpy as np
import pytest
import torch

from relaxspec.acceptance import RULES, process_logits, relaxed_targets, verify
from relaxspec.acceptance.random import Draws
from helpers import SAMPLINGS, assert_law, exact_first_law, random_block, run_mc, sample_drafts


# ---------------------------------------------------------------- transcriptions of the engines' code


def sglang_chain(target_probs, candidates, coins, final_coin, threshold_single, threshold_acc):
    """sgl-kernel TreeSpeculativeSamplingTargetOnly on a chain (topk 1), one sequence, in plain Python: target_probs
    [N+1][V] (row i scores the token after candidates[:i]), candidates [N] drafts, coins [N] (one uniform per
    position), final_coin in [0, 1). Returns (accepted drafts, the sampled token)."""
    threshold_acc = max(threshold_acc, 1e-9)
    V = len(target_probs[0])
    draft_probs = [[0.0] * V for _ in target_probs]
    row, accepted = 0, []
    for j, token in enumerate(candidates):
        prob_acc = 0.0
        target_prob_single = target_probs[row][token]
        prob_acc += target_prob_single
        if coins[j] <= prob_acc / threshold_acc or target_prob_single >= threshold_single:
            accepted.append(token)
            row += 1
        else:
            draft_probs[row][token] = target_probs[row][token]  # "FIXME: leverage draft probs"
            break
    relu = [max(target_probs[row][v] - (draft_probs[row][v] if len(accepted) < len(candidates) else 0.0), 0.0)
            for v in range(V)]
    u, acc = final_coin * sum(relu), 0.0
    for v in range(V):
        acc += relu[v]
        if relu[v] > 0 and acc > u:
            return accepted, v
    return accepted, max(v for v in range(V) if relu[v] > 0)


def softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def trtllm_relaxed(logits, draft_tokens, relaxed_topk, relaxed_delta):
    """TensorRT-LLM MTP relaxed acceptance for one generation request (mtp.py sample_and_accept_draft_tokens +
    mtpRelaxedAcceptanceKernel): softmax of the logits [N+1][V], top-k by probability, accept while the draft is
    one of the top-k within delta of the top-1 (the top-1 always). Returns the accepted tokens (drafts + golden)."""
    probs = softmax(logits)
    order = np.argsort(-probs, axis=-1, kind="stable")[:, :relaxed_topk]
    values = np.take_along_axis(probs, order, -1)
    accepted = 0
    while accepted < len(draft_tokens):
        ok = False
        threshold = values[accepted, 0] - relaxed_delta
        for jj in range(relaxed_topk):
            if jj > 0 and threshold > values[accepted, jj]:
                break
            if draft_tokens[accepted] == order[accepted, jj]:
                accepted += 1
                ok = True
                break
        if not ok:
            break
    return list(draft_tokens[:accepted]) + [int(order[accepted, 0])]


def vllm_relaxed(logits, draft_tokens, topk, ratio):
    """vLLM PR #43184's relaxed greedy rule, one request: accept while draft in topK(target_probs) and
    P(draft) >= P(top1) * ratio; then the target's argmax."""
    probs = softmax(logits)
    out = []
    for i, d in enumerate(draft_tokens):
        top = np.argsort(-probs[i], kind="stable")[:topk]
        if d in top and probs[i, d] >= probs[i].max() * ratio:
            out.append(int(d))
        else:
            break
    out.append(int(np.argmax(probs[len(out)])))
    return out


class FixedDraws(Draws):
    """Given acceptance uniforms [B, N] and final-sample uniforms [B] (inverse CDF, as the kernel's final coin)."""

    def __init__(self, coins, final):
        self.coins, self.final = coins, final

    def uniform(self, purpose, width, dtype=torch.float32):
        return self.coins[:, :width].to(dtype)

    def sample(self, weights, purpose, offset=0):
        from relaxspec.acceptance.processing import sample_with_uniform
        return sample_with_uniform(weights, self.final)


# ---------------------------------------------------------------- threshold (SGLang)


@pytest.mark.parametrize("single,acc", [(1.0, 1.0), (0.3, 1.0), (1.0, 0.4), (0.05, 0.2), (1e-9, 1e-9), (0.0, 0.0),
                                        (1.0, 0.0), (0.0, 1.0)])
def test_threshold_matches_the_sglang_chain_kernel(single, acc):
    """Hand-made p (temperature 1, no top-k: the logits are log p; the kernel is given the processed p) and drafts;
    a third of the uniforms exactly at the decision boundary p(x)/acc, where SGLang accepts (coin <= ratio), and so
    does the rule (the shared loop's u < accept_prob, with accept_prob the next float above the ratio)."""
    p = torch.tensor([[0.50, 0.25, 0.15, 0.07, 0.03],
                      [0.05, 0.60, 0.20, 0.10, 0.05],
                      [0.40, 0.30, 0.20, 0.06, 0.04],
                      [0.10, 0.10, 0.10, 0.20, 0.50]], dtype=torch.float64)
    B, N = 96, 3
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (B, N), generator=g)
    coins = torch.rand(B, N, generator=g, dtype=torch.float64) * 0.98 + 0.01
    target = p.log().expand(B, N + 1, 5).clone()
    processed = process_logits(target[0])  # [N+1, V], float64
    ratio = processed[:N].gather(-1, x.T).T / max(acc, 1e-9)  # [B, N]: position j reads row j on a chain
    at_tie = (torch.arange(B) % 3 == 0).unsqueeze(1) & (ratio < 1)
    coins = torch.where(at_tie, ratio, coins)
    final = torch.rand(B, generator=g, dtype=torch.float64)
    draft = torch.randn(B, N, 5, generator=g, dtype=torch.float64)  # never read
    res = verify("threshold", target, draft, x, random=FixedDraws(coins, final), single=single, acc=acc)
    ties_decided = 0
    for b in range(B):
        want_acc, want_token = sglang_chain(processed.tolist(), x[b].tolist(), coins[b].tolist(), float(final[b]),
                                            single, acc)
        n = int(res.num_accepted[b])
        assert res.tokens[b, :n].tolist() == want_acc, b
        assert int(res.tokens[b, n]) == want_token, b
        ties_decided += bool(at_tie[b, :min(n + 1, N)].any())
    assert ties_decided > 10 or not at_tie.any()  # (acc <= 1e-9: every ratio >= 1, no tie to meet)


def test_threshold_at_one_one_is_lossless_though_not_strict():
    """Output law exactly p (exact, from the targets, and Monte Carlo through the loop); strict accepts more."""
    sampling = SAMPLINGS["t07_k5_p09"]
    target, draft = random_block(seed=60, B=1, N=2, V=8, noise=1.0)
    p = process_logits(target[0], **sampling)
    law = exact_first_law("threshold", target[0], draft[0], sampling, single=1.0, acc=1.0)
    assert torch.allclose(law.float(), p[0], atol=1e-6)
    res = run_mc("threshold", target[0], draft[0], 200_000, sampling, seed=4)
    for k in range(2):
        assert_law(res.tokens[res.num_accepted >= k, k], p[k], f"threshold(1, 1) position {k + 1}")
    strict = run_mc("strict", target[0], draft[0], 200_000, sampling, seed=4)
    assert strict.num_accepted.double().mean() > res.num_accepted.double().mean() + 0.05


def test_threshold_ignores_the_drafter_and_equals_strict_for_a_one_hot_q():
    """With q one-hot on the draft strict accepts u < p(x), threshold (1, 1) u <= p(x): the same tokens but where a
    uniform equals p(x) (none here), and accept_prob the next float above strict's (0 and 1 kept)."""
    target, _ = random_block(seed=61, B=2000, N=3, V=10)
    x = torch.randint(0, 10, (2000, 3), generator=torch.Generator().manual_seed(1))
    one_hot = torch.full((2000, 3, 10), -math.inf).scatter(-1, x.unsqueeze(-1), 0.0)
    a = verify("threshold", target, one_hot, x, generator=torch.Generator().manual_seed(2))
    b = verify("strict", target, one_hot, x, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a.tokens, b.tokens)
    inside = (b.accept_prob > 0) & (b.accept_prob < 1)
    assert torch.equal(a.accept_prob, torch.where(inside, b.accept_prob.nextafter(torch.tensor(2.0)), b.accept_prob))
    other = verify("threshold", target, torch.randn(2000, 3, 10), x, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a.tokens, other.tokens)  # (q never read)


# ---------------------------------------------------------------- topk-delta (TensorRT-LLM), topk-ratio (vLLM PR)


def _greedy_case(seed, B=300, N=4, V=12):
    """Logits with near ties (several plausible tokens), drafts = a noisy drafter's argmax (so q is one-hot)."""
    g = torch.Generator().manual_seed(seed)
    target = 0.8 * torch.randn(B, N + 1, V, generator=g, dtype=torch.float64)
    draft = target[:, :N] + 0.9 * torch.randn(B, N, V, generator=g, dtype=torch.float64)
    return target, draft, draft.argmax(-1)


@pytest.mark.parametrize("topk,delta", [(1, 0.0), (1, 0.9), (3, 0.05), (3, 0.2), (10, 0.6), (12, 1.0)])
def test_topk_delta_matches_trtllm_at_temperature_zero(topk, delta):
    target, draft, x = _greedy_case(70)
    res = verify("topk-delta", target, draft, x, temperature=0.0, topk=topk, delta=delta)
    got = [res.tokens[b, :int(res.num_accepted[b]) + 1].tolist() for b in range(len(x))]
    want = [trtllm_relaxed(target[b].numpy(), x[b].numpy(), topk, delta) for b in range(len(x))]
    assert got == want
    strict = verify("strict", target, draft, x, temperature=0.0)
    assert (res.num_accepted >= strict.num_accepted).all()


@pytest.mark.parametrize("topk,ratio", [(1, 0.0), (2, 0.5), (3, 0.2), (10, 0.3), (12, 0.0), (5, 1.0)])
def test_topk_ratio_matches_the_vllm_pull_request_at_temperature_zero(topk, ratio):
    target, draft, x = _greedy_case(71)
    res = verify("topk-ratio", target, draft, x, temperature=0.0, topk=topk, ratio=ratio)
    got = [res.tokens[b, :int(res.num_accepted[b]) + 1].tolist() for b in range(len(x))]
    want = [vllm_relaxed(target[b].numpy(), x[b].numpy(), topk, ratio) for b in range(len(x))]
    assert got == want


@pytest.mark.parametrize("method,strength", [("topk-delta", "delta"), ("topk-ratio", "ratio")])
def test_topk_rules_when_sampling_candidate_set_or_strict(method, strength):
    """T > 0 (our extension): candidates of the processed p accepted outright, the rest by the strict test."""
    target, draft = random_block(seed=72, B=512, N=3, V=12, scale=2.0)
    sampling = dict(temperature=0.7, top_k=6)
    x = sample_drafts(draft, 3, sampling, seed=3)
    value = 0.3
    tg = relaxed_targets(method, target, draft, x, **sampling, topk=4, **{strength: value}).accept_prob
    strict = relaxed_targets("strict", target, draft, x, **sampling).accept_prob
    p = process_logits(target[:, :3], **sampling).numpy()
    for b in range(512):
        for i in range(3):
            row, tok = p[b, i], int(x[b, i])
            rank = int((row > row[tok]).sum())
            floor = row.max() - value if method == "topk-delta" else value * row.max()
            candidate = rank < 4 and row[tok] >= floor and row[tok] > 0
            assert float(tg[b, i]) == pytest.approx(1.0 if candidate else float(strict[b, i])), (b, i)


@pytest.mark.parametrize("method", ["topk-delta", "topk-ratio"])
def test_topk_is_an_integer(method):
    target, draft = random_block(seed=73, B=2, N=1, V=5)
    with pytest.raises(ValueError, match=rf"rule '{method}': parameter 'topk' must be an integer in \[0, inf\), got 2.5"):
        verify(method, target, draft, torch.zeros(2, 1, dtype=torch.long), topk=2.5)


# ---------------------------------------------------------------- monotone in strength


# Each rule from strict (or its lossless setting) to fully relaxed, one knob at a time.
LADDERS = {
    "threshold": [dict(single=s, acc=1.0) for s in (1.0, 0.6, 0.3, 0.1, 0.01)]
    + [dict(single=0.01, acc=a) for a in (0.5, 0.1, 0.01)],
    "topk-delta": [dict(topk=0, delta=0.6)] + [dict(topk=k, delta=0.0) for k in (1, 2, 5)]
    + [dict(topk=5, delta=d) for d in (0.1, 0.3, 0.6, 1.0)],
    "topk-ratio": [dict(topk=0, ratio=0.3)] + [dict(topk=k, ratio=1.0) for k in (1, 2, 5)]
    + [dict(topk=5, ratio=r) for r in (0.6, 0.3, 0.1, 0.0)],
}


@pytest.mark.parametrize("method", list(LADDERS))
@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_acceptance_grows_as_the_rule_relaxes(method, temperature):
    """Exact acceptance probabilities, position by position, never fall as the setting relaxes, and end above the
    start; the Monte Carlo mean accepted length of the shared loop grows with them."""
    target, draft = random_block(seed=74, B=512, N=4, V=16)
    sampling = dict(temperature=temperature)
    x = draft.argmax(-1) if temperature == 0 else sample_drafts(draft, 4, sampling, seed=0)
    probs, lengths = [], []
    for point in LADDERS[method]:
        probs.append(relaxed_targets(method, target, draft, x, **sampling, **point).accept_prob)
        assert len(probs) == 1 or (probs[-1] >= probs[-2] - 1e-7).all(), (method, point)
        res = verify(method, target, draft, x, **sampling, generator=torch.Generator().manual_seed(5), **point)
        lengths.append(float(res.num_accepted.double().mean()))
    if method == "threshold" and temperature == 0:  # one-hot p: exactly strict at every setting
        assert all(torch.equal(a, probs[0]) for a in probs)
    else:
        assert (probs[-1] > probs[0]).any() and lengths[-1] > lengths[0]
    assert all(b >= a for a, b in zip(lengths, lengths[1:])), lengths  # same uniforms: coupled, so monotone


def test_the_new_rules_are_registered_with_their_grids():
    from relaxspec.bench.methods import default_methods
    from relaxspec.tune.space import search_space
    grid = [(m, p) for m, p in default_methods() if m in ("threshold", "topk-delta", "topk-ratio")]
    assert grid == [("threshold", {"single": s}) for s in (0.01, 1.0)] + \
        [("topk-delta", {"delta": 0.3}), ("topk-delta", {"delta": 0.6}),
         ("topk-ratio", {"ratio": 0.1}), ("topk-ratio", {"ratio": 0.3})]
    space = {c.method for c in search_space(None, [3])}
    assert {"threshold", "topk-delta", "topk-ratio"} <= space
    assert RULES["topk-delta"].strict_params() == {"topk": 0.0} == RULES["topk-ratio"].strict_params()
    assert RULES["threshold"].strict_params() is None

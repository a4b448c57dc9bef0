"""FLy (acceptance/fly.py): each branch on hand-built logits at T = 0, the sampled path against a plain restatement of
vLLM's random FLy pass, a Monte Carlo check of the deferral's probability, W = 0 equal to strict through the engine,
batch invariance at the length limit, and the parameters' one-line errors."""

import contextlib
import math

import pytest
import torch

from relaxspec.acceptance import RULES, derive_seed, fused, process_logits, verify
from relaxspec.acceptance.verify import VerifyStep
from relaxspec.engine import generate
from helpers import MIXED_PROMPTS, ragged_block, strict_then_relaxed

V = 6
FLAT = [2.0, 2.0, 2.0, -5.0, -5.0, -5.0]  # top-3 entropy ~ ln 3: the verifier is unsure; argmax 0
PEAKED_3 = [-5.0, -5.0, -5.0, 9.0, -5.0, -5.0]  # argmax 3, entropy ~ 0
PEAKED_0_2 = [9.0, 2.0, -5.0, -5.0, -5.0, -5.0]  # argmax 0, the draft 1 far behind: entropy ~ 0


def _block(rows):
    """rows: per sequence, N (verifier logits, draft) pairs; the verifier's bonus row is flat, the drafter's logits
    peak at its draft (so q one-hot on it at T = 0)."""
    target = torch.tensor([[z for z, _ in row] + [FLAT] for row in rows])
    drafts = torch.tensor([[x for _, x in row] for row in rows])
    draft = torch.full((*drafts.shape, V), -4.0).scatter_(-1, drafts.unsqueeze(-1), 4.0)
    return target, draft, drafts


def _greedy(rows, num_drafts=None, **params):
    target, draft, drafts = _block(rows)
    return verify("fly", target, draft, drafts, temperature=0.0, num_drafts=num_drafts, **params)


# row 0: a mismatch where the verifier is unsure, the next two drafts its argmax (deferred)
UNSURE_THEN_AGREE = [(FLAT, 1), (PEAKED_3, 3), (PEAKED_3, 3), (PEAKED_3, 3)]
# row 1: a mismatch where the verifier is sure (the rejection stands)
SURE = [(PEAKED_0_2, 1), (PEAKED_3, 3), (PEAKED_3, 3), (PEAKED_3, 3)]
# row 2: unsure, but the window disagrees (the draft at position 2 is not the argmax)
WINDOW_DISAGREES = [(FLAT, 1), (PEAKED_3, 3), (PEAKED_3, 4), (PEAKED_3, 3)]
# row 3: two matches, then an unsure mismatch at position 2 with one draft after it
AT_BLOCK_END = [(PEAKED_3, 3), (PEAKED_3, 3), (FLAT, 2), (PEAKED_3, 3)]


def test_greedy_branches_on_hand_built_logits():
    res = _greedy([UNSURE_THEN_AGREE, SURE, WINDOW_DISAGREES, AT_BLOCK_END], fly_window_size=2,
                  fly_entropy_threshold=0.3)
    # deferred and kept with its window (+ the bonus); sure: rejected; window disagrees: rejected; block end: the
    # window (2 drafts) does not fit after position 2 of 4, the rejection stands
    assert res.num_accepted.tolist() == [4, 0, 0, 2]
    assert res.relaxed_only.tolist() == [[True, False, False, False]] + [[False] * 4] * 3
    assert res.tokens[1, 0] == 0 and res.tokens[3, 2] == 0  # the verifier's argmax at the rejection
    # a window of one fits at position 2 of 4, and the draft after it agrees
    res = _greedy([AT_BLOCK_END, WINDOW_DISAGREES], fly_window_size=1, fly_entropy_threshold=0.3)
    assert res.num_accepted.tolist() == [4, 2]  # row 2: position 0 deferred (position 1 agrees), position 2 rejected
    assert res.relaxed_only[:, :3].tolist() == [[False, False, True], [True, False, False]]


def test_the_entropy_gate_reads_the_top_k_of_the_untempered_verifier():
    h3 = -sum(p * math.log(p) for p in torch.tensor(FLAT).softmax(-1)[:3].tolist())  # ~ ln 3
    h1 = -(p1 := float(torch.tensor(FLAT).softmax(-1)[0])) * math.log(p1)  # ~ 0.366
    for top_k, threshold, kept in ((3, h3 - 1e-3, 4), (3, h3 + 1e-3, 0), (1, h1 - 1e-3, 4), (1, h1 + 1e-3, 0)):
        res = _greedy([UNSURE_THEN_AGREE], fly_window_size=2, fly_entropy_threshold=threshold,
                      fly_entropy_top_k=top_k)
        assert res.num_accepted.tolist() == [kept], (top_k, threshold)


def test_the_window_must_fit_in_the_rows_own_drafts():
    """A row proposing fewer drafts (the engine's ragged rows near the length limit) defers only where its own
    drafts hold the whole window: the padding columns are never read."""
    rows = [UNSURE_THEN_AGREE, UNSURE_THEN_AGREE]
    res = _greedy(rows, num_drafts=torch.tensor([4, 2]), fly_window_size=2, fly_entropy_threshold=0.3)
    assert res.num_accepted.tolist() == [4, 0]  # row 1: 0 + 2 < 2 fails
    res = _greedy(rows, num_drafts=torch.tensor([4, 2]), fly_window_size=1, fly_entropy_threshold=0.3)
    assert res.num_accepted.tolist() == [4, 2]
    assert _greedy(rows, fly_window_size=4, fly_entropy_threshold=0.3).num_accepted.tolist() == [0, 0]  # W >= N


def test_window_zero_is_strict_on_hand_built_logits():
    rows = [UNSURE_THEN_AGREE, SURE, WINDOW_DISAGREES, AT_BLOCK_END]
    target, draft, drafts = _block(rows)
    strict = verify("strict", target, draft, drafts, temperature=0.0)
    fly = _greedy(rows, fly_window_size=0, fly_entropy_threshold=0.0)
    assert torch.equal(fly.tokens, strict.tokens) and not fly.relaxed_only.any()


# ---------------------------------------------------------------- sampling


def _entropy_top_k(p: torch.Tensor, k: int) -> float:
    top = sorted(p.tolist(), reverse=True)[:k]
    return -sum(v * math.log(v) for v in top if v > 0)


def _reference_kept(p, q, x, u, end, window, threshold, top_k) -> int:
    """vLLM's random FLy pass restated on one row (p [N+1, V], q [N, V] processed): the strict outcome of every
    proposed draft, then each rejected one deferred when it is possible for both models, the window fits, the
    top-k entropy is >= threshold and the next `window` drafts pass the strict test; the kept prefix."""
    def native(i):
        return bool(q[i, x[i]] > 0) and bool(u[i] < min(1.0, float(p[i, x[i]] / q[i, x[i]])))
    kept = 0
    for i in range(end):
        deferred = (window > 0 and p[i, x[i]] > 0 and q[i, x[i]] > 0 and i + window < end
                    and _entropy_top_k(p[i], top_k) >= threshold and all(native(i + k) for k in range(1, window + 1)))
        if not (native(i) or deferred):
            break
        kept += 1
    return kept


@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_k=4),
                                      dict(temperature=0.9, top_p=0.8)])
@pytest.mark.parametrize("window,threshold,top_k", [(1, 0.1, 3), (2, 0.3, 3), (3, 0.0, 2), (2, 0.5, 10)])
def test_sampled_path_equals_the_reference_pass(sampling, window, threshold, top_k):
    """On random blocks (ragged rows included), verify keeps exactly the prefix the restated vLLM pass keeps with the
    same acceptance uniforms (the first draw of a call from its generator), by the C loop and by torch's."""
    g = torch.Generator().manual_seed(window * 100 + top_k)
    B, N = 64, 5
    target, draft, q, drafts, num_drafts = ragged_block(g, sampling, B, N)
    p = process_logits(target, **sampling)
    u = torch.rand((B, N), generator=torch.Generator().manual_seed(7))
    want = [_reference_kept(p[b], q[b], drafts[b], u[b], int(num_drafts[b]), window, threshold, top_k)
            for b in range(B)]
    params = dict(fly_window_size=window, fly_entropy_threshold=threshold, fly_entropy_top_k=top_k)
    for off in (False, True):
        with fused.loop_disabled() if off else contextlib.nullcontext():
            res = verify("fly", target, draft, drafts, generator=torch.Generator().manual_seed(7),
                         num_drafts=num_drafts, **sampling, **params)
        assert res.num_accepted.tolist() == want
    strict = verify("strict", target, draft, drafts, generator=torch.Generator().manual_seed(7),
                    num_drafts=num_drafts, **sampling)
    assert bool((res.num_accepted >= strict.num_accepted).all())
    assert res.relaxed_only.any() or window > 1  # (a wide window is rarely all kept on these blocks)


def test_deferral_probability_by_monte_carlo():
    """One block, N = 2, W = 1, the verifier unsure at position 0: the first draft is kept with probability
    s0 + (1 - s0) s1 (strict's test, else the deferral when the second draft passes its own), s_i = min(1, p/q) of
    the fixed drafts; M draws, tolerance 5 standard errors."""
    target = torch.tensor([[1.0, 1.0, 0.8, -3.0], [0.2, 1.5, -1.0, -2.0], [0.0, 0.0, 0.0, 0.0]])
    draft = torch.tensor([[-1.0, 2.0, 0.5, -3.0], [0.0, 2.5, -1.0, -2.0]])
    x = torch.tensor([1, 1])
    p, q = target.softmax(-1), draft.softmax(-1)
    s0, s1 = (min(1.0, float(p[i, 1] / q[i, 1])) for i in (0, 1))
    assert s0 < 0.9 and s1 < 0.9 and _entropy_top_k(p[0], 3) > 0.3
    M = 40_000
    res = verify("fly", target.expand(M, 3, 4), draft.expand(M, 2, 4), x.expand(M, 2),
                 generator=torch.Generator().manual_seed(11), fly_window_size=1, fly_entropy_threshold=0.3)
    kept = float((res.num_accepted >= 1).double().mean())
    want = s0 + (1 - s0) * s1
    assert abs(kept - want) < 5 * math.sqrt(want * (1 - want) / M), (kept, want)
    strict_rate = float((verify("strict", target.expand(M, 3, 4), draft.expand(M, 2, 4), x.expand(M, 2),
                                generator=torch.Generator().manual_seed(11)).num_accepted >= 1).double().mean())
    assert abs(strict_rate - s0) < 5 * math.sqrt(s0 * (1 - s0) / M) and kept > strict_rate + 0.05


# ---------------------------------------------------------------- parameters


@pytest.mark.parametrize("params,message", [
    (dict(fly_window_size=1.5), "rule 'fly': parameter 'fly_window_size' must be an integer in [0, inf), got 1.5"),
    (dict(fly_window_size=-1), "rule 'fly': parameter 'fly_window_size' must be an integer in [0, inf), got -1"),
    (dict(fly_entropy_threshold=-0.1), "rule 'fly': parameter 'fly_entropy_threshold' must be in [0, inf]"),
    (dict(fly_entropy_threshold="high"), "rule 'fly': parameter 'fly_entropy_threshold' must be a number in"),
    (dict(fly_entropy_top_k=0), "rule 'fly': parameter 'fly_entropy_top_k' must be an integer in [1, inf), got 0"),
    (dict(fly_window=2), "rule 'fly' has no parameter 'fly_window' (its parameters: fly_window_size, "),
])
def test_parameter_errors_are_one_line(params, message):
    with pytest.raises(ValueError) as error:
        VerifyStep("fly", temperature=0.7, **params)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_declarations():
    rule = RULES["fly"]
    assert rule.strict_params() == {"fly_window_size": 0.0}
    assert rule.params["fly_entropy_threshold"].grid == (0.1, 0.3, 0.6)
    assert rule.reads_uniforms and rule.accepts_at_least_strict and not rule.trusts_q and not rule.state
    assert "reads the block's acceptance uniforms" in rule.needs_text()


# ---------------------------------------------------------------- through the engine


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_window_zero_is_strict_token_for_token_and_a_window_relaxes(builtin_pair, temperature):
    _, on = strict_then_relaxed(builtin_pair, temperature, "fly", dict(fly_window_size=0),
                                dict(fly_window_size=1, fly_entropy_threshold=0.1))
    assert on.stats.rule_state == {}


def test_batch_invariant_at_the_length_limit(builtin_pair):
    """Ragged rows near max_new_tokens: a prompt's output is the same alone and in the batch (the window reads only
    the row's own drafts)."""
    verifier, weak = builtin_pair
    seeds = [derive_seed(2, i) for i in range(len(MIXED_PROMPTS))]
    kw = dict(method="fly", draft_length=5, temperature=0.7, max_new_tokens=11, fly_window_size=1,
              fly_entropy_threshold=0.1)
    batch = generate(verifier, weak, MIXED_PROMPTS, seed=seeds, **kw)
    assert any(len(rd.drafts) < 5 for r in batch.results for rd in r.trace)
    for i, prompt in enumerate(MIXED_PROMPTS):
        alone = generate(verifier, weak, [prompt], seed=[seeds[i]], **kw)
        assert alone.results[0].token_ids == batch.results[i].token_ids, i


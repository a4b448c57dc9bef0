"""regret-budget (acceptance/regret_budget.py): each branch on hand-built logits at T = 0 (within budget, gate
exceeded, cap reached, budget exhausted across blocks), the sampled path against a plain restatement and by Monte
Carlo, B = 0 equal to strict through the engine, the state carried across rounds and independent of the batch,
GenerationStats.rule_state, and the one-line errors."""

import contextlib
import math

import pytest
import torch

from relaxspec.acceptance import RULES, derive_seed, fused, process_logits, verify
from relaxspec.acceptance.verify import VerifyStep
from relaxspec.engine import GenerationStats, generate
from helpers import MIXED_PROMPTS, ragged_block, strict_then_relaxed

V = 6


def _row(regret: float, argmax: int = 0, draft: int = 1):
    """Verifier logits whose top-1 is `argmax` (logit 3) and whose draft token is `regret` below it."""
    z = [-4.0] * V
    z[argmax], z[draft] = 3.0, 3.0 - regret
    return z, draft


MATCH = _row(0.0, argmax=2, draft=2)  # the draft is the argmax: regret 0, strict keeps it
# one row: a mismatch of regret 1.0, a match, a mismatch of regret 0.7, a match
ROW = [_row(1.0), MATCH, _row(0.7), MATCH]


def _block(rows):
    target = torch.tensor([[z for z, _ in row] + [[0.0] * V] for row in rows])
    drafts = torch.tensor([[x for _, x in row] for row in rows])
    draft = torch.full((*drafts.shape, V), -4.0).scatter_(-1, drafts.unsqueeze(-1), 4.0)  # q one-hot on the draft
    return target, draft, drafts


def _greedy(rows=(ROW,), **params):
    return verify("regret-budget", *_block(rows), temperature=0.0, **params)


def _state(res):
    return [round(v, 5) for v in res.state["regret_spent"].tolist()], res.state["mismatches_taken"].tolist()


@pytest.mark.parametrize("params,kept,spent,taken", [
    (dict(budget=2.0, local_ratio=10.0), 4, 1.7, 2),  # within budget: both mismatches kept
    (dict(budget=1.2, local_ratio=10.0), 2, 1.0, 1),  # the budget runs out at the second mismatch
    (dict(budget=1.0, local_ratio=10.0), 2, 1.0, 1),  # (<= B: the first spends it all)
    (dict(budget=0.9, local_ratio=10.0), 0, 0.0, 0),
    (dict(budget=9.0, local_ratio=0.3), 2, 1.0, 1),  # gate: 1.0 <= 0.3 * 4, but 0.7 > 0.3 * (4 - 2)
    (dict(budget=9.0, local_ratio=0.24), 0, 0.0, 0),  # gate: 1.0 > 0.24 * 4
    (dict(budget=9.0, local_ratio=10.0, max_mismatches=1), 2, 1.0, 1),  # cap reached
    (dict(budget=0.0, local_ratio=10.0), 0, 0.0, 0),  # B = 0: strict
    (dict(budget=9.0, max_mismatches=0), 0, 0.0, 0),  # a cap of 0: strict
])
def test_greedy_branches_on_hand_built_logits(params, kept, spent, taken):
    res = _greedy(**params)
    assert res.num_accepted.tolist() == [kept]
    assert res.relaxed_only[0].tolist() == [i < kept and i in (0, 2) for i in range(4)]
    assert _state(res) == ([spent], [taken])
    if kept < 4:
        assert res.tokens[0, kept] == 0  # the verifier's argmax at the rejection


def test_the_budget_is_carried_from_block_to_block():
    """A request that spent 1.5 of 2 keeps no mismatch of regret 1.0; one that kept its cap of mismatches keeps none;
    the returned state, passed to the next block, goes on spending."""
    first = _greedy(budget=2.0, local_ratio=10.0)
    assert _state(first) == ([1.7], [2.0])
    second = _greedy(budget=2.0, local_ratio=10.0, **first.state)
    assert second.num_accepted.tolist() == [0] and _state(second) == ([1.7], [2.0])  # exhausted: strict now
    fresh = _greedy(budget=2.0, local_ratio=10.0, regret_spent=torch.tensor([0.5]))
    assert fresh.num_accepted.tolist() == [2] and _state(fresh) == ([1.5], [1.0])  # 0.5 + 1.0, then 1.5 + 0.7 > 2
    capped = _greedy(budget=9.0, local_ratio=10.0, max_mismatches=3, mismatches_taken=torch.tensor([2.0]))
    assert capped.num_accepted.tolist() == [2] and _state(capped) == ([1.0], [3.0])


def test_rows_spend_their_own_budgets():
    rows = [ROW, ROW, [MATCH] * 4]
    res = _greedy(rows, budget=2.0, local_ratio=10.0, regret_spent=torch.tensor([0.0, 1.5, 0.0]))
    assert res.num_accepted.tolist() == [4, 0, 4] and _state(res) == ([1.7, 1.5, 0.0], [2.0, 0.0, 0.0])
    alone = _greedy([ROW], budget=2.0, local_ratio=10.0, regret_spent=torch.tensor([1.5]))
    assert alone.num_accepted.tolist() == [0]


def test_the_gate_reads_the_rows_own_drafts():
    """K in the gate r <= g (K - i) is the drafts the row proposes (the engine's ragged rows): one row proposing 2
    drafts, the mismatch at position 0 allowed 0.3 * 2 < 1.0; the same row proposing 4: 0.3 * 4 >= 1.0."""
    res = _greedy([ROW, ROW], budget=9.0, local_ratio=0.3, num_drafts=torch.tensor([4, 2]))
    assert res.num_accepted.tolist() == [2, 0]


def test_a_draft_tied_with_the_top_1_is_a_mismatch_of_regret_zero():
    tie = [_row(0.0, argmax=0, draft=1)] + [MATCH] * 3  # draft 1 ties the argmax 0 (the first index wins)
    assert _greedy([tie], budget=0.0).num_accepted.tolist() == [0]  # B = 0: strict, even here
    res = _greedy([tie], budget=0.5)
    assert res.num_accepted.tolist() == [4] and _state(res) == ([0.0], [1.0])


# ---------------------------------------------------------------- sampling


def _reference_kept(p, q, x, u, z, end, budget, ratio, cap, spent, taken):
    """The rule restated on one row when sampling: the strict test with u; a rejected draft kept while p(x) > 0, its
    regret max z - z(x) fits the gate ratio * (end - i), the budget and the cap; (kept, spent, taken)."""
    kept = 0
    for i in range(end):
        strict = float(q[i, x[i]]) > 0 and float(u[i]) < min(1.0, float(p[i, x[i]] / q[i, x[i]]))
        if not strict:
            regret = float(z[i].max() - z[i, x[i]])
            if not (budget > 0 and p[i, x[i]] > 0 and regret <= ratio * (end - i) and spent + regret <= budget
                    and taken + 1 <= cap):
                break
            spent, taken = spent + regret, taken + 1
        kept += 1
    return kept, spent, taken


@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_k=4)])
@pytest.mark.parametrize("budget,ratio,cap", [(1.0, 1.0, math.inf), (3.0, 0.5, 2), (0.5, 10.0, 1)])
def test_sampled_path_equals_the_restated_rule(sampling, budget, ratio, cap):
    g = torch.Generator().manual_seed(int(budget * 10) + int(cap if cap < 9 else 9))
    B, N = 64, 5
    target, draft, q, drafts, num_drafts = ragged_block(g, sampling, B, N)
    spent0 = torch.rand(B, generator=g) * budget
    taken0 = torch.randint(0, 2, (B,), generator=g).float()
    p = process_logits(target, **sampling)
    u = torch.rand((B, N), generator=torch.Generator().manual_seed(5))
    want = [_reference_kept(p[b], q[b], drafts[b], u[b], target[b], int(num_drafts[b]), budget, ratio, cap,
                            float(spent0[b]), float(taken0[b])) for b in range(B)]
    for off in (False, True):
        with fused.loop_disabled() if off else contextlib.nullcontext():
            res = verify("regret-budget", target, draft, drafts, generator=torch.Generator().manual_seed(5),
                         num_drafts=num_drafts, budget=budget, local_ratio=ratio, max_mismatches=cap,
                         regret_spent=spent0, mismatches_taken=taken0, **sampling)
        assert res.num_accepted.tolist() == [k for k, _, _ in want]
        assert torch.allclose(res.state["regret_spent"], torch.tensor([s for _, s, _ in want]), atol=1e-5)
        assert res.state["mismatches_taken"].tolist() == [t for _, _, t in want]
    assert res.relaxed_only.any()


def test_one_mismatch_of_budget_by_monte_carlo():
    """N = 2 with a budget for one mismatch: both drafts are kept with probability s0 + (1 - s0) s1 (the second
    gets the budget only if the first did not spend it), s_i = min(1, p/q); M draws, 5 standard errors."""
    target = torch.tensor([[1.0, 0.5, 0.8, -3.0], [1.2, 0.9, -1.0, -2.0], [0.0, 0.0, 0.0, 0.0]])
    draft = torch.tensor([[-1.0, 2.0, 0.5, -3.0], [0.0, 2.5, -1.0, -2.0]])
    x = torch.tensor([1, 1])
    p, q = target.softmax(-1), draft.softmax(-1)
    s0, s1 = (min(1.0, float(p[i, 1] / q[i, 1])) for i in (0, 1))
    regrets = [float(target[i].max() - target[i, 1]) for i in (0, 1)]  # 0.5, 0.3: one fits a budget of 0.6
    M = 40_000
    res = verify("regret-budget", target.expand(M, 3, 4), draft.expand(M, 2, 4), x.expand(M, 2),
                 generator=torch.Generator().manual_seed(13), budget=0.6, local_ratio=10.0)
    both = float((res.num_accepted == 2).double().mean())
    want = s0 + (1 - s0) * s1
    assert s0 < 0.9 and s1 < 0.9 and regrets[0] + regrets[1] > 0.6 >= max(regrets)
    assert abs(both - want) < 5 * math.sqrt(want * (1 - want) / M), (both, want)
    assert float(res.state["regret_spent"].max()) <= 0.6 and float(res.state["mismatches_taken"].max()) == 1.0


# ---------------------------------------------------------------- parameters and state


@pytest.mark.parametrize("params,message", [
    (dict(budget=-1.0), "rule 'regret-budget': parameter 'budget' must be in [0, inf], got -1.0"),
    (dict(budget=float("nan")), "rule 'regret-budget': parameter 'budget' must be in [0, inf], got nan"),
    (dict(local_ratio=-0.5), "rule 'regret-budget': parameter 'local_ratio' must be in [0, inf], got -0.5"),
    (dict(max_mismatches=1.5), "rule 'regret-budget': parameter 'max_mismatches' must be an integer in [0, inf], "
                               "got 1.5"),
    (dict(regret_spent=torch.zeros(2)), "rule 'regret-budget': pass the input(s) ['regret_spent'] per block, when "
                                        "calling (a per-sequence state: the engine carries it from round to round)"),
])
def test_parameter_errors_are_one_line(params, message):
    with pytest.raises(ValueError) as error:
        VerifyStep("regret-budget", temperature=0.0, **params)
    assert str(error.value) == message


@pytest.mark.parametrize("state,message", [
    (dict(regret_spent=torch.zeros(2)), "rule 'regret-budget': state 'regret_spent' must have shape [B] = [1], "
                                        "got [2]"),
    (dict(regret_spent=torch.tensor([-1.0])), "rule 'regret-budget': state 'regret_spent' must lie in [0, inf] "
                                              "(NaN not allowed)"),
    (dict(mismatches_taken=torch.tensor([1])), "rule 'regret-budget': state 'mismatches_taken' must be a "
                                               "floating-point torch.Tensor [B]"),
])
def test_state_errors_are_one_line(state, message):
    with pytest.raises(ValueError) as error:
        _greedy(**state)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_declarations():
    rule = RULES["regret-budget"]
    assert rule.strict_params() == {"budget": 0.0, "max_mismatches": 0.0}
    assert rule.params["budget"].grid == (0.5, 2.0, 8.0)
    assert set(rule.state) == {"regret_spent", "mismatches_taken"} and rule.reads_uniforms
    assert rule.accepts_at_least_strict and not rule.trusts_q
    assert "per-sequence state regret_spent" in rule.needs_text()


def test_stats_merge_concatenates_the_sequences_state():
    a = GenerationStats(draft_length=3, sequences=1, rule_state={"regret_spent": [0.5]})
    b = GenerationStats(draft_length=3, sequences=1, rule_state={"regret_spent": [1.25]})
    merged = GenerationStats.merge([a, b])
    assert merged.rule_state == {"regret_spent": [0.5, 1.25]} and a.rule_state == {"regret_spent": [0.5]}
    assert GenerationStats.from_dict(merged.as_dict()).rule_state == merged.rule_state
    assert GenerationStats.merge([GenerationStats(draft_length=3)] * 2).rule_state == {}


# ---------------------------------------------------------------- through the engine


def _relaxed_total(result):
    return sum(sum(rd.relaxed_only) for rd in result.trace)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_budget_zero_is_strict_token_for_token(builtin_pair, temperature):
    off, _ = strict_then_relaxed(builtin_pair, temperature, "regret-budget", dict(budget=0.0), dict(budget=8.0))
    assert off.stats.rule_state == {"regret_spent": [0.0] * 6, "mismatches_taken": [0.0] * 6}


def test_the_engine_carries_each_sequences_budget_across_rounds(builtin_pair):
    """Greedy, N = 3: without a cap some sequence keeps more than 2 mismatches over its rounds; with a cap of 2
    none does (a cap per block would let later rounds keep more), and with a budget of 1.5 no sequence spends more.
    Each result's stats hold its own state; the call's, every sequence's in prompt order."""
    verifier, weak = builtin_pair
    kw = dict(method="regret-budget", draft_length=3, max_new_tokens=48, local_ratio=10.0)
    free = generate(verifier, weak, MIXED_PROMPTS, budget=100.0, **kw)
    assert max(r.stats.rule_state["mismatches_taken"][0] for r in free.results) > 2
    assert max(_relaxed_total(r) for r in free.results) > 2
    capped = generate(verifier, weak, MIXED_PROMPTS, budget=100.0, max_mismatches=2, **kw)
    assert max(r.stats.rule_state["mismatches_taken"][0] for r in capped.results) == 2
    assert max(_relaxed_total(r) for r in capped.results) <= 2
    tight = generate(verifier, weak, MIXED_PROMPTS, budget=1.5, **kw)
    spent = tight.stats.rule_state["regret_spent"]
    assert spent == [r.stats.rule_state["regret_spent"][0] for r in tight.results] and len(spent) == 6
    assert 0 < max(spent) <= 1.5
    assert max(spent) < max(free.stats.rule_state["regret_spent"])


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_budget_state_and_output_do_not_depend_on_the_batch(builtin_pair, temperature):
    """Ragged rows near max_new_tokens, rows ending at different rounds: a prompt's tokens and spent budget are the
    same alone, in the batch, and at another position of it."""
    verifier, weak = builtin_pair
    seeds = [derive_seed(4, i) for i in range(len(MIXED_PROMPTS))]
    kw = dict(method="regret-budget", draft_length=5, temperature=temperature, max_new_tokens=14, budget=3.0,
              local_ratio=10.0)
    batch = generate(verifier, weak, MIXED_PROMPTS, seed=seeds, **kw)
    assert any(len(rd.drafts) < 5 for r in batch.results for rd in r.trace)
    assert sum(r.stats.rule_state["mismatches_taken"][0] > 0 for r in batch.results) >= 2
    order = [3, 5, 0, 4, 1, 2]
    shuffled = generate(verifier, weak, [MIXED_PROMPTS[i] for i in order], seed=[seeds[i] for i in order], **kw)
    for j, i in enumerate(order):
        assert shuffled.results[j].token_ids == batch.results[i].token_ids, i
        assert shuffled.results[j].stats.rule_state == batch.results[i].stats.rule_state, i
    for i in (0, 5):
        alone = generate(verifier, weak, [MIXED_PROMPTS[i]], seed=[seeds[i]], **kw)
        assert alone.results[0].token_ids == batch.results[i].token_ids, i
        assert alone.results[0].stats.rule_state == batch.results[i].stats.rule_state, i

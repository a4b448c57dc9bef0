"""The verify loop's bookkeeping in C (acceptance/fused.py: first_rejection, finish, verify_default) against its torch
ops.

The torch ops are the reference, reached with `fused.loop_disabled()` (only the loop's two kernels set aside: the
processed distributions are then the same bits, so every result must be identical, not merely close). Every
rule at its defaults on random blocks, ragged and relaxed ones, forced accepts and rejects; the two stretches on
crafted rows (ties u == accept_prob, a residual without mass, strided inputs); the engine's token ids.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import itertools
import math

import numpy as np
import pytest
import torch

from relaxspec.acceptance import RULES, fused, process_logits
from relaxspec.acceptance.processing import one_hot_argmax
from relaxspec.acceptance.random import CounterDraws, GeneratorDraws, SequenceSeeds
from helpers import NEEDS_KERNELS, kernel_loaded  # noqa: F401  (kernel_loaded: autouse)

pytestmark = NEEDS_KERNELS

verify_module = importlib.import_module("relaxspec.acceptance.verify")


# the result's tensors (inputs_ok: None but for a step that defers its input checks, tested on its own)
FIELDS = [f.name for f in dataclasses.fields(verify_module.VerifyResult) if f.name not in ("inputs_ok", "state")]
SAMPLINGS = [dict(temperature=0.7), dict(temperature=1.0, top_p=0.9), dict(temperature=0.7, top_k=5, top_p=0.95),
             dict(temperature=1.0, top_k=3), dict(temperature=0.0)]  # (greedy: one-hot p and q, strict in closed form)


@pytest.fixture
def calls(monkeypatch):
    """Counts of the loop kernels' calls (so that a test sees the C path taken, not two torch runs)."""
    counts = {"first_rejection": 0, "finish": 0, "verify_default": 0}
    for name in counts:
        kernel = getattr(fused, name)

        def counted(*args, _kernel=kernel, _name=name, **kwargs):
            counts[_name] += 1
            return _kernel(*args, **kwargs)
        monkeypatch.setattr(fused, name, counted)
    return counts


# Rules with their test in C (Rule.native_test): the loop in one call of their own library when sampling.
NATIVE = ("mentored", "typical", "topk-delta", "topk-ratio", "cactus", "spec-casc-tok", "spec-cont-dec", "fuzzy",
          "r-fuzzy", "spec-casc-opt", "ensemble", "threshold", "pad")
# Those whose C does torch's float32 operations one by one (no sum, sqrt or exp of its own): the same bits.
EXACT = ("mentored", "topk-delta", "topk-ratio", "ensemble", "threshold")


def assert_same(a, b, where="", close=False, noise_residual=False):
    """Every field identical; close: accept_prob within float32 rounding (a rule's C test may round apart from torch's
    ops: torch's vectorised sqrt and exp, sums in another order), the decisions and tokens identical still;
    noise_residual: the emitted token may differ where a row stopped at a rejection (a residual that is zero but for
    rounding, e.g. spec-cont-dec's pi - q with the drafter equal to the verifier, is rounding noise either way)."""
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, f"{name} differs {where}"
        if noise_residual and name in ("tokens", "last_token"):
            stopped = a.num_accepted < a.tokens.shape[1] - 1
            x, y = (t.clone() for t in (x, y))
            if name == "tokens":
                x[stopped, a.num_accepted[stopped]] = y[stopped, a.num_accepted[stopped]] = -2
            else:
                x[stopped] = y[stopped] = -2
        if close and name == "accept_prob":
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=f"{name} differs {where}")
        else:
            assert torch.equal(x, y), f"{name} differs {where}"


def block(B, N, V, mode, g):
    """target [B, N+1, V], drafter [B, N+1, V] logits and drafts [B, N] sampled from the drafter's distribution:
    "sampled" a noisy copy; "accept" the drafter equal to the verifier (strict accepts every draft); "reject"
    every draft given logit -1e4 by the verifier (p(x) = 0: strict rejects it)."""
    target = 3.0 * torch.randn(B, N + 1, V, generator=g)
    draft = target.clone() if mode == "accept" else target + 1.5 * torch.randn(B, N + 1, V, generator=g)
    q = process_logits(draft[:, :N])
    drafts = torch.multinomial(q.reshape(B * N, V), 1, generator=g).reshape(B, N)
    if mode == "reject":
        target.scatter_(-1, torch.cat([drafts, drafts[:, -1:]], 1).unsqueeze(-1), -1e4)
    return target, draft, drafts


def draws(kind, B, N, seed):
    if kind == "generator":
        return GeneratorDraws(torch.Generator().manual_seed(seed), B, "cpu")
    start = np.arange(B, dtype=np.int64) * 7 + seed
    return SequenceSeeds([seed + b for b in range(B)], "cpu").at(None, N, host_start=start)


@pytest.mark.parametrize("name", list(RULES))
def test_every_rule_c_path_equals_torch_path(name, calls):
    rule = RULES[name]
    g = torch.Generator().manual_seed(1000 + list(RULES).index(name))
    seen = {"n=0": 0, "n=N": 0, "between": 0, "relaxed_only": 0, "looser": 0, "one call": 0, "kernel": 0}
    cases = itertools.product((1, 5), (1, 3, 6), (7, 714), (False, True), (False, True), SAMPLINGS,
                              ("sampled", "accept", "reject"))
    for k, (B, N, V, ragged, relaxed, sampling, mode) in enumerate(cases):
        target, draft, drafts = block(B, N, V, mode, g)
        num_drafts = torch.randint(0, N + 1, (B,), generator=g) if ragged else None
        relax = torch.rand(B, N + 1, generator=g) < 0.5 if relaxed else None
        inputs = {"pivot_prob": torch.rand(B, N, generator=g)} if "pivot_prob" in rule.inputs else {}
        kind = ("generator", "counter")[k % 2]
        step = verify_module.VerifyStep(name, **sampling)
        results = []
        for off in (False, True):
            with fused.loop_disabled() if off else contextlib.nullcontext():
                results.append(step(target, draft, drafts, random=draws(kind, B, N, k), num_drafts=num_drafts,
                                    relax=relax, **inputs))
        c, ref = results
        assert_same(c, ref, f"(B={B} N={N} V={V} ragged={ragged} relax={relaxed} {sampling} {mode} {kind})",
                    close=step.kernel is not None and name not in EXACT,
                    noise_residual=name == "spec-cont-dec" and mode == "accept")
        # rows read from the block: strict's anywhere, argmax p where the rule decides everywhere (relax None); a rule
        # with its math in C where it decides everywhere, when sampling
        seen["one call"] += step.block_rows == "strict" or (
            not relaxed and (step.block_rows == "argmax" or step.kernel is not None))
        seen["kernel"] += step.kernel is not None
        proposed = torch.full((B,), N) if num_drafts is None else num_drafts
        seen["n=0"] += int((c.num_accepted == 0).sum())
        seen["n=N"] += int((c.num_accepted == proposed).sum())
        seen["between"] += int(((c.num_accepted > 0) & (c.num_accepted < proposed)).sum())
        seen["relaxed_only"] += int(c.relaxed_only.sum())
        seen["looser"] += int((c.accept_prob > c.strict_accept_prob + 0.1).sum())
    greedy_blocks = (k + 1) // len(SAMPLINGS) if rule.greedy_closed_form else 0  # (closed form: no loop)
    loops = k + 1 - greedy_blocks
    # The C path served every loop: in one call where the rule's rows are read from the block (strict's residual and
    # bonus, or typical's argmax residual), else in two around the rule's own rows.
    one = seen["one call"] - greedy_blocks * (step.block_rows is not None)
    assert (step.block_rows is not None) == (name in ("strict", "mentored", "topk-delta", "topk-ratio", "r-fuzzy",
                                                      "spec-casc-opt", "ensemble", "pad", "typical", "fly",
                                                      "regret-budget"))
    assert (calls["verify_default"], calls["first_rejection"], calls["finish"]) == (one, loops - one, loops - one)
    assert (seen["kernel"] > 0) == (name in NATIVE), seen  # (when sampling: 4 of the 5 samplings)
    assert seen["n=0"] and seen["n=N"] and seen["between"], seen
    if seen["looser"] > 50:  # a rule that loosens strict's test at its defaults keeps drafts strict rejects
        assert seen["relaxed_only"], seen


SETTINGS = {  # each NATIVE rule's edges and grid
    "mentored": [dict(alpha=a) for a in (0.0, 0.3, 0.95, 0.999)],
    "typical": [dict(epsilon=e, delta=d) for e, d in ((0.09, 0.3), (1.0, 0.0), (0.0, 5.0), (0.3, 2.0))],
    "topk-delta": [dict(topk=k, delta=d) for k, d in ((0, 0.6), (1, 0.0), (3, 0.3), (10, 0.6), (1000, 1.0))],
    "topk-ratio": [dict(topk=k, ratio=r) for k, r in ((0, 0.3), (1, 1.0), (3, 0.1), (10, 0.3), (1000, 0.0))],
    "cactus": [dict(delta=d) for d in (0.0, 0.1, 1.0, 10.0, 1e6)],
    "spec-casc-tok": [dict(alpha=a) for a in (0.0, 0.35, 0.8, 1.0)],
    "spec-cont-dec": [dict(beta=b) for b in (0.0, 0.1, 0.5, 1.0, 5.0)],
    "fuzzy": [dict(threshold=t) for t in (0.0, 0.05, 0.3, 0.7)],
    "r-fuzzy": [dict(threshold=t) for t in (0.0, 0.05, 0.3, 0.7)],
    "spec-casc-opt": [dict(alpha=a) for a in (-1.0, -0.1, 0.0, 0.05, 2.0)],
    "ensemble": [dict(weight=w) for w in (0.0, 0.5, 0.9, 1.0)],
    "threshold": [dict(single=s_, acc=a) for s_, a in ((1.0, 1.0), (0.01, 1.0), (0.3, 0.5), (1e-6, 1e-6), (0.0, 1.0),
                                                       (1.0, 0.0), (0.0, 0.0), (1.0, 1e-12))],
    "pad": [dict(threshold=t, min_prob=m, floor=f) for t, m, f in (
        (0.0, 1e-4, "classifier"), (0.5, 1e-4, "classifier"), (1.0, 0.0, "classifier"), (0.7, 0.05, "classifier"),
        (0.5, 1e-4, "authors"), (0.3, 0.05, "authors"), (1.0, 0.0, "authors"))],
}


@pytest.mark.parametrize("name", NATIVE)
def test_rule_kernels_equal_their_torch_math_across_settings(name, calls):
    # A rule's test and residual in C (its own library) against its torch methods (the loop's torch ops), at the edges
    # of its parameters, on sampled blocks and crafted ones: drafts with p(x) = 1 (cactus's 0/0 scale), q(x) = 0, ties
    # at the k-th probability, a one-hot p, a verifier with tied logits; residuals without mass (spec-casc-tok at
    # alpha 1 is q: every draft accepted), a drafter logit of -inf, and rows that take every draft.
    assert set(SETTINGS) == set(NATIVE)
    g = torch.Generator().manual_seed(31 + NATIVE.index(name))
    B, N, V = 4, 3, 9
    seen = {"stopped": 0, "all": 0}
    for k, (params, mode, sampling) in enumerate(itertools.product(
            SETTINGS[name], ("sampled", "accept", "reject", "crafted"), SAMPLINGS[:4])):
        target, draft, drafts = block(B, N, V, "sampled" if mode == "crafted" else mode, g)
        draft_probs = None
        if mode == "crafted":
            target[0, 0] = -1e4
            target[0, 0, drafts[0, 0]] = 5.0  # p one-hot on the draft: p(x) = 1
            target[1, :, :4] = 2.0  # tied logits: ties at the k-th value and in the top set
            drafts[1] = torch.tensor([0, 3, 2])
            draft[3, :, drafts[3, 0]] = -math.inf  # the drafter rules a token out (spec-cont-dec: all its mass there)
            draft_probs = process_logits(draft[:, :N], **sampling)
            draft_probs[2, 1] = 0.0
            draft_probs[2, 1, (drafts[2, 1] + 1) % V] = 1.0  # q(x) = 0 at row 2's second draft
        step = verify_module.VerifyStep(name, **sampling, **params)
        assert step.kernel is not None
        inputs = {"pivot_prob": torch.rand(B, N, generator=g)} if "pivot_prob" in RULES[name].inputs else {}
        for seed in range(8 * k, 8 * k + 8):  # many draws on each block: the residual's weights, not only its support
            before = calls["verify_default"]
            c = step(target, draft, drafts, random=draws("counter", B, N, seed), draft_probs=draft_probs, **inputs)
            assert calls["verify_default"] == before + 1 and not calls["finish"]
            with fused.loop_disabled():
                ref = step(target, draft, drafts, random=draws("counter", B, N, seed), draft_probs=draft_probs,
                           **inputs)
            assert_same(c, ref, f"({params} {mode} {sampling})", close=name not in EXACT,
                        noise_residual=name == "spec-cont-dec" and mode == "accept")
            seen["stopped"] += int((c.num_accepted < N).sum())
            seen["all"] += int((c.num_accepted == N).sum())
    assert seen["stopped"] and seen["all"], seen


def test_a_block_the_rules_c_declines_takes_the_torch_path(calls):
    # spec-cont-dec's scores overflow at a huge beta: its C declines the block, and the torch math reports the error,
    # as it does with the kernels off; a block it computes after that is the call's again.
    g = torch.Generator().manual_seed(3)
    target, draft, drafts = block(2, 3, 50, "sampled", g)
    step = verify_module.VerifyStep("spec-cont-dec", temperature=0.7, beta=1e38)
    assert step.kernel is not None
    for off in (False, True):
        with fused.loop_disabled() if off else contextlib.nullcontext():
            with pytest.raises(ValueError, match="overflow"):
                step(target, draft, drafts, random=draws("counter", 2, 3, 0))
    assert calls["verify_default"] == 1
    fine = verify_module.VerifyStep("spec-cont-dec", temperature=0.7, beta=0.5)
    fine(target, draft, drafts, random=draws("counter", 2, 3, 0))
    assert calls["verify_default"] == 2 and not calls["first_rejection"]


def test_rule_kernels_read_float32_logits_only(calls):
    # float64 drafter logits beside float32 distributions (the kernels read float32): the rule's torch math serves.
    g = torch.Generator().manual_seed(4)
    target, draft, drafts = block(2, 3, 40, "sampled", g)
    q = process_logits(draft[:, :3], temperature=0.7)
    step = verify_module.VerifyStep("spec-cont-dec", temperature=0.7, beta=0.5)
    got = step(target, draft.double(), drafts, random=draws("counter", 2, 3, 1), draft_probs=q)
    assert calls["verify_default"] == 0  # (its float64 test then takes the torch loop too)
    with fused.loop_disabled():
        ref = step(target, draft.double(), drafts, random=draws("counter", 2, 3, 1), draft_probs=q)
    assert_same(got, ref)


def test_the_engines_step_checks_pads_pivot_prob_on_every_path(calls, monkeypatch):
    # The engine's VerifyStep checks pivot_prob's values on every block, not in torch where the rule's C reads them
    # (float32 on the block's device): the C refuses a value outside [0, 1] or NaN and the step raises the rule's own
    # message; a float64 input, the kernels off and the greedy closed form check in torch. Bounds are accepted.
    g = torch.Generator().manual_seed(5)
    B, N, V = 2, 3, 40
    target, draft, drafts = block(B, N, V, "sampled", g)
    message = r"^rule 'pad': input 'pivot_prob' must lie in \[0, 1\] \(NaN not allowed\)$"
    torch_checks = []
    rule = RULES["pad"]
    monkeypatch.setattr(type(rule), "_check_input_values",
                        lambda self, spec, value, _check=type(rule)._check_input_values: (
                            torch_checks.append(value.dtype), _check(self, spec, value))[1])
    sampled = verify_module.VerifyStep("pad", temperature=0.7)
    greedy = verify_module.VerifyStep("pad", temperature=0.0, greedy="strict")
    assert sampled.kernel is not None and greedy.closed_form
    for bad in (1.5, -1e-7, math.nan, math.inf):
        for dtype, step, off in ((torch.float32, sampled, False), (torch.float64, sampled, False),
                                 (torch.float32, sampled, True), (torch.float32, greedy, False)):
            pivot_prob = torch.rand(B, N, generator=g, dtype=dtype)
            pivot_prob[1, 2] = bad  # (the last column of the last row: every value is read)
            torch_checks.clear()
            with fused.loop_disabled() if off else contextlib.nullcontext():
                with pytest.raises(ValueError, match=message):
                    step(target, draft, drafts, random=draws("counter", B, N, 0), pivot_prob=pivot_prob)
            assert torch_checks == [dtype]  # where the C refused it, the message's check ran after it
    p, q = process_logits(target, temperature=0.7), process_logits(draft, temperature=0.7)
    with pytest.raises(fused.InputOutOfRange):  # the C itself, without the step
        fused.verify_default(p, q, drafts, None, None, torch.rand(B, N, dtype=torch.float64),
                             torch.rand(B, N + 1, dtype=torch.float64), None, kernel=sampled.kernel, z=target, zq=draft,
                             inp=torch.full((B, N), 1.0 + 1e-6), inp_range=(0.0, 1.0))
    # defer_input_checks (the engine's step): where torch checks, the rows' results come back unread (inputs_ok);
    # the C still refuses at once
    deferred = verify_module.VerifyStep("pad", temperature=0.7, defer_input_checks=True)
    pivot_prob = torch.rand(B, N, generator=g)
    pivot_prob[1, 2] = math.nan
    for dtype in (torch.float64, torch.float32):
        with fused.loop_disabled():
            got = deferred(target, draft, drafts, random=draws("counter", B, N, 0), pivot_prob=pivot_prob.to(dtype))
        assert got.inputs_ok.tolist() == [True, False]
        with pytest.raises(ValueError, match=message):
            raise deferred.input_error(pivot_prob=pivot_prob.to(dtype))
        with pytest.raises(ValueError, match=message):  # the C reads the input (a float64 one converted)
            deferred(target, draft, drafts, random=draws("counter", B, N, 0), pivot_prob=pivot_prob.to(dtype))
    assert deferred(target, draft, drafts, random=draws("counter", B, N, 0),
                    pivot_prob=pivot_prob.nan_to_num(0.5)).inputs_ok is None  # (checked by the C)
    before = calls["verify_default"]
    torch_checks.clear()
    for edge in (0.0, 1.0):  # the bounds pass, in C (no torch check on the kernel's path)
        got = sampled(target, draft, drafts, random=draws("counter", B, N, 1), pivot_prob=torch.full((B, N), edge))
        assert got.num_accepted.shape == (B,)
    assert calls["verify_default"] == before + 2 and torch_checks == []


def test_a_step_made_with_the_kernels_off_leaves_them_for_later_steps():
    with fused.disabled():
        assert verify_module.VerifyStep("cactus", temperature=0.7).kernel is None
    assert verify_module.VerifyStep("cactus", temperature=0.7).kernel is not None


def test_first_rejection_on_crafted_rows():
    # Ties (u == accept_prob rejects), accept_prob 0 and 1, num_drafts 0 and N, strided u (a slice of a wider
    # table, as a round's uniforms are) and accept_prob.
    B, N = 6, 4
    table = torch.tensor([[0.5, 0.25, 0.0, 0.75, 0.1], [0.0, 0.0, 0.0, 0.0, 0.9], [0.3, 0.3, 0.3, 0.3, 0.3],
                          [0.999, 0.5, 0.5, 0.5, 0.0], [0.2, 0.9, 0.2, 0.2, 0.4], [0.6, 0.6, 0.6, 0.6, 0.6]])
    u = table[:, :N]
    accept_prob = torch.tensor([[0.5, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.3, 0.30001, 0.9, 0.0],
                                [1.0, 0.6, 0.6, 0.4], [0.3, 0.95, 0.3, 0.3], [0.7, 0.7, 0.7, 0.7]]).t().contiguous().t()
    strict = accept_prob * 0.5
    assert not u.is_contiguous() and not accept_prob.is_contiguous()
    for num_drafts, strict_prob in itertools.product((None, torch.tensor([4, 0, 2, 3, 1, 4])), (None, strict)):
        c = verify_module._first_rejection(u, accept_prob, strict_prob, num_drafts)
        with fused.loop_disabled():
            ref = verify_module._first_rejection(u, accept_prob, strict_prob, num_drafts)
        for x, y in zip(c, ref):
            assert x.dtype == y.dtype and torch.equal(x, y)
    n_all = verify_module._first_rejection(u, accept_prob, None, None)[2]
    assert n_all.tolist() == [0, 4, 0, 3, 4, 4]  # ties (u == accept_prob, rows 0 and 2) reject


def test_finish_on_crafted_rows():
    # A residual without mass (all zeros, NaN) falls back to p; the bonus read through a strided view (p[:, -1]
    # as Rule.bonus gives it); both draw sources; num_drafts.
    B, N, V = 4, 3, 9
    g = torch.Generator().manual_seed(5)
    p_block = torch.rand(B, N + 1, V, generator=g)
    residual = torch.rand(B, V, generator=g)
    residual[1] = 0.0
    residual[2, 3] = float("nan")
    residual[3, :5] = 0.0
    p, bonus = p_block[:, 1], p_block[:, -1]
    assert not bonus.is_contiguous()
    drafts = torch.randint(0, V, (B, N + 2), generator=g)[:, 1:N + 1]
    kept_n = torch.tensor([0, 1, 2, 3])
    for num_drafts, kind in itertools.product((None, torch.tensor([3, 2, 2, 3])), ("generator", "counter")):
        kept = torch.arange(N) < kept_n.unsqueeze(1)
        outs = []
        for off in (False, True):
            with fused.loop_disabled() if off else contextlib.nullcontext():
                outs.append(verify_module._finish(draws(kind, B, N, 3), kept_n, kept, num_drafts, residual, p,
                                                  bonus, drafts))
        (tokens, last), (ref_tokens, ref_last) = outs
        assert torch.equal(tokens, ref_tokens) and torch.equal(last, ref_last)
        assert tokens[:, :N].masked_select(kept).tolist() == drafts.masked_select(kept).tolist()
        assert torch.equal(tokens.gather(1, kept_n.unsqueeze(1)).squeeze(1), last)


def test_verify_default_on_crafted_blocks():
    # The loop in one call for a rule with strict's residual and bonus, read from the blocks: a row whose residual has
    # no mass (q = p there) falls back to p, num_drafts moves the bonus row, p and q read through strided views, the
    # rule's accept_prob forcing each row's n (and relaxed_only against a strict test); the same results as the two
    # kernels around the rows computed (Rule.residual, Rule.bonus) and handed to `finish`. Without accept_prob, strict's
    # test is computed in the call: the values at_tokens and capped_ratio give (q(x) = 0 rejected).
    B, N, V = 5, 3, 11
    g = torch.Generator().manual_seed(8)
    p_wide = torch.rand(B, N + 1, V + 2, generator=g)
    p_wide /= p_wide.sum(-1, keepdim=True)
    p = p_wide[..., 1:V + 1]
    q = torch.rand(B, N, V, generator=g).transpose(0, 1).contiguous().transpose(0, 1)
    q[1, 0] = p[1, 0]  # row 1 stops at 0 with a residual of zero mass
    q[2, 1, :] = 0.0
    q[2, 1, 4] = 1.0  # row 2: a residual with one zero column
    assert not p.is_contiguous() and not q.is_contiguous()
    drafts = torch.randint(0, V, (B, N), generator=g)
    n_forced = torch.tensor([0, 0, 1, 3, 2])
    accept_prob = (torch.arange(N) < n_forced.unsqueeze(1)).float()  # 1 before each row's n, 0 from there on
    strict_prob = torch.full((B, N), 0.5)
    for num_drafts, kind in itertools.product((None, torch.tensor([2, 3, 3, 3, 2])), ("generator", "counter")):
        random = draws(kind, B, N, 4)
        u = random.uniform(2, N, dtype=torch.float64)
        got = fused.verify_default(p, q, drafts, accept_prob, strict_prob, u, random.token_uniforms(N), num_drafts)
        random = draws(kind, B, N, 4)
        u = random.uniform(2, N, dtype=torch.float64)
        accepted, kept, n, relaxed_only = fused.first_rejection(u, accept_prob, strict_prob, num_drafts)
        rows = torch.arange(B)
        at = n.clamp(max=N - 1)
        bonus_at = torch.full((B,), N) if num_drafts is None else num_drafts
        residual = (p[rows, at] - q[rows, at]).clamp_min(0.0)
        tokens, last = verify_module._finish(random, n, kept, num_drafts, residual, p[rows, at], p[rows, bonus_at],
                                             drafts)
        for x, y in zip(got, (accept_prob, strict_prob, accepted, kept, n, relaxed_only, tokens, last)):
            assert torch.equal(x, y)
        assert torch.equal(n, torch.minimum(n_forced, bonus_at))
        assert relaxed_only.any() and not relaxed_only[~kept].any()
        assert got[7][3] == got[6][3, 3]  # row 3 took every draft: the bonus at its bonus position
        # typical's residual (Rule.residual_argmax): the first largest p at the rejection (row 0 has a tie there)
        ties = p.clone()
        ties[0, 0, 2] = ties[0, 0, 7] = ties[0, 0].max() + 0.5
        random = draws(kind, B, N, 4)
        u = random.uniform(2, N, dtype=torch.float64)
        got = fused.verify_default(ties, q, drafts, accept_prob, None, u, random.token_uniforms(N), num_drafts,
                                   argmax=True)
        random = draws(kind, B, N, 4)
        random.uniform(2, N, dtype=torch.float64)
        ref = verify_module._finish(random, n, kept, num_drafts, one_hot_argmax(ties[rows, at]), ties[rows, at],
                                    ties[rows, bonus_at], drafts)
        assert torch.equal(got[6], ref[0]) and torch.equal(got[7], ref[1]) and got[7][0] == 2
        # strict's test computed in the call
        random = draws(kind, B, N, 4)
        u = random.uniform(2, N, dtype=torch.float64)
        strict = fused.verify_default(p, q, drafts, None, None, u, random.token_uniforms(N), num_drafts)
        q_x = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        ref = (p[:, :N].gather(-1, drafts.unsqueeze(-1)).squeeze(-1) / q_x).clamp(max=1.0).masked_fill(q_x <= 0, 0.0)
        assert torch.equal(strict[0], ref) and (strict[0][2, 1] == 0) == (drafts[2, 1] != 4)
        assert strict[1] is None and not strict[5].any()  # relaxed_only: none against its own test
    with pytest.raises(ValueError, match="outside the vocabulary"):
        fused.verify_default(p, q, torch.full((B, N), V), None, None, u, draws("counter", B, N, 4).token_uniforms(N),
                             None)


def test_token_uniforms_are_the_draws_the_loop_samples_with():
    # Column n of a round's token uniforms is what uniform53(TOKEN, n) gives (with and without the round's table);
    # a generator's is one draw per row, the draw `sample` would make.
    B, N = 3, 4
    start = np.array([0, 5, 17])
    seeds = SequenceSeeds([3, 4, 5], "cpu")
    for draws_ in (seeds.at(None, N, host_start=start), seeds.at(torch.from_numpy(start))):
        table = draws_.token_uniforms(N)
        assert table.shape == (B, N + 1) and table.dtype == torch.float64
        for n in range(N + 1):
            assert torch.equal(table[:, n], seeds.at(torch.from_numpy(start)).uniform53(3, n))
    one = GeneratorDraws(torch.Generator().manual_seed(1), B, "cpu").token_uniforms(N)
    assert one.stride(1) == 0 and torch.equal(one[:, 0], torch.rand(B, generator=torch.Generator().manual_seed(1),
                                                                       dtype=torch.float64))


def test_the_generator_advances_alike():
    # The C path draws its token uniforms from a generator with the same calls as the torch path: the next draw
    # after a block is the same.
    g = torch.Generator().manual_seed(2)
    target, draft, drafts = block(3, 3, 50, "sampled", g)
    step = verify_module.VerifyStep("strict", temperature=0.7)
    after = []
    for off in (False, True):
        gen = torch.Generator().manual_seed(9)
        with fused.loop_disabled() if off else contextlib.nullcontext():
            step(target, draft, drafts, generator=gen)
        after.append(torch.rand(4, generator=gen))
    assert torch.equal(*after)


def test_other_dtypes_and_draw_sources_take_the_torch_path(calls):
    # float64 blocks, and a Draws the package does not define, run the torch ops (the kernels take float32 CPU).
    g = torch.Generator().manual_seed(4)
    target, draft, drafts = block(2, 3, 30, "sampled", g)
    step = verify_module.VerifyStep("strict", temperature=1.0)
    step(target.double(), draft.double(), drafts, generator=torch.Generator().manual_seed(1))
    assert calls == {"first_rejection": 0, "finish": 0, "verify_default": 0}

    class Plain(verify_module.Draws):
        def __init__(self, inner):
            self.inner = inner

        def uniform(self, purpose, width, dtype=torch.float32):
            return self.inner.uniform(purpose, width, dtype)

        def sample(self, weights, purpose, offset=0):
            return self.inner.sample(weights, purpose, offset)

    inner = draws("counter", 2, 3, 0)
    got = step(target, draft, drafts, random=Plain(inner))
    assert calls == {"first_rejection": 1, "finish": 0, "verify_default": 0}
    assert_same(got, step(target, draft, drafts, random=draws("counter", 2, 3, 0)))


@pytest.mark.parametrize("method", ["strict", "typical", "mentored", "cactus"])
def test_generate_token_ids_identical(builtin_pair, method, calls):
    from relaxspec.engine import generate
    from relaxspec.tasks import synthetic

    verifier, drafter = builtin_pair
    prompts = [e.prompt for e in synthetic.examples("arithmetic", "test", 3)]
    kw = dict(method=method, draft_length=3, max_new_tokens=24, temperature=0.7, top_p=0.95, seed=11)
    c = generate(verifier, drafter, prompts, **kw)
    assert calls["finish"] + calls["verify_default"] > 0
    with fused.loop_disabled():
        ref = generate(verifier, drafter, prompts, **kw)
    with fused.disabled():  # every kernel set aside: probabilities may differ in the last bits, samples do not here
        torch_only = generate(verifier, drafter, prompts, **kw)
    one = generate(verifier, drafter, prompts[:1], **kw)  # batch 1: the kernels serve rows alone too
    assert [r.token_ids for r in c.results] == [r.token_ids for r in ref.results]
    assert [r.token_ids for r in c.results] == [r.token_ids for r in torch_only.results]
    assert one.results[0].token_ids == c.results[0].token_ids
    assert (c.stats.verifier_forwards, c.stats.drafts_accepted) == (ref.stats.verifier_forwards, ref.stats.drafts_accepted)


@pytest.mark.parametrize("name", list(RULES))
def test_a_row_alone_equals_the_row_in_a_batch(name):
    # Counter draws are per sequence: a row verified alone (batch 1: its residual row read in place, a view) gives
    # what it gives inside a batch of 4 (rows gathered), on the C path and on the torch path.
    rule = RULES[name]
    g = torch.Generator().manual_seed(77)
    B, N, V = 4, 3, 40
    for sampling, mode in itertools.product(SAMPLINGS[:2], ("sampled", "accept", "reject")):
        target, draft, drafts = block(B, N, V, mode, g)
        inputs = {"pivot_prob": torch.rand(B, N, generator=g)} if "pivot_prob" in rule.inputs else {}
        seeds, start = [11, 12, 13, 14], np.array([0, 5, 9, 30], dtype=np.int64)
        step = verify_module.VerifyStep(name, **sampling)
        for off in (False, True):
            with fused.loop_disabled() if off else contextlib.nullcontext():
                batch = step(target, draft, drafts, random=SequenceSeeds(seeds, "cpu").at(None, N, host_start=start),
                             **inputs)
                for b in range(B):
                    alone = step(target[b:b + 1], draft[b:b + 1], drafts[b:b + 1],
                                 random=SequenceSeeds(seeds[b:b + 1], "cpu").at(None, N, host_start=start[b:b + 1]),
                                 **{k: v[b:b + 1] for k, v in inputs.items()})
                    for field in FIELDS:
                        assert torch.equal(getattr(alone, field)[0], getattr(batch, field)[b]), (field, b, off)


# ---------------------------------------------------------------- the rules' two primitives (processing.py)


def test_at_tokens_equals_gather_on_blocks_rows_and_strided_views():
    from relaxspec.acceptance.processing import at_tokens
    g = torch.Generator().manual_seed(5)
    p = torch.rand(3, 5, 714, generator=g)
    x = torch.randint(0, 714, (3, 4), generator=g)
    for probs, tokens in ((p[:, :4], x), (p[:, 2], x[:, 1]), (p[:, :4].transpose(0, 1), x.t()),
                          (p[:, :4, :7], x % 7), (p[:, :4].flip(-1), x)):
        want = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        got = at_tokens(probs, tokens)
        assert got.shape == want.shape and torch.equal(got, want)
        with fused.disabled():
            assert torch.equal(at_tokens(probs, tokens), want)
    bad = x.clone()
    bad[1, 2] = 714
    with pytest.raises(ValueError, match="outside the vocabulary"):
        fused.at_tokens(p[:, :4], bad)
    bad[1, 2] = -1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        fused.at_tokens(p[:, :4], bad)


def test_capped_ratio_kernel_equals_torch_bit_for_bit_with_edge_values():
    from relaxspec.acceptance.processing import capped_ratio
    g = torch.Generator().manual_seed(6)
    num = torch.rand(4, 50, generator=g) * 2
    den = torch.rand(4, 50, generator=g) * 2
    edges = torch.tensor([0.0, -0.0, -1.0, 1e-45, 1e-30, float("inf"), float("nan"), 1.0, 0.5, 3.0])
    num[0, :10], den[0, :10] = torch.tensor([0.3, 0.3, 0.3, 1e-30, 1e-38, 0.2, 0.1, 1.0, 0.5, float("nan")]), edges
    num[1, :3] = torch.tensor([0.0, float("inf"), float("nan")])
    with fused.disabled():
        want = capped_ratio(num, den)
    got = capped_ratio(num, den)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(torch.nan_to_num(got, nan=-7.0), torch.nan_to_num(want, nan=-7.0))
    assert torch.equal(torch.signbit(got), torch.signbit(want))
    assert got[0, 0] == 0 and got[0, 2] == 0 and got[0, 3] == 1 and (got[~got.isnan()] <= 1).all()


@pytest.mark.parametrize("name", list(RULES))
def test_a_block_tested_in_parts_equals_the_block_tested_whole(name, monkeypatch):
    # A block larger than verify's chunk_elements is tested a few sequences at a time (bounded memory): the same
    # results, bit for bit, on the torch path and the C path, with relax masks, ragged rows and tensor inputs.
    rule = RULES[name]
    g = torch.Generator().manual_seed(91)
    B, N, V = 5, 3, 40
    parts = []
    select = verify_module.VerifyContext.select
    monkeypatch.setattr(verify_module.VerifyContext, "select",
                        lambda ctx, start, stop: parts.append((start, stop)) or select(ctx, start, stop))
    for sampling, mode, relaxed in itertools.product(SAMPLINGS, ("sampled", "accept", "reject"), (False, True)):
        target, draft, drafts = block(B, N, V, mode, g)
        inputs = {"pivot_prob": torch.rand(B, N, generator=g)} if "pivot_prob" in rule.inputs else {}
        relax = torch.rand(B, N + 1, generator=g) < 0.5 if relaxed else None
        num_drafts = torch.randint(0, N + 1, (B,), generator=g)
        for off in (False, True):
            with fused.disabled() if off else contextlib.nullcontext():
                results = []
                for elements in (1 << 30, 2 * N * V):  # whole; two sequences at a time
                    monkeypatch.setattr(verify_module, "chunk_elements", lambda device, e=elements: e)
                    step = verify_module.VerifyStep(name, **sampling)
                    results.append(step(target, draft, drafts, random=draws("counter", B, N, 3), relax=relax,
                                        num_drafts=num_drafts, **inputs))
                assert_same(*results, where=f"({sampling} {mode} relax={relaxed} off={off})")
    if rule.name != "strict":  # (strict's test is strict's: no rule math to split)
        assert parts[:3] == [(0, 2), (2, 4), (4, 6)]  # (the last part: sequence 4 alone)

"""The rules' math written in fewer tensor ops gives the same bits as its plain form.

The references below are the rules' earlier, op-by-op formulas (kept here as the specification): every rewrite in
acceptance/ (cactus, spec-casc-tok, spec-cont-dec, typical, topk-delta, topk-ratio, threshold, and the shared
accept_or_strict / top_candidate / jsd) must give torch.equal accept_prob, residual and bonus, on the C kernels'
path (float32 CPU) and the torch path, at the edge cases the rewrites rely on: p(x) = 1 (cactus' 0/0 scale), q(x) = 0
(a draft outside the drafter's top-k), p(x) = 0 (top-p-zeroed drafts), ties at the top-k cut, drafter logits of -inf
inside the verifier's support and overflowing contrasts (spec-cont-dec).
"""

import contextlib
import dataclasses
import math

import pytest
import torch

from relaxspec.acceptance import RULES, build_context, fused
from relaxspec.acceptance.processing import NEG_INF, capped_ratio, is_greedy, one_hot_argmax

INF = float("inf")


# ---------------------------------------------------------------- the references (the plain formulas)


def ref_entropy(p):
    return -torch.xlogy(p, p).sum(dim=-1)


def ref_jsd(p, q):
    s = p + q
    neg_h = torch.xlogy(p, p).sum(dim=-1) + torch.xlogy(q, q).sum(dim=-1)
    out = 0.5 * (neg_h - torch.xlogy(s, s).sum(dim=-1)) + (0.5 * math.log(2.0)) * s.sum(dim=-1)
    return out.clamp(0.0, math.log(2.0))


def ref_accept_or_strict(gate, p_x, q_x):
    strict = capped_ratio(p_x, q_x)
    return torch.where(gate & (q_x > 0), 1.0, strict)


def ref_ranking_probs(pos):
    return pos.p_tilde if is_greedy(pos.temperature) else pos.p


def ref_top_candidate(probs, x, k, floor):
    p_x = probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    rank = (probs > p_x.unsqueeze(-1)).sum(dim=-1)
    return (rank < k) & (p_x >= floor) & (p_x > 0)


def ref_cactus_h(p_x, delta):
    boost = (2.0 * delta * p_x * (1.0 - p_x)).clamp_min(0.0).sqrt()
    return (p_x + boost).clamp(0.0, 1.0)


def ref_cactus_residual(pos, delta):
    h = ref_cactus_h(pos.p_x, delta)
    rest = 1.0 - pos.p_x
    scale = torch.where(rest > 0, (1.0 - h) / torch.where(rest > 0, rest, 1.0), 1.0)
    H = (pos.p * scale.unsqueeze(-1)).scatter(-1, pos.x.unsqueeze(-1), h.unsqueeze(-1))
    return (H - pos.q).clamp_min(0.0)


def ref_casc_tok_target(pos, alpha):
    p_tilde = pos.p_tilde
    in_a = p_tilde >= (1.0 - alpha) * p_tilde.amax(dim=-1, keepdim=True)
    eta = (pos.q * ~in_a).sum(dim=-1, keepdim=True)
    return pos.q * in_a + eta * pos.p


def ref_contrastive_target(z_p, z_q, p, beta, temperature):
    if beta == 0 or is_greedy(temperature):
        return p
    support = p > 0
    amateur_banned = support & torch.isneginf(z_q)
    scores = ((1.0 + beta) * z_p - beta * z_q) / temperature
    if bool((support & ~amateur_banned & ~torch.isfinite(scores)).any()):
        raise ValueError("overflow")
    scores = scores.masked_fill(~support, NEG_INF)
    scores = torch.where(amateur_banned.any(dim=-1, keepdim=True),
                         torch.where(amateur_banned, 0.0, NEG_INF), scores)
    return scores.softmax(dim=-1)


def _gather(t, x):
    return t.gather(-1, x.unsqueeze(-1)).squeeze(-1)


# rule name -> (accept_prob(pos, **params), residual(pos, **params) or None: unchanged, bonus(ctx, **params) or None)
REFERENCES = {
    "cactus": (lambda pos, delta: capped_ratio(ref_cactus_h(pos.p_x, delta), pos.q_x),
               ref_cactus_residual, None),
    "spec-casc-tok": (lambda pos, alpha: capped_ratio(_gather(ref_casc_tok_target(pos, alpha), pos.x), pos.q_x),
                      lambda pos, alpha: (ref_casc_tok_target(pos, alpha) - pos.q).clamp_min(0.0), None),
    "spec-cont-dec": (
        lambda pos, beta: capped_ratio(
            _gather(ref_contrastive_target(pos.z_p, pos.z_q, pos.p, beta, pos.temperature), pos.x), pos.q_x),
        lambda pos, beta: (ref_contrastive_target(pos.z_p, pos.z_q, pos.p, beta, pos.temperature)
                           - pos.q).clamp_min(0.0),
        lambda ctx, beta: ref_contrastive_target(ctx.target_logits[:, -1], ctx.draft_logits[:, -1], ctx.p[:, -1],
                                                 beta, ctx.temperature)),
    "typical": (lambda pos, epsilon, delta: (
        pos.p_x > torch.clamp(delta * torch.exp(-ref_entropy(pos.p)), max=epsilon)).to(pos.p.dtype),
        lambda pos, **_: one_hot_argmax(pos.p), None),
    "topk-delta": (lambda pos, topk, delta: ref_accept_or_strict(
        ref_top_candidate(ref_ranking_probs(pos), pos.x, topk, ref_ranking_probs(pos).amax(dim=-1) - delta),
        pos.p_x, pos.q_x), None, None),
    "topk-ratio": (lambda pos, topk, ratio: ref_accept_or_strict(
        ref_top_candidate(ref_ranking_probs(pos), pos.x, topk, ratio * ref_ranking_probs(pos).amax(dim=-1)),
        pos.p_x, pos.q_x), None, None),
    "r-fuzzy": (lambda pos, threshold: ref_accept_or_strict(ref_jsd(pos.p, pos.q) <= threshold, pos.p_x, pos.q_x),
                None, None),
    "fuzzy": (lambda pos, threshold: (ref_jsd(pos.p, pos.q) < threshold).to(pos.p.dtype), None, None),
    "spec-casc-opt": (lambda pos, alpha: ref_accept_or_strict(
        pos.q.amax(dim=-1) >= pos.p.amax(dim=-1) - alpha * (pos.p - pos.q).clamp_min(0.0).sum(dim=-1),
        pos.p_x, pos.q_x), None, None),
    "threshold": (lambda pos, single, acc: ref_threshold(pos.p_x, single, acc), None, None),
}


def ref_threshold(p_x, single, acc):
    """SGLang's test, u <= p(x)/max(acc, 1e-9) or p(x) >= single, as the bound the loop compares u < with: the next
    float above the ratio (1 at or above 1), 0 for p(x) = 0 (never accepted by the ratio)."""
    ratio = p_x / max(acc, 1e-9)
    bound = torch.where(ratio < 1.0, torch.nextafter(ratio, torch.full_like(ratio, 2.0)), torch.ones_like(ratio))
    return torch.where(p_x >= single, torch.ones_like(p_x), torch.where(p_x > 0, bound, torch.zeros_like(p_x)))

# settings per rule: the defaults, the grid, the strict setting and extremes
SETTINGS = {
    "cactus": [dict(delta=d) for d in (0.0, 0.1, 1.0, 10.0, 1e6)],
    "spec-casc-tok": [dict(alpha=a) for a in (0.0, 0.35, 0.8, 1.0)],
    "spec-cont-dec": [dict(beta=b) for b in (0.0, 0.1, 0.5, 1.0, 4.0)],
    "typical": [dict(epsilon=e, delta=d) for e, d in ((0.09, 0.3), (1.0, 0.0), (0.0, 1.0), (0.5, 5.0))],
    "topk-delta": [dict(topk=k, delta=d) for k, d in ((10, 0.6), (0, 0.6), (1, 0.0), (3, 0.3), (1e9, 1.0), (2, 0.05))],
    "topk-ratio": [dict(topk=k, ratio=r) for k, r in ((10, 0.3), (0, 0.3), (1, 1.0), (3, 0.1), (1e9, 0.0), (2, 0.9))],
    "r-fuzzy": [dict(threshold=t) for t in (0.0, 0.05, 0.2, 0.3, 1.0)],
    "fuzzy": [dict(threshold=t) for t in (0.0, 0.2, 1.0)],
    "spec-casc-opt": [dict(alpha=a) for a in (-0.1, 0.0, 0.05, 3.0)],
    "threshold": [dict(single=s, acc=a) for s, a in ((1.0, 1.0), (0.01, 1.0), (0.3, 0.5), (1.0, 1e-3), (0.0, 1.0),
                                                     (1.0, 0.0), (0.0, 0.0), (1.0, 1e-12))],
}

SAMPLINGS = {
    "T0.7-top-p0.95": dict(temperature=0.7, top_p=0.95),
    "T1": dict(temperature=1.0),
    "T0.5-top-k4": dict(temperature=0.5, top_k=4),
    "T1.3-top-p0.5": dict(temperature=1.3, top_p=0.5),
    "greedy": dict(temperature=0.0),
}


def _blocks(seed: int, dtype=torch.float32):
    """Blocks [B, N+1, V] with the edge cases the rewrites rely on, drafts included."""
    g = torch.Generator().manual_seed(seed)
    B, N, V = 24, 3, 40
    target = 1.5 * torch.randn(B, N + 1, V, generator=g, dtype=torch.float64)
    draft = target + torch.randn(B, N + 1, V, generator=g, dtype=torch.float64)
    x = torch.multinomial(draft[:, :N].softmax(dim=-1).reshape(B * N, V), 1, generator=g).reshape(B, N)
    x[:8] = draft[:8, :N].argmax(dim=-1)  # likely drafts
    target[0:3, :, :] = -INF
    target[0:3, :, 5] = 0.0  # p one-hot on token 5 ...
    x[0:3] = 5  # ... and drafted: p(x) = 1 (cactus' rest = 0)
    target[3, :, 10:14] = 7.0  # ties at the top of p (top-k cut, amax)
    target[4, :, :] = 2.0  # a flat row: every token ties
    x[5:8] = target[5:8, :N].argmin(dim=-1)  # top-p-zeroed drafts (p(x) = 0 under top-p)
    draft[8:11, :N].scatter_(-1, x[8:11].unsqueeze(-1), -30.0)  # q(x) = 0 under the drafter's top-k / top-p
    draft[11, :, 20:] = -INF  # drafter logits of -inf (inside the verifier's support)
    draft[12, :, :] = 0.0
    draft[12, :, 7] = -INF  # one -inf drafter logit in the row
    target[13, :, 7] = -INF  # a token the verifier bans
    draft[14, :, :] = target[14, :, :]  # q = p
    return target.to(dtype), draft.to(dtype), x


@contextlib.contextmanager
def _torch_path():
    with fused.disabled():
        yield


def _equal(a, b):
    """The same bits on a CPU; on CUDA within float32 rounding (a reduction there, e.g. spec-casc-tok's η, may sum a
    row in another order when the tensor holds another number of rows: the shared work selects rows of a block)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a, b) if a.device.type == "cpu" else torch.allclose(a, b, rtol=1e-6, atol=1e-7)


def _fresh(ctx):
    """The block's positions with nothing computed yet (the reference reads none of what the rule computed)."""
    return dataclasses.replace(ctx, _drafts=None, _whole=None)


def _check(method, ctx, params):
    rule = RULES[method]
    accept_ref, residual_ref, bonus_ref = REFERENCES[method]
    residual_ref = residual_ref or rule.residual  # (a residual the rewrite left as it was)
    inputs = [t.clone() for t in (ctx.p, ctx.q, ctx.target_logits, ctx.draft_logits, ctx.draft_tokens)]
    drafts = ctx.drafts()
    got = rule.accept_prob(drafts, **params)
    want = accept_ref(_fresh(ctx).drafts(), **params)
    assert _equal(got, want), f"{method} {params}: accept_prob differs\n{got}\n{want}"
    B, N = ctx.draft_tokens.shape
    for i in range(N):  # one row per sequence, as the loop gathers it (B = 1 reads the row in place) ...
        want = residual_ref(_fresh(ctx).row(i), **params)
        got = rule.residual(ctx.row(i), **params)  # (... its row of the drafts' shared work)
        assert _equal(got, want), f"{method} {params}: residual at row {i} differs"
        got = rule.residual(_fresh(ctx).row(i), **params)  # (... computed on the row alone)
        assert _equal(got, want), f"{method} {params}: residual at row {i} (alone) differs"
    b = torch.arange(B, device=ctx.p.device)
    i = torch.randint(0, N, (B,), generator=torch.Generator().manual_seed(1)).to(ctx.p.device)
    assert _equal(rule.residual(ctx.rows(b, i), **params), residual_ref(_fresh(ctx).rows(b, i), **params))
    assert _equal(rule.residual(drafts, **params), residual_ref(_fresh(ctx).drafts(), **params))
    if bonus_ref is not None:  # read from the block's shared work, and computed alone
        assert _equal(rule.bonus(ctx, **params), bonus_ref(_fresh(ctx), **params)), f"{method} {params}: bonus"
        assert _equal(rule.bonus(_fresh(ctx), **params), bonus_ref(_fresh(ctx), **params))
    # the rule wrote into nothing it read (its in-place ops act on its own temporaries)
    for a, b in zip(inputs, (ctx.p, ctx.q, ctx.target_logits, ctx.draft_logits, ctx.draft_tokens)):
        assert torch.equal(a, b)
    for name in ("p_x", "q_x"):
        assert _equal(getattr(drafts, name), getattr(_fresh(ctx).drafts(), name))


@pytest.mark.parametrize("path", ["C", "torch"])
@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
@pytest.mark.parametrize("method", list(REFERENCES))
def test_rule_math_is_bit_identical_to_the_plain_formulas(method, sampling, path):
    with _torch_path() if path == "torch" else contextlib.nullcontext():
        for seed in range(3):
            target, draft, x = _blocks(seed)
            if method == "spec-cont-dec":
                ctx = build_context(target, draft, x, **sampling)
            else:
                ctx = build_context(target, draft[:, :-1], x, **sampling)
            for params in SETTINGS[method]:
                _check(method, ctx, RULES[method].validate(params))


@pytest.mark.parametrize("method", list(REFERENCES))
def test_rule_math_in_float64_and_at_batch_one(method):
    """Another dtype (torch ops only) and the engine's batch-1 shape (B = 1: the kernels' in-place rows)."""
    target, draft, x = _blocks(5, dtype=torch.float64)
    for b in (0, 3, 5, 8, 11, 15, None):
        sl = slice(None) if b is None else slice(b, b + 1)
        rows = draft[sl] if method == "spec-cont-dec" else draft[sl, :-1]
        for dtype in (torch.float64, torch.float32):
            ctx = build_context(target[sl].to(dtype), rows.to(dtype), x[sl], temperature=0.7, top_p=0.95)
            for params in SETTINGS[method]:
                _check(method, ctx, RULES[method].validate(params))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", list(REFERENCES))
def test_rule_math_on_cuda(method):
    """The same math on a CUDA device (torch ops there; the shared work selected by rows, one sync per target)."""
    for seed in range(2):
        target, draft, x = (t.to("cuda") for t in _blocks(seed))
        for sampling in SAMPLINGS.values():
            ctx = build_context(target, draft if method == "spec-cont-dec" else draft[:, :-1], x, **sampling)
            for params in SETTINGS[method]:
                _check(method, ctx, RULES[method].validate(params))


def test_the_edge_cases_are_present():
    """The blocks above reach the cases the rewrites handle apart (else the comparison proves little)."""
    target, draft, x = _blocks(0)
    ctx = build_context(target, draft[:, :-1], x, temperature=0.7, top_p=0.95)
    pos = ctx.drafts()
    assert (pos.p_x == 1).any() and (pos.p_x == 0).any() and (pos.q_x == 0).any()
    assert ((pos.p_x > 0) & (pos.p_x < 1) & (pos.q_x > 0)).sum() > 20
    # a tie at the k-th largest value of p with the draft on it
    kth = pos.p.topk(3, dim=-1).values[..., -1]
    assert ((pos.p == kth.unsqueeze(-1)).sum(dim=-1) > 1).any()
    assert ((pos.p_x == kth) & ((pos.p == kth.unsqueeze(-1)).sum(dim=-1) > 1)).any()
    # spec-cont-dec: a row with drafter logits of -inf inside the support, which the reference handles apart
    assert ((pos.p > 0) & torch.isneginf(pos.z_q)).any()


def test_spec_cont_dec_overflow_is_still_an_error():
    """The rewrite's one-pass finiteness check still raises where the plain check does, and only there."""
    target, draft, x = _blocks(1)
    rule = RULES["spec-cont-dec"]
    for scale, fails in ((1e36, True), (1.0, False)):
        big = scale * torch.rand(target.shape, generator=torch.Generator().manual_seed(2))
        ctx = build_context(big, draft, x, temperature=0.7)
        for beta in (1e3, 0.5):
            try:
                ref_contrastive_target(ctx.target_logits, ctx.draft_logits, ctx.p, beta, 0.7)
                ref_raises = False
            except ValueError:
                ref_raises = True
            assert ref_raises == (fails and beta == 1e3)
            if ref_raises:
                with pytest.raises(ValueError, match="overflow"):
                    rule.accept_prob(ctx.drafts(), beta=beta)
            else:
                assert _equal(rule.accept_prob(ctx.drafts(), beta=beta), REFERENCES["spec-cont-dec"][0](
                    ctx.drafts(), beta=beta))


def test_positions_share_work_down_the_block():
    """Positions.shared: computed once per key; the drafts select from the whole block, a row (or gathered rows) from
    the drafts; positions with nothing above them compute their own; keys apart stay apart."""
    target, draft, x = _blocks(2)
    ctx = build_context(target, draft, x, temperature=0.7)  # the drafter's N+1 rows
    B, N = x.shape
    calls = []

    def compute(pos):
        calls.append(pos)
        return pos.z_p * 2.0, pos.z_p + pos.z_q

    whole = ctx.whole()
    assert whole.z_p.shape[1] == N + 1
    drafts = ctx.drafts()
    a, b = drafts.shared("k", compute, whole_block=True)  # computed over every position, once
    assert calls == [whole] and a.shape == (B, N, 40)
    assert torch.equal(a, ctx.target_logits[:, :N] * 2.0)
    assert torch.equal(b, (ctx.target_logits + ctx.draft_logits)[:, :N])
    row = ctx.row(1)
    assert torch.equal(row.shared("k", compute)[0], ctx.target_logits[:, 1] * 2.0) and len(calls) == 1
    i = torch.randint(0, N, (B,), generator=torch.Generator().manual_seed(3))
    got = ctx.rows(torch.arange(B), i).shared("k", compute, whole_block=True)[1]
    assert torch.equal(got, (ctx.target_logits + ctx.draft_logits)[torch.arange(B), i]) and len(calls) == 1
    assert torch.equal(whole.shared("k", compute)[0][:, -1], ctx.target_logits[:, -1] * 2.0) and len(calls) == 1
    # another key: computed again, at the drafts (not the whole block) without whole_block
    drafts.shared("other", compute)
    assert len(calls) == 2 and calls[-1] is drafts
    # a row of a fresh block: nothing above it computed, so it computes its own (or the whole block, if asked)
    fresh = _fresh(ctx).row(2)
    assert torch.equal(fresh.shared("k", compute)[0], ctx.target_logits[:, 2] * 2.0) and calls[-1] is fresh
    fresh = _fresh(ctx)
    assert torch.equal(fresh.row(2).shared("k", compute, whole_block=True)[0], ctx.target_logits[:, 2] * 2.0)
    assert calls[-1] is fresh.whole() and len(calls) == 4

"""Peers' input conventions, written as the peers' own tests write them (docs/verify.md, "The verify step's input
contract"): SGLang's threshold settings 0 and its tie, vLLM's -1 placeholder drafts, transformers' all -inf row
after a draft the verifier rules out, and draft_probs rows that are not distributions. Each case runs on the C path
and on the torch path (the kernels set aside), which must agree."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from relaxspec.acceptance import RULES, fused, process_logits, relaxed_targets, verify
from relaxspec.acceptance.random import Draws
from relaxspec.acceptance.verify import VerifyStep

INF = math.inf
PATHS = ("c", "torch")


def on(path):
    """The C kernels (where they load) or the torch reference."""
    return contextlib.nullcontext() if path == "c" else fused.disabled()


def same(a, b):
    for name in ("num_accepted", "tokens", "accept_prob", "accepted", "last_token"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


class TableDraws(Draws):
    """Given acceptance uniforms [B, N] and token uniforms [B] (every offset): the verify loop's one-call path takes
    them (Draws.sample, token_uniforms), as the engine's counter draws."""

    def __init__(self, coins, final):
        self.coins, self.final = coins, final

    def uniform(self, purpose, width, dtype=torch.float32):
        return self.coins[:, :width].to(dtype)

    def uniform53(self, purpose, offset=0):
        return self.final

    def token_uniforms(self, width):
        return self.final[:, None].expand(-1, width + 1)


# ---------------------------------------------------------------- SGLang: thresholds 0, and the tie


def sglang_chains():
    """sgl-kernel's test_tree_speculative_sampling_target_only, its two requests' chains: target logits 1 with 10 at
    the token the verifier wants (18 where no other), temperature 0.01; request 0 drafts 1, 2 (the verifier wants 3
    first: p(1) = 0), request 1 drafts 11, 12 (both wanted)."""
    target = torch.full((2, 3, 20), 1.0)
    target[0, 0, 3] = 10.0
    target[1, 0, 11] = 10.0
    target[1, 1, 12] = 10.0
    for b in range(2):
        for j in range(3):
            if target[b, j].max() < 10:
                target[b, j, 18] = 10.0
    drafts = torch.tensor([[1, 2], [11, 12]])
    return target, torch.zeros(2, 2, 20), drafts  # (target only: the drafter's logits are never read)


@pytest.mark.parametrize("path", PATHS)
def test_threshold_takes_sglangs_zero_settings(path):
    # (0, 0): single = 0 accepts every draft, whatever p(x) (request 0's p(1) = 0 included); SGLang's expected
    # accept counts [2, 2] and predicts 1, 2, 18 / 11, 12, 18. acc = 0 alone is floored at 1e-9 (as the kernel's
    # launcher does): every draft with p(x) >= 1e-9 is accepted, p(x) = 0 still rejected.
    target, draft, drafts = sglang_chains()
    with on(path):
        res = verify("threshold", target, draft, drafts, temperature=0.01, single=0.0, acc=0.0,
                     generator=torch.Generator().manual_seed(0))
        assert res.num_accepted.tolist() == [2, 2]
        assert res.tokens.tolist() == [[1, 2, 18], [11, 12, 18]]
        acc0 = verify("threshold", target, draft, drafts, temperature=0.01, acc=0.0,
                      generator=torch.Generator().manual_seed(0))
        assert acc0.num_accepted.tolist() == [0, 2] and acc0.tokens[0, 0] == 3  # (p without 1: the wanted 3)
        assert acc0.tokens[1].tolist() == [11, 12, 18]
        ones = verify("threshold", target, draft, drafts, temperature=0.01,
                      generator=torch.Generator().manual_seed(0))  # (1, 1): the kernel test's other case
        assert ones.tokens.tolist() == acc0.tokens.tolist()
    # p(x) = 1e-9 exactly at the floor: accepted outright (ratio 1) at acc = 0; 1e-10 with probability 0.1
    for p_x, want in ((1e-9, 1.0), (1e-10, 0.1)):
        t = torch.tensor([[[math.log(p_x), math.log1p(-p_x)], [0.0, 0.0]]], dtype=torch.float64)
        a = relaxed_targets("threshold", t, torch.zeros(1, 1, 2, dtype=torch.float64), torch.tensor([[0]]), acc=0.0)
        assert float(a.accept_prob) == pytest.approx(want, rel=1e-9)


def test_threshold_zero_settings_are_in_its_range():
    spec = RULES["threshold"].params
    assert spec["single"].range_str() == "[0, 1]" == spec["acc"].range_str()
    assert not RULES["threshold"].trusts_q  # (single = 0 is off its grid: on the grid p(x) = 0 is never accepted)
    with pytest.raises(ValueError, match=r"rule 'threshold': parameter 'acc' must be in \[0, 1\], got -0.1"):
        verify("threshold", *sglang_chains(), acc=-0.1)


@pytest.mark.parametrize("path", PATHS)
def test_threshold_accepts_at_the_tie_as_sglangs_kernel(path):
    # sgl-kernel accepts on `coin <= prob_acc / threshold_acc`: a coin equal to p(x)/acc keeps the draft; strict
    # (u < p(x)/q(x), q one-hot on the draft) rejects it there. Each row's coin is exactly its ratio (float32, as the
    # loop compares); a coin one step above it rejects.
    g = torch.Generator().manual_seed(3)
    B, N, V = 6, 3, 7
    target = 2.0 * torch.randn(B, N + 1, V, generator=g)
    drafts = torch.randint(0, V, (B, N), generator=g)
    one_hot = torch.full((B, N, V), -INF).scatter(-1, drafts.unsqueeze(-1), 0.0)
    final = torch.rand(B, generator=g, dtype=torch.float64)
    for acc in (1.0, 0.5):
        with on(path):  # (p(x) as the path computes it: the tie is exact)
            p_x = process_logits(target[:, :N]).gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
            tie = (p_x / acc).clamp(max=0.999)  # (at 1 every coin is below)
            above = torch.nextafter(tie, torch.tensor(2.0))
            kept = verify("threshold", target, one_hot, drafts, random=TableDraws(tie, final), acc=acc)
            gone = verify("threshold", target, one_hot, drafts, random=TableDraws(above, final), acc=acc)
            strict = verify("strict", target, one_hot, drafts, random=TableDraws(p_x, final))
        assert kept.num_accepted.tolist() == [N] * B, acc
        assert gone.accepted[:, 0].tolist() == (p_x[:, 0] / acc >= 0.999).tolist(), acc
        assert (gone.num_accepted < N).any()
        assert strict.num_accepted.tolist() == [0] * B  # (strict rejects at u == p(x))
    # a draft the verifier rules out is never accepted by the ratio test, even at coin 0 (SGLang's coin <= 0 would)
    target[:, 0] = -INF
    target[torch.arange(B), 0, (drafts[:, 0] + 1) % V] = 0.0
    with on(path):
        res = verify("threshold", target, one_hot, drafts, random=TableDraws(torch.zeros(B, N), final), single=0.5)
    assert res.num_accepted.tolist() == [0] * B and res.accept_prob[:, 0].tolist() == [0.0] * B


def test_threshold_tie_kernel_equals_torch_on_the_one_call_path(monkeypatch):
    # The rule's C (one call: fused.verify_default with its kernel) and its torch math decide the ties alike.
    calls = []
    kernel = fused.verify_default
    monkeypatch.setattr(fused, "verify_default", lambda *a, **k: (calls.append(k.get("kernel")), kernel(*a, **k))[1])
    g = torch.Generator().manual_seed(4)
    B, N, V = 8, 3, 9
    target, draft = 2.0 * torch.randn(B, N + 1, V, generator=g), torch.randn(B, N, V, generator=g)
    drafts = torch.randint(0, V, (B, N), generator=g)
    p_x = process_logits(target[:, :N], temperature=0.8).gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    final = torch.rand(B, generator=g, dtype=torch.float64)
    for single, acc in ((1.0, 1.0), (0.2, 0.3), (0.0, 0.0), (1.0, 0.0)):
        step = VerifyStep("threshold", temperature=0.8, single=single, acc=acc)
        coins = (p_x / max(acc, 1e-9)).clamp(max=0.999)
        c = step(target, draft, drafts, random=TableDraws(coins, final))
        with fused.loop_disabled():
            ref = step(target, draft, drafts, random=TableDraws(coins, final))
        same(c, ref)
        assert c.num_accepted.tolist() == [N] * B
    assert len(calls) == 4 and all(k is not None for k in calls)


# ---------------------------------------------------------------- vLLM: -1 drafts pad a batch


def vllm_logits(output_tokens, V=100):
    """vLLM's create_logits_tensor: -100 everywhere, 100 at the token each position should produce."""
    logits = torch.full((len(output_tokens), max(map(len, output_tokens)), V), -100.0)
    for b, tokens in enumerate(output_tokens):
        for j, token in enumerate(tokens):
            logits[b, j, token] = 100.0
    return logits


@pytest.mark.parametrize("path", PATHS)
def test_placeholder_drafts_end_a_row(path):
    # vLLM's test_multiple_sequences / test_multiple_mismatches, padded with PLACEHOLDER_TOKEN_ID = -1 as its
    # [batch, max_spec_len] kernels take them: spec [[1, 2], [3]] -> [[1, 2, 5], [3, 4, -1]]; a row of -1 only
    # proposes nothing and emits the verifier's token; the output pads with -1 as vLLM's does.
    spec = torch.tensor([[1, 2], [3, -1], [-1, -1]])
    target = vllm_logits([[1, 2, 5], [3, 4], [7]])
    drafter = torch.zeros(3, 2, 100).scatter(-1, spec.clamp(min=0).unsqueeze(-1), 50.0)  # (ngram: one-hot drafts)
    with on(path):
        greedy = verify("strict", target, drafter, spec, temperature=0.0)
        assert greedy.tokens.tolist() == [[1, 2, 5], [3, 4, -1], [7, -1, -1]]
        assert greedy.num_accepted.tolist() == [2, 1, 0]
        # sampling, and the same rows as num_drafts says them: the same result, for every rule
        for method in RULES:
            kw = {"pivot_prob": torch.zeros(3, 2)} if method == "pad" else {}
            bonus = torch.cat([drafter, drafter[:, -1:]], 1) if RULES[method].extra_draft_passes else drafter
            a = verify(method, target, bonus, spec, temperature=0.7, generator=torch.Generator().manual_seed(1), **kw)
            b = verify(method, target, bonus, spec.clamp(min=0), temperature=0.7, num_drafts=torch.tensor([2, 1, 0]),
                       generator=torch.Generator().manual_seed(1), **kw)
            same(a, b)
            assert a.tokens[2, 1:].tolist() == [-1, -1] and a.num_accepted[2] == 0, method
            if path == "c":  # the loop's C and its torch ops decide alike on the padded block
                with fused.loop_disabled():
                    ref = verify(method, target, bonus, spec, temperature=0.7,
                                 generator=torch.Generator().manual_seed(1), **kw)
                assert torch.equal(a.tokens, ref.tokens) and torch.equal(a.num_accepted, ref.num_accepted), method
        # with num_drafts too: a row ends at whichever comes first
        c = verify("strict", target, drafter, spec, temperature=0.0, num_drafts=torch.tensor([1, 2, 2]))
        assert c.tokens.tolist() == [[1, 2, -1], [3, 4, -1], [7, -1, -1]]


def test_placeholder_contract_errors():
    target = vllm_logits([[1, 2, 5], [3, 4, 6]])
    drafter = torch.zeros(2, 2, 100)
    with pytest.raises(ValueError, match=r"^draft_tokens: a -1 \(no draft\) must be followed by -1 only in its row"):
        verify("strict", target, drafter, torch.tensor([[1, 2], [-1, 4]]))
    with pytest.raises(ValueError, match=r"^draft_tokens must lie in \[0, V\) = \[0, 100\), or be -1 \(no draft"):
        verify("strict", target, drafter, torch.tensor([[1, 2], [-2, -1]]))
    with pytest.raises(ValueError, match=r"^draft_tokens must lie in \[0, V\) = \[0, 100\)$"):  # dense: every row
        relaxed_targets("strict", target, drafter, torch.tensor([[1, 2], [3, -1]]))


# ---------------------------------------------------------------- transformers: an all -inf row nobody reads


def transformers_block(na_row):
    """transformers' UtilsFunctionsTest.test_speculative_sampling, its last ("N/A") row given: the drafter proposed
    1, 4, 5; the verifier accepts 1 and 4 and rules 5 out (every logit -inf but 8's), so its last row is never read."""
    lo, hi = -10.0, 10.0

    def row(at, fill=lo):
        r = torch.full((10,), fill)
        r[at] = hi
        return r
    draft = torch.stack([row(1), row(4), row(5)])[None]
    target = torch.stack([row(1), row(4), row(8, -INF), na_row])[None]
    return target, draft, torch.tensor([[1, 4, 5]])


@pytest.mark.parametrize("path", PATHS)
def test_an_all_inf_row_after_a_draft_rejected_for_sure_is_not_read(path):
    target, draft, drafts = transformers_block(torch.full((10,), -INF))
    with on(path):
        for seed in range(5):
            res = verify("strict", target, draft, drafts, generator=torch.Generator().manual_seed(seed))
            assert res.num_accepted.item() == 2 and res.tokens.tolist() == [[1, 4, 8, -1]]
        reference = verify("strict", *transformers_block(torch.full((10,), -10.0)))  # (the test's own N/A row)
        assert reference.tokens.tolist() == [[1, 4, 8, -1]]
        # A row that may be read is refused: the bonus row when the last draft may pass, a draft's own row.
        target2, draft2, drafts2 = transformers_block(torch.full((10,), -INF))
        target2[0, 2] = target2[0, 1]  # the third draft is no longer ruled out: p(5) > 0 (= q(5)'s order)
        target2[0, 2, 5] = 10.0
        with pytest.raises(ValueError, match=r"^target_logits has a row where every logit is -inf \(\[0, 3\]\) "
                                             r"that the verify step may read"):
            verify("strict", target2, draft2, drafts2)
        draft3 = draft.clone()
        draft3[0, 2] = -INF
        with pytest.raises(ValueError, match=r"^draft_logits has a row where every logit is -inf \(\[0, 2\]\)"):
            verify("strict", target, draft3, drafts)
        # Past a row's last draft (num_drafts / -1) both rows are free; dense targets read every row.
        free = verify("strict", target, draft3, torch.tensor([[1, 4, -1]]))
        assert free.tokens.tolist() == [[1, 4, 8, -1]]
    with pytest.raises(ValueError, match=r"^target_logits has a row where every logit is -inf \(no token left"):
        relaxed_targets("strict", target, draft, drafts)


def test_an_all_inf_bonus_row_of_the_drafter_is_read_only_by_a_rule_that_reads_it():
    target, draft, drafts = transformers_block(torch.full((10,), -10.0))
    with_bonus = torch.cat([draft, torch.full((1, 1, 10), -INF)], 1)  # the drafter's bonus-position row
    target[0, 2, 5] = 10.0  # every draft may pass: the bonus position is reachable
    assert verify("cactus", target, with_bonus, drafts).num_accepted.shape == (1,)
    with pytest.raises(ValueError, match=r"^draft_logits has a row where every logit is -inf \(\[0, 3\]\)"):
        verify("spec-cont-dec", target, with_bonus, drafts)


# ---------------------------------------------------------------- draft_probs: distributions only


@pytest.mark.parametrize("path", PATHS)
def test_draft_probs_must_sum_to_one(path):
    # vLLM's test_deterministic_when_seeded makes draft_probs = softmax(rand): accepted (V = 1000, and a Qwen-sized
    # vocabulary in float32 and in bfloat16); torch.rand rows without the softmax are refused, naming the row.
    g = torch.Generator().manual_seed(5)
    B, k, V = 4, 3, 1000
    target = torch.rand(B, k + 1, V, generator=g)
    drafts = torch.randint(0, V, (B, k), generator=g)
    probs = torch.rand(B, k, V, generator=g).softmax(-1)
    with on(path):
        verify("strict", target, probs.log(), drafts, draft_probs=probs)
        raw = torch.rand(B, k, V, generator=g)
        with pytest.raises(ValueError, match=r"^draft_probs must be distributions: row \[0, 0\] sums to \d+\.?\d*, "
                                             r"not 1 \(within 0.001\); pass the drafter's processed probabilities"):
            verify("strict", target, probs.log(), drafts, draft_probs=raw)
        cut = probs.clone()
        cut[2, 1, :100] = 0.0  # a top-k cut without renormalising: ~10% of the mass gone
        with pytest.raises(ValueError, match=r"row \[2, 1\] sums to 0\.[89]\d"):
            verify("strict", target, probs.log(), drafts, draft_probs=cut)
        # a padding row (past num_drafts or a -1) is never read: zeros there are fine
        padded = probs.clone()
        padded[1, 2] = 0.0
        verify("strict", target, probs.log(), drafts, draft_probs=padded, num_drafts=torch.tensor([3, 2, 3, 3]))
        verify("strict", target, probs.log(), torch.cat([drafts[:, :2], torch.tensor([[5], [-1], [5], [5]])], 1),
               draft_probs=padded)
        with pytest.raises(ValueError, match=r"row \[1, 2\] sums to 0,"):
            verify("strict", target, probs.log(), drafts, draft_probs=padded)
    big = torch.randn(1, 2, 151_936, generator=g) * 4
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = big[:, :1].softmax(-1).to(dtype)
        verify("strict", big, big[:, :1], q.float().argmax(-1), draft_probs=q)

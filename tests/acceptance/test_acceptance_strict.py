"""Strict speculative sampling is lossless: Monte Carlo against the processed p."""

import pytest
import torch

from relaxspec.acceptance import process_logits, relaxed_targets, verify
from helpers import SAMPLINGS, assert_law, random_block, run_mc

M = 200_000


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_emitted_token_law_equals_p_at_every_position(sampling):
    target, draft = random_block(seed=1, B=1, N=3, V=8)
    res = run_mc("strict", target[0], draft[0], M, sampling, seed=2)
    p = process_logits(target[0].double(), **sampling)
    assert 0.2 < res.accepted.double().mean() < 0.95  # both branches are exercised
    for k in range(4):  # positions 1..3 (accepted draft or residual) and the bonus
        reached = res.num_accepted >= k
        assert_law(res.tokens[reached, k], p[k], f"strict position {k + 1}")


def test_bonus_law_given_all_accepted():
    target, draft = random_block(seed=3, B=1, N=1, V=6)
    sampling = SAMPLINGS["t07_k5_p09"]
    res = run_mc("strict", target[0], draft[0], M, sampling, seed=4)
    p = process_logits(target[0], **sampling)
    all_acc = res.num_accepted == 1
    assert_law(res.tokens[all_acc, 1], p[1], "strict bonus")


def test_tokens_layout():
    target, draft = random_block(seed=5, B=2000, N=4, V=10)
    x = torch.randint(0, 10, (2000, 4), generator=torch.Generator().manual_seed(0))
    res = verify("strict", target, draft, x, generator=torch.Generator().manual_seed(1))
    n = res.num_accepted
    assert res.tokens.dtype == torch.long and res.tokens.shape == (2000, 5)
    for b in range(0, 2000, 97):
        k = int(n[b])
        assert torch.equal(res.tokens[b, :k], x[b, :k])
        assert 0 <= res.tokens[b, k] < 10
        assert (res.tokens[b, k + 1:] == -1).all()
        assert res.accepted[b, :k].all() and (k == 4 or not res.accepted[b, k])
    assert not res.relaxed_only.any()
    assert torch.equal(res.accept_prob, res.strict_accept_prob)


def test_greedy_accepts_exactly_the_verifier_argmax_matches():
    B, N, V = 4000, 4, 5
    g = torch.Generator().manual_seed(7)
    target = torch.randn(B, N + 1, V, generator=g)
    argmax_p = target.argmax(-1)
    # Drafts match the verifier argmax most of the time, so long prefixes occur; each draft is
    # the drafter's argmax (as greedy drafting makes it).
    x = torch.where(torch.rand(B, N, generator=g) < 0.7, argmax_p[:, :N], torch.randint(0, V, (B, N), generator=g))
    draft = torch.randn(B, N, V, generator=g) + 10.0 * torch.nn.functional.one_hot(x, V)
    res = verify("strict", target, draft, x, temperature=0.0, generator=g)
    match = x == argmax_p[:, :N]
    assert torch.equal(res.accepted, match)
    # A draft the greedy drafter could not have made (q(x) = 0) is rejected, even on the verifier's argmax.
    other = verify("strict", target, draft - 20.0 * torch.nn.functional.one_hot(x, V), x, temperature=0.0)
    assert not other.accepted.any() and (other.num_accepted == 0).all()
    first_miss = torch.where((~match).any(1), (~match).int().argmax(1), N)
    assert torch.equal(res.num_accepted, first_miss)
    # The token after the kept prefix is the verifier's argmax there (residual or bonus).
    assert torch.equal(res.tokens.gather(1, first_miss[:, None])[:, 0], argmax_p.gather(1, first_miss[:, None])[:, 0])
    assert (first_miss == N).any() and (first_miss == 0).any()



def test_greedy_closed_form_matches_the_shared_loop():
    # verify("strict", T=0) takes a closed form; rules at their strict setting go through the shared
    # loop. Integer logits make ties common, drafts are arbitrary (often not the drafter's argmax).
    B, N, V = 3000, 4, 6
    g = torch.Generator().manual_seed(11)
    target = torch.randint(0, 3, (B, N + 1, V), generator=g).float()
    draft = torch.randint(0, 3, (B, N, V), generator=g).float()
    best = target.argmax(-1)[:, :N]
    x = torch.where(torch.rand(B, N, generator=g) < 0.6, best, torch.randint(0, V, (B, N), generator=g))
    fast = verify("strict", target, draft, x, temperature=0.0)
    for method, params in (("cactus", dict(delta=0.0)), ("mentored", dict(alpha=0.0))):
        loop = verify(method, target, draft, x, temperature=0.0, generator=torch.Generator().manual_seed(0), **params)
        assert torch.equal(fast.tokens, loop.tokens), method
        assert torch.equal(fast.num_accepted, loop.num_accepted)
        assert torch.equal(fast.accept_prob, loop.accept_prob) and torch.equal(fast.accepted, loop.accepted)
    assert len(set(fast.num_accepted.tolist())) == N + 1  # every prefix length occurs

def test_zero_mass_residual_falls_back_to_p():
    # Greedy: draft 2 is neither argmax; q = p (both one-hot on 0) so (p - q)+ = 0.
    target = torch.tensor([[[5.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    draft = torch.tensor([[[5.0, 1.0, 0.0]]])
    x = torch.tensor([[2]])
    res = verify("strict", target, draft, x, temperature=0.0)
    assert res.num_accepted.item() == 0 and res.tokens.tolist() == [[0, -1]]
    tg = relaxed_targets("strict", target, target[:, :1], torch.tensor([[0]]))
    assert torch.allclose(tg.residual[0, 0], torch.softmax(target[0, 0], -1))


def test_reproducible_with_seeded_generator():
    target, draft = random_block(seed=9, B=512, N=5, V=50, bonus_draft=True)
    x = torch.randint(0, 50, (512, 5), generator=torch.Generator().manual_seed(0))
    for method in ("strict", "cactus", "spec-cont-dec"):
        a = verify(method, target, draft, x, generator=torch.Generator().manual_seed(123))
        b = verify(method, target, draft, x, generator=torch.Generator().manual_seed(123))
        c = verify(method, target, draft, x, generator=torch.Generator().manual_seed(124))
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accepted, b.accepted)
        assert not torch.equal(a.tokens, c.tokens)

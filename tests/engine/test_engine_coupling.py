"""Per-sequence random streams (docs/design.md, "Coupled randomness"): batch invariance, coupling of
methods, per-request seeds, and tensors that follow the models' device."""

import numpy as np
import pytest
import torch

from relaxspec.acceptance import SequenceSeeds, derive_seed
from relaxspec.acceptance.random import ACCEPT, DRAFT, TOKEN
from relaxspec.engine import generate
from relaxspec.models import load_model
from helpers import task_prompts

SAMPLING = dict(temperature=0.7, top_p=0.9, max_new_tokens=40)


def _mixed_batch():
    # 8 prompts of different lengths (two tasks), so the batch is left-padded and ragged.
    return task_prompts(5) + task_prompts(3, "sorting")


@pytest.mark.parametrize("method", ["ar", "strict"])
def test_output_is_batch_invariant(builtin_pair, method):
    """A prompt's sampled output with a given per-request seed is the same alone, in a batch of 8
    mixed-length prompts, and at another position of that batch. We rely on the batched logits
    equalling the lone ones to ~1e-4 (test_left_padded_batch_gives_each_row_its_own_logits): a token
    could only change if a uniform fell within that distance of a CDF boundary."""
    verifier, drafter = builtin_pair
    drafter = None if method == "ar" else drafter
    prompts = _mixed_batch()
    seeds = [derive_seed(7, i) for i in range(len(prompts))]
    batch = generate(verifier, drafter, prompts, method=method, draft_length=4, seed=seeds, **SAMPLING)
    order = [3, 7, 0, 5, 1, 6, 2, 4]  # every prompt at another position
    shuffled = generate(verifier, drafter, [prompts[i] for i in order], method=method, draft_length=4,
                        seed=[seeds[i] for i in order], **SAMPLING)
    for j, i in enumerate(order):
        assert shuffled.results[j].token_ids == batch.results[i].token_ids, i
    for i in (0, 6):
        alone = generate(verifier, drafter, [prompts[i]], method=method, draft_length=4, seed=[seeds[i]], **SAMPLING)
        assert alone.results[0].token_ids == batch.results[i].token_ids, i
    # Sampling really happened: another seed gives other outputs.
    other = generate(verifier, drafter, prompts, method=method, draft_length=4, seed=123, **SAMPLING)
    assert sum(a.token_ids != b.token_ids for a, b in zip(other.results, batch.results)) >= 4


def test_int_seed_is_one_derived_seed_per_prompt(builtin_pair):
    verifier, _ = builtin_pair
    prompts = task_prompts(3)
    a = generate(verifier, None, prompts, method="ar", seed=11, **SAMPLING)
    b = generate(verifier, None, prompts, method="ar", seed=[derive_seed(11, i) for i in range(3)], **SAMPLING)
    assert [r.token_ids for r in a.results] == [r.token_ids for r in b.results]
    assert [r.seed for r in a.results] == [derive_seed(11, i) for i in range(3)]
    with pytest.raises(ValueError, match="2 per-prompt seeds for 3 prompts"):
        generate(verifier, None, prompts, method="ar", seed=[1, 2], **SAMPLING)
    with pytest.raises(ValueError, match="seed must be an integer"):
        generate(verifier, None, prompts, method="ar", seed="x", **SAMPLING)
    with pytest.raises(ValueError, match=r"\[0, 2\^63\)"):
        generate(verifier, None, prompts, method="ar", seed=[-1, 2, 3], **SAMPLING)


@pytest.mark.parametrize("method, params", [("cactus", {"delta": 0.0}), ("mentored", {"alpha": 0.0}),
                                            ("pad", {"threshold": 0.0})])
def test_rules_at_their_strict_setting_equal_strict_token_for_token(builtin_pair, method, params):
    verifier, drafter = builtin_pair
    prompts = _mixed_batch()
    strict = generate(verifier, drafter, prompts, method="strict", draft_length=3, seed=5, **SAMPLING)
    pivot_fn = None
    if method == "pad":
        def pivot_fn(hidden, target_logits, draft_logits, draft_tokens):  # a classifier that calls nothing pivotal
            return torch.zeros(draft_tokens.shape, device=draft_tokens.device)
    other = generate(verifier, drafter, prompts, method=method, draft_length=3, seed=5, pivot_fn=pivot_fn,
                     **SAMPLING, **params)
    assert [r.token_ids for r in other.results] == [r.token_ids for r in strict.results]


def test_a_mild_relaxation_is_coupled_to_strict(builtin_pair):
    """Same seeds: cactus(delta=0.1) emits strict's tokens until its first relaxed acceptance, so
    many whole outputs are identical (measured 50% on these 40 prompts, 160 tokens, N=5); with
    independent seeds none are (measured 0%)."""
    verifier, drafter = builtin_pair
    prompts = task_prompts(40)
    kw = dict(draft_length=5, max_new_tokens=160, temperature=0.7, top_p=0.95)
    strict = generate(verifier, drafter, prompts, method="strict", seed=0, **kw)
    mild = generate(verifier, drafter, prompts, method="cactus", delta=0.1, seed=0, **kw)
    independent = generate(verifier, drafter, prompts, method="strict", seed=1, **kw)

    def identical(a, b):
        return sum(x.token_ids == y.token_ids for x, y in zip(a.results, b.results)) / len(prompts)

    assert identical(mild, strict) >= 0.3
    assert identical(independent, strict) <= 0.05

    # Where outputs differ, the coupled pair still agrees up to its first differing decision, so its
    # common prefix is far longer than an independent pair's.
    def mean_common_prefix(a, b):
        lengths = [next(i for i, (s, t) in enumerate(zip(x.token_ids + [-1], y.token_ids + [-2])) if s != t)
                   for x, y in zip(a.results, b.results) if x.token_ids != y.token_ids]
        return sum(lengths) / len(lengths)

    assert mean_common_prefix(mild, strict) > 3 * mean_common_prefix(independent, strict)


def test_counter_draws_are_keyed_by_seed_position_and_purpose():
    seeds = SequenceSeeds([derive_seed(1), derive_seed(2), derive_seed(1)], torch.device("cpu"))
    u = seeds.at(torch.tensor([0, 0, 3])).uniform(ACCEPT, 5)
    assert torch.equal(u[0, 3:], u[2, :2])  # same seed, same absolute positions
    assert not torch.equal(u[0], u[1])
    at_zero = seeds.at(torch.tensor([0, 0, 0]))
    assert not torch.equal(at_zero.uniform(ACCEPT, 4), at_zero.uniform(DRAFT, 4))
    assert ((u >= 0) & (u < 1)).all()
    # Uniform on [0, 1): Kolmogorov-Smirnov distance of 20000 draws (5/sqrt(n) bound, far beyond the 1.36 at 95%).
    many = SequenceSeeds(list(range(2000)), torch.device("cpu")).at(torch.zeros(2000, dtype=torch.long))
    sample = many.uniform(TOKEN, 10).flatten().double().sort().values
    n = sample.numel()
    ks = (sample - torch.arange(1, n + 1, dtype=torch.float64) / n).abs().max()
    assert ks < 5 / n ** 0.5
    # Inverse-CDF sampling follows the weights (Monte Carlo, 5 sigma).
    weights = torch.tensor([0.1, 0.0, 0.6, 0.3]).expand(2000, 4)
    picks = torch.cat([many.sample(weights, TOKEN, offset=k) for k in range(5)])
    freq = torch.bincount(picks, minlength=4).double() / picks.numel()
    expected = torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64)
    assert ((freq - expected).abs() <= 5 * (expected * (1 - expected) / picks.numel()).sqrt() + 1e-12).all()


def test_every_engine_tensor_follows_the_models_device():
    """With torch's default device set to `meta`, any tensor the engine or a rule creates without
    naming the models' device would be a meta tensor, and mixing it with the CPU tensors fails (or
    `.tolist()` does): same outputs as without the default, for AR, strict and a relaxed rule with
    sampling (greedy and sampled paths, rollback, row removal)."""
    # The transformers backend, so that this checks engine/ and acceptance/ (FastLlama has its own test).
    verifier, drafter = load_model("verifier", backend="transformers"), load_model("drafter-weak", backend="transformers")
    prompts = _mixed_batch()[:4]
    runs = [dict(method="ar"), dict(method="strict", temperature=0.0), dict(method="strict"),
            dict(method="cactus", delta=0.3), dict(method="spec-cont-dec", beta=0.5)]
    for kw in runs:
        kw = {**SAMPLING, "max_new_tokens": 20, "draft_length": 3, **kw}
        d = None if kw["method"] == "ar" else drafter
        expected = generate(verifier, d, prompts, seed=2, **kw)
        with torch.device("meta"):
            got = generate(verifier, d, prompts, seed=2, **kw)
        assert [r.token_ids for r in got.results] == [r.token_ids for r in expected.results], kw


def test_round_draws_equal_the_scalar_definition_of_the_streams():
    """A round's draws, computed for every row, position and purpose in one vectorised hash, are bit for
    bit the reference `stream_bits` (plain Python ints), and so are the draws computed on demand."""
    from relaxspec.acceptance.random import stream_bits

    seeds = [0, 1, derive_seed(3), (1 << 63) - 1, 0xFFFFFFFF, 1 << 32]
    starts = [0, 5, 17, 1 << 31, (1 << 32) - 3, 123456]
    width = 4
    table = SequenceSeeds(seeds, torch.device("cpu")).at(torch.tensor(starts), width)
    lazy = SequenceSeeds(seeds, torch.device("cpu")).at(torch.tensor(starts))
    # the round's hash on the host (numpy, as the engine runs it), and after rows left the batch
    host = SequenceSeeds(seeds, torch.device("cpu")).at(torch.tensor(starts), width, host_start=np.array(starts))
    kept = SequenceSeeds([7, *seeds], torch.device("cpu"))
    kept.select(torch.arange(1, len(seeds) + 1))
    host_kept = kept.at(torch.tensor(starts), width, host_start=np.array(starts))
    host_only = SequenceSeeds(seeds, torch.device("cpu")).at(None, width, host_start=np.array(starts))  # as the engine

    def u24(s, purpose, pos):
        return (stream_bits(s, purpose, 0, pos) >> 8) / (1 << 24)

    def u53(s, purpose, pos):
        return ((stream_bits(s, purpose, 1, pos) >> 5) * (1 << 26) + (stream_bits(s, purpose, 2, pos) >> 6)) / (1 << 53)

    for draws in (table, lazy, host, host_kept, host_only):
        accept = draws.uniform(ACCEPT, width)
        assert accept.tolist() == [[u24(s, ACCEPT, t + i) for i in range(width)] for s, t in zip(seeds, starts)]
        for purpose, offsets in ((DRAFT, range(width)), (TOKEN, range(width + 1))):
            for i in offsets:
                assert draws.uniform53(purpose, i).tolist() == [u53(s, purpose, t + i) for s, t in zip(seeds, starts)]
        per_row = torch.tensor([0, 4, 2, 1, 3, 4])  # verify's residual / bonus draw at start + n per row
        assert draws.uniform53(TOKEN, per_row).tolist() == [u53(s, TOKEN, t + int(n))
                                                            for s, t, n in zip(seeds, starts, per_row)]
        # draws outside the round's table are computed on demand (the start positions copied then)
        assert draws.uniform53(DRAFT, width + 2).tolist() == [u53(s, DRAFT, t + width + 2)
                                                              for s, t in zip(seeds, starts)]
        assert draws.uniform(ACCEPT, width + 1).tolist() == [[u24(s, ACCEPT, t + i) for i in range(width + 1)]
                                                             for s, t in zip(seeds, starts)]


def test_streams_keep_64_bits_between_sequences():
    """Two seeds whose (seed, purpose) reduced to the same 32-bit state under the former streams (which
    hashed seed and purpose to 32 bits before mixing in the position, so they shared every draw) have
    different streams now; so do seeds that agree in their low or high 32 bits."""
    from relaxspec.acceptance.random import stream_bits

    def old_hash(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    c = (ACCEPT * 0x9E3779B9) & 0xFFFFFFFF  # the former key word of ACCEPT
    low1, high1 = 12345, 678
    for low2 in range(1, 100):  # the first partner whose high half fits a 63-bit seed
        high2 = old_hash(low1 ^ c) ^ high1 ^ old_hash(low2 ^ c)
        if high2 < 1 << 31:
            break
    seed1, seed2 = (high1 << 32) | low1, (high2 << 32) | low2
    assert old_hash(old_hash(low1 ^ c) ^ high1) == old_hash(old_hash(low2 ^ c) ^ high2)  # collided before
    for a, b in [(seed1, seed2), (5, 5 | (1 << 40)), (7 << 32, (7 << 32) | 9)]:
        same = sum(stream_bits(a, ACCEPT, 0, t) == stream_bits(b, ACCEPT, 0, t) for t in range(64))
        assert same <= 1, (a, b)


@pytest.mark.parametrize("method, n", [("strict", 5), ("typical", 4)])
def test_batch_invariant_at_the_length_limit(builtin_pair, method, n):
    """Rows with different room left draft at most their own room minus one, so a prompt's output with its
    seed is the same alone and in a batch of 8 even when it stops at max_new_tokens."""
    verifier, drafter = builtin_pair
    prompts = _mixed_batch()
    seeds = [derive_seed(1, i) for i in range(len(prompts))]  # with these, strict's rows 0 and 5 differed before
    kw = dict(method=method, draft_length=n, temperature=0.7, max_new_tokens=11)
    batch = generate(verifier, drafter, prompts, seed=seeds, **kw)
    assert sum(len(r.token_ids) == 11 for r in batch.results) >= 4  # most hit the limit
    # Rounds near the limit were ragged: some rows proposed fewer drafts than others in the same block.
    assert any(len(rd.drafts) < n for r in batch.results for rd in r.trace)
    for i, prompt in enumerate(prompts):
        alone = generate(verifier, drafter, [prompt], seed=[seeds[i]], **kw)
        assert alone.results[0].token_ids == batch.results[i].token_ids, i
        assert [len(rd.drafts) for rd in alone.results[0].trace] == [len(rd.drafts) for rd in batch.results[i].trace]


def test_a_rule_that_draws_at_greedy_draws_from_the_rows_streams(builtin_pair):
    """At T=0 ensemble keeps a non-argmax draft with probability 1-w: its uniforms come from each row's seeded
    stream, so the output is a function of the seed (not of torch's global generator) and batch invariant."""
    from relaxspec.acceptance.verify import VerifyStep
    assert VerifyStep("ensemble", temperature=0.0, weight=0.5).draws
    assert not VerifyStep("strict", temperature=0.0).draws and not VerifyStep("cactus", temperature=0.0).draws
    verifier, drafter = builtin_pair
    prompts = _mixed_batch()
    kw = dict(method="ensemble", weight=0.5, draft_length=3, temperature=0.0, max_new_tokens=24)
    outs = []
    for global_seed, seed in ((1, 7), (2, 7), (3, 8)):
        torch.manual_seed(global_seed)
        outs.append([r.token_ids for r in generate(verifier, drafter, prompts, seed=seed, **kw).results])
    assert outs[0] == outs[1]  # the global generator plays no part
    assert outs[0] != outs[2]  # the seed does
    alone = [generate(verifier, drafter, [p], seed=[derive_seed(7, i)], **kw).results[0].token_ids
             for i, p in enumerate(prompts[:3])]
    assert alone == outs[0][:3]

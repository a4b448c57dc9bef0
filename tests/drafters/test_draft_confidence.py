"""draft_confidence: a sequence stops drafting after a draft its drafter gave probability below t (the draft is
still proposed; transformers' ConfidenceCriteria), ragged across the rows of a batch, with fixed N and with
draft_length="auto"."""

import pytest
import torch

from relaxspec.cli import main
from relaxspec.drafters import LMDrafter, load_drafter
from relaxspec.engine import generate
from relaxspec.models.prompts import encode_prompts
from helpers import SHORT_PROMPTS, task_prompts, token_freq


def _mixed_prompts():
    return task_prompts(3) + task_prompts(2, "sorting")  # different lengths: a ragged batch


@pytest.mark.parametrize("name", ["lm", "drafter-mtp", "ngram:n=3"])
def test_greedy_strict_with_a_confidence_stop_equals_ar(builtin_pair, name):
    verifier, drafter_lm = builtin_pair
    drafter = LMDrafter(drafter_lm) if name == "lm" else load_drafter(name, verifier)
    prompts = _mixed_prompts()
    ar = generate(verifier, None, prompts, method="ar", max_new_tokens=40)
    for draft_length in (4, "auto"):
        full = generate(verifier, drafter, prompts, method="strict", draft_length=draft_length, max_new_tokens=40)
        for t in (0.3, 0.9):
            sd = generate(verifier, drafter, prompts, method="strict", draft_length=draft_length, max_new_tokens=40,
                          draft_confidence=t)
            assert [r.token_ids for r in sd.results] == [r.token_ids for r in ar.results], (draft_length, t)
            if name.startswith("ngram"):  # one-hot q: confidence 1, the stop never fires
                assert sd.stats.drafts_proposed == full.stats.drafts_proposed
                assert [r.trace for r in sd.results] == [r.trace for r in full.results]
            elif t == 0.9:
                assert sd.stats.drafts_proposed < full.stats.drafts_proposed


def test_drafts_shorten_as_the_threshold_rises(builtin_pair):
    verifier, drafter = builtin_pair
    prompts = _mixed_prompts()
    proposed, total, drafter_forwards = [], [], []
    for t in (None, 0.2, 0.5, 0.8, 0.99):
        out = generate(verifier, drafter, prompts, method="strict", draft_length=6, max_new_tokens=50,
                       draft_confidence=t)
        total.append(out.stats.drafts_proposed)
        proposed.append(out.stats.drafts_proposed / out.stats.sequence_rounds)
        drafter_forwards.append(out.stats.drafter_forwards / out.stats.verifier_forwards)
    assert all(a > b for a, b in zip(total, total[1:])), total
    assert all(a >= b for a, b in zip(proposed, proposed[1:])), proposed
    assert proposed[0] > 5.5 and proposed[-1] < 0.5 * proposed[0], proposed
    # The drafter loop ends once every row has stopped: fewer drafter forwards per round.
    assert drafter_forwards[-1] < 0.6 * drafter_forwards[0], drafter_forwards


def _draft_probs(lm, context: list[int], drafts: list[int]) -> list[float]:
    """The drafter's greedy q (softmax of its logits) of each draft after `context`, recomputed from scratch."""
    ids = torch.tensor([context + drafts])
    logits, _ = lm.forward(ids, lm.new_cache(), torch.ones_like(ids), torch.arange(ids.shape[1])[None])
    probs = torch.softmax(logits[0].float(), dim=-1)
    start = len(context) - 1
    return [float(probs[start + i, d]) for i, d in enumerate(drafts)]


@pytest.mark.parametrize("draft_length", [5, "auto"])
def test_each_round_stops_after_the_first_draft_below_the_threshold(builtin_pair, draft_length):
    """Checked by hand, round by round: a row drafts up to its limit (N, or the +2/-1 schedule counted on the
    drafts actually proposed) and stops right after the first draft whose recomputed q is below t."""
    from relaxspec.engine.generate import AUTO_MAX, AUTO_START

    verifier, drafter = builtin_pair
    t, max_new = 0.6, 40
    prompts = _mixed_prompts()
    out = generate(verifier, drafter, prompts, method="strict", draft_length=draft_length, max_new_tokens=max_new,
                   draft_confidence=t)
    encoded = encode_prompts(verifier.tokenizer, prompts)
    stopped_early = 0
    for r, prompt_ids in zip(out.results, encoded):
        produced, limit = 0, AUTO_START if draft_length == "auto" else draft_length
        for rd in r.trace:
            room = max_new - produced - 1
            allowed = min(limit, room)
            probs = _draft_probs(drafter, list(prompt_ids) + r.token_ids[:produced], rd.drafts)
            # (a margin for the recomputation's rounding)
            assert 0 < len(rd.drafts) <= allowed or len(rd.drafts) == allowed == 0
            assert all(p >= t - 1e-4 for p in probs[:-1]), (probs, allowed)
            assert len(rd.drafts) == allowed or probs[-1] < t + 1e-4, (probs, allowed)
            stopped_early += len(rd.drafts) < allowed
            if draft_length == "auto":
                full = rd.num_accepted == len(rd.drafts)
                limit = min(AUTO_MAX, max(1, limit + (2 if full else -1)))
            produced += rd.tokens
    assert stopped_early >= 5  # the stop really fired, in several rounds


@pytest.mark.parametrize("name", ["lm", "drafter-mtp"])
def test_sampled_output_with_a_confidence_stop_is_batch_invariant(builtin_pair, name):
    verifier, drafter_lm = builtin_pair
    drafter = LMDrafter(drafter_lm) if name == "lm" else load_drafter(name, verifier)
    prompts = _mixed_prompts()
    kw = dict(method="strict", draft_length="auto", temperature=0.7, top_p=0.9, max_new_tokens=30, draft_confidence=0.5)
    batch = generate(verifier, drafter, prompts, seed=[21, 22, 23, 24, 25], **kw)
    for i in (1, 4):
        alone = generate(verifier, drafter, prompts[i:i + 1], seed=[21 + i], **kw)
        assert alone.results[0].token_ids == batch.results[i].token_ids
        assert alone.results[0].trace == batch.results[i].trace


def test_sampled_strict_with_a_confidence_stop_follows_ar_sampling(builtin_pair):
    """Lossless: at each checked position every token's frequency under strict (fixed N and auto, both with the
    stop) agrees with AR sampling within 5 sigma of a two-sample comparison (n samples per side, fixed seeds)."""
    verifier, drafter = builtin_pair
    n, prompts = 400, list(SHORT_PROMPTS)
    sampling = dict(temperature=0.7, top_p=0.9, max_new_tokens=16)
    ar = generate(verifier, None, prompts * n, method="ar", seed=5, **sampling)
    for draft_length in (4, "auto"):
        sd = generate(verifier, drafter, prompts * n, method="strict", draft_length=draft_length, seed=4,
                      draft_confidence=0.5, **sampling)
        full = generate(verifier, drafter, prompts[:1] * 50, method="strict", draft_length=draft_length, seed=4,
                        **sampling)
        # the stop fired: fewer drafts per round than without it
        assert sd.stats.drafts_proposed / sd.stats.sequence_rounds < \
            0.8 * full.stats.drafts_proposed / full.stats.sequence_rounds
        spread = []
        for k in range(len(prompts)):
            for position in (3, 8, 15):
                a = token_freq([r.token_ids[position] for r in sd.results[k::len(prompts)]], verifier.vocab_size)
                b = token_freq([r.token_ids[position] for r in ar.results[k::len(prompts)]], verifier.vocab_size)
                pooled = (a + b) / 2
                assert ((a - b).abs() <= 5 * torch.sqrt(pooled * (1 - pooled) * 2 / n) + 2e-3).all(), (k, position)
                spread.append(float(pooled.max()))
        assert min(spread) < 0.6  # not a deterministic position: the comparison has teeth


def test_bad_draft_confidence_is_a_one_line_error(builtin_pair, capsys):
    verifier, drafter = builtin_pair
    for bad in (0, 1.5, -0.1, True, "high"):
        with pytest.raises(ValueError, match="draft_confidence"):
            generate(verifier, drafter, ["x"], method="strict", draft_confidence=bad)
    with pytest.raises(ValueError, match="draft_confidence"):
        generate(verifier, None, ["x"], method="ar", draft_confidence=0.5)
    for args in (["--draft-confidence", "2"], ["--method", "ar", "--draft-confidence", "0.5"]):
        assert main(["generate", "--prompt", "x", *args]) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "confidence" in err, err


def test_generate_cli_takes_auto_with_a_confidence_stop(capsys):
    import json

    prompt = task_prompts(1)[0]
    runs = {}
    for extra in ([], ["--draft-confidence", "0.9"]):
        assert main(["generate", "--prompt", prompt, "--draft-length", "auto", "--max-new-tokens", "40", "--json",
                     *extra]) == 0
        runs[bool(extra)] = json.loads(capsys.readouterr().out)
    assert runs[True]["results"][0]["token_ids"] == runs[False]["results"][0]["token_ids"]  # greedy: the same text
    assert runs[True]["stats"]["drafts_proposed"] < runs[False]["stats"]["drafts_proposed"]

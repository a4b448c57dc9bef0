"""The pivot classifier's inference path (`PivotClassifier.pivot_fn`: both distributions' features in one pass, the
module's eval forward as functional calls on weights copied once) gives exactly what the module's `predict_proba`
gives, hence the same decisions on the engine; `candidate_features` is bit-identical to computing each
distribution's features one at a time."""

import pytest
import torch

from relaxspec.engine import generate
from relaxspec.pivot import PivotClassifier, builtin_classifier_path, candidate_features, load_classifier
from relaxspec.tasks.synthetic import examples
from helpers import pair  # noqa: F401  (a fixture)

torch.set_num_threads(1)


def _features_one_at_a_time(hidden, target_logits, draft_logits, tokens):
    """The features as written before (each distribution on its own): the reference for bit-identity."""
    logp = torch.log_softmax(target_logits.float(), dim=-1)
    logq = torch.log_softmax(draft_logits.float(), dim=-1)
    idx = tokens.long().unsqueeze(-1)
    logp_x = logp.gather(-1, idx)
    entropy = lambda logd: -(logd.exp() * logd).sum(dim=-1)  # noqa: E731
    rank = (logp > logp_x).sum(dim=-1).float()
    return hidden.float(), torch.stack([logp_x.squeeze(-1).exp(), logq.gather(-1, idx).squeeze(-1).exp(),
                                        logp.max(dim=-1).values.exp(), entropy(logp), entropy(logq),
                                        torch.log1p(rank)], dim=-1)


@pytest.mark.parametrize("lead", [(), (5,), (1, 3), (4, 10)])
@pytest.mark.parametrize("vocab", [50, 714, 5000])
def test_candidate_features_are_bit_identical_to_one_distribution_at_a_time(lead, vocab):
    g = torch.Generator().manual_seed(vocab + len(lead))
    for scale in (0.1, 1.0, 20.0):  # flat to peaked distributions
        hidden = torch.randn(*lead, 16, generator=g)
        tl, dl = (torch.randn(*lead, vocab, generator=g) * scale for _ in range(2))
        tokens = torch.randint(0, vocab, lead, generator=g)
        tokens.view(-1)[:1] = tl.reshape(-1, vocab)[0].argmax()  # one verifier top choice: rank 0
        h, s = candidate_features(hidden, tl, dl, tokens)
        h_ref, s_ref = _features_one_at_a_time(hidden, tl, dl, tokens)
        assert torch.equal(h, h_ref) and torch.equal(s, s_ref) and s.is_contiguous()
    half = candidate_features(hidden, tl.half(), dl.half(), tokens)[1]  # logits in another dtype: float32 features
    assert half.dtype == torch.float32 and torch.equal(half, _features_one_at_a_time(hidden, tl.half(), dl.half(),
                                                                                      tokens)[1])


def test_feature_shape_errors_stay_one_line():
    h, lg, tok = torch.zeros(2, 3, 8), torch.zeros(2, 3, 20), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="must have the same shape"):
        candidate_features(h, lg, torch.zeros(2, 3, 21), tok)
    with pytest.raises(ValueError, match="leading shapes differ"):
        candidate_features(h, lg, lg, tok[:, :2])


def _recorded_inputs(pair, clf, temperature):
    """The inputs the engine hands the classifier in real PAD rounds (hidden states of the classifier's layer)."""
    verifier, drafter = pair
    seen, inner = [], clf.pivot_fn()

    def fn(*args):
        seen.append(args)
        return inner(*args)

    fn.hidden_layer = inner.hidden_layer
    prompts = [e.prompt for e in examples("arithmetic", "test", 3)]
    generate(verifier, drafter, prompts, method="pad", draft_length=5, max_new_tokens=24, pivot_fn=fn,
             temperature=temperature, seed=3)
    return seen


def _trained_with_dropout(hidden_size: int, seed: int = 0) -> PivotClassifier:
    """A classifier with every parameter and statistic away from its initial value (dropout on in training)."""
    g = torch.Generator().manual_seed(seed)
    clf = PivotClassifier(hidden_size, dropout=0.3, hidden_layer=-1)
    with torch.no_grad():
        for p in clf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        clf.set_normalisation(torch.randn(50, hidden_size, generator=g) * 3 + 1, torch.rand(50, 6, generator=g))
    return clf


def test_pivot_fn_matches_predict_proba_on_real_rounds(pair):
    builtin = load_classifier(builtin_classifier_path())
    other = _trained_with_dropout(builtin.hidden_mean.shape[0])
    for clf in (builtin, other):
        fn = clf.pivot_fn()
        for args in _recorded_inputs(pair, builtin, 0.7)[:40]:
            got = fn(*args)
            want = clf.predict_proba(*args)
            assert got.shape == want.shape == args[3].shape and got.device == args[1].device
            assert torch.equal(got, want)  # the same ops on the same values (the brief asks for 1e-6)
    assert not other.training  # pivot_fn put it in eval mode (dropout off), as predict_proba needs


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_pad_decisions_on_the_engine_are_those_of_predict_proba(pair, temperature):
    verifier, drafter = pair
    clf = load_classifier(builtin_classifier_path())
    module_fn = lambda *args: clf.predict_proba(*args)  # noqa: E731 - the module's forward, each round
    module_fn.hidden_layer = clf.hidden_layer
    prompts = [e.prompt for e in examples("arithmetic", "test", 4)]
    kw = dict(method="pad", draft_length=3, max_new_tokens=40, temperature=temperature, seed=11, threshold=0.5)
    fast = generate(verifier, drafter, prompts, pivot_fn=clf.pivot_fn(), **kw)
    slow = generate(verifier, drafter, prompts, pivot_fn=module_fn, **kw)
    assert [r.token_ids for r in fast.results] == [r.token_ids for r in slow.results]
    relaxed = [[rd.relaxed_only for rd in r.trace] for r in fast.results]
    assert relaxed == [[rd.relaxed_only for rd in r.trace] for r in slow.results]
    assert fast.stats.drafts_accepted == slow.stats.drafts_accepted


def test_forward_is_the_modules_composition_in_training_and_eval():
    """forward's functional calls are the modules' own: Linear projections, Dropout (same draws), ReLU, Linear."""
    clf = _trained_with_dropout(16)
    g = torch.Generator().manual_seed(2)
    hidden, scalars = torch.randn(5, 16, generator=g), torch.rand(5, 6, generator=g)

    def composed():
        h = clf.hidden_proj((hidden - clf.hidden_mean) / clf.hidden_std)
        s = clf.scalar_proj((scalars - clf.scalar_mean) / clf.scalar_std)
        return clf.mlp(torch.cat([h, s], dim=-1)).squeeze(-1)

    for training in (True, False):
        clf.train(training)
        torch.manual_seed(5)
        got = clf(hidden, scalars)
        torch.manual_seed(5)
        assert torch.equal(got, composed())
    clf.train()
    torch.manual_seed(5)
    a = clf(hidden, scalars)
    assert not torch.equal(a, clf(hidden, scalars))  # dropout draws in training
    a.sum().backward()
    assert clf.hidden_proj.weight.grad is not None and clf.mlp[1].weight.grad.abs().sum() > 0


def test_pivot_fn_errors_are_one_line():
    clf = _trained_with_dropout(16)
    fn = clf.pivot_fn()
    lg, tok = torch.zeros(1, 2, 30), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"expects hidden size 16 .*got 12$"):
        fn(torch.zeros(1, 2, 12), lg, lg, tok)
    with pytest.raises(ValueError, match="needs the verifier's hidden states"):
        fn(None, lg, lg, tok)
    assert fn(torch.zeros(1, 2, 16), lg, lg, tok).shape == (1, 2)  # the right size still works after an error


def test_inference_weights_are_a_copy_made_when_pivot_fn_is():
    clf = _trained_with_dropout(16)
    g = torch.Generator().manual_seed(1)
    args = (torch.randn(2, 3, 16, generator=g), torch.randn(2, 3, 30, generator=g), torch.randn(2, 3, 30, generator=g),
            torch.randint(0, 30, (2, 3), generator=g))
    fn = clf.pivot_fn()
    before = fn(*args)
    with torch.no_grad():
        clf.mlp[3].bias += 5.0
    assert torch.equal(fn(*args), before)  # made before the change
    assert torch.equal(clf.pivot_fn()(*args), clf.predict_proba(*args))
    assert (clf.pivot_fn()(*args) - before).abs().max() > 1e-3


@pytest.mark.parametrize("kernels", ["on", "off"])
def test_an_out_of_range_pivot_prob_stops_the_engine_with_one_read_per_round(pair, kernels, monkeypatch):
    """A pivot_fn whose output leaves [0, 1] (or is NaN) in some round stops `generate` with the rule's message, on the
    rule's C path (its C checks the values) and on the torch path (the engine reads the rows' check with the round's
    one copy to the host: VerifyStep(defer_input_checks=True)); a run whose values stay in range reads no check on the
    host per round (the rule's torch check runs once per call, on VerifyStep's placeholder)."""
    from contextlib import nullcontext

    from relaxspec.acceptance import RULES, fused

    verifier, drafter = pair
    clf = load_classifier(builtin_classifier_path())
    real = clf.pivot_fn()
    host_checks = []
    rule = type(RULES["pad"])
    check = rule._check_input_values
    monkeypatch.setattr(rule, "_check_input_values",
                        lambda self, spec, value: (host_checks.append(tuple(value.shape)), check(self, spec, value))[1])
    prompts = [e.prompt for e in examples("arithmetic", "test", 3)]
    kw = dict(method="pad", draft_length=3, max_new_tokens=40, temperature=0.7, seed=3, threshold=0.5)
    message = r"^rule 'pad': input 'pivot_prob' must lie in \[0, 1\] \(NaN not allowed\)$"
    with fused.disabled() if kernels == "off" else nullcontext():
        fine = generate(verifier, drafter, prompts, pivot_fn=real, **kw)
        assert fine.stats.verifier_forwards > 5 and host_checks == [()]  # the placeholder's, once
        for bad in (1.5, float("nan")):
            calls = []

            def broken(*args):
                out = real(*args)
                calls.append(1)
                if len(calls) == 4:  # the fourth round: one row's last draft
                    out = out.clone()
                    out[-1, -1] = bad
                return out
            broken.hidden_layer = real.hidden_layer
            with pytest.raises(ValueError, match=message):
                generate(verifier, drafter, prompts, pivot_fn=broken, **kw)
            assert len(calls) == 4  # stopped in the round that read it

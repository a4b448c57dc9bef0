"""PAD pieces that need no trained model: features, pivot rule, AUC, classifier round trip."""

import math

import pytest
import torch

from relaxspec.pivot import PivotClassifier, candidate_features, is_pivot, load_classifier, roc_auc, train_classifier
from relaxspec.pivot.classifier import binary_metrics, split_by_prompt
from relaxspec.pivot.features import SCALAR_FEATURES

torch.set_num_threads(1)


def test_candidate_features_shape_values_and_determinism():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 16, generator=g)
    tl = torch.randn(2, 3, 50, generator=g)
    dl = torch.randn(2, 3, 50, generator=g)
    tokens = torch.randint(0, 50, (2, 3), generator=g)
    h, s = candidate_features(hidden, tl, dl, tokens)
    assert h.shape == (2, 3, 16) and s.shape == (2, 3, len(SCALAR_FEATURES)) == (2, 3, 6)
    h2, s2 = candidate_features(hidden.clone(), tl.clone(), dl.clone(), tokens.clone())
    assert torch.equal(h, h2) and torch.equal(s, s2)
    p, q = tl.softmax(-1), dl.softmax(-1)
    torch.testing.assert_close(s[..., 0], p.gather(-1, tokens[..., None]).squeeze(-1))
    torch.testing.assert_close(s[..., 1], q.gather(-1, tokens[..., None]).squeeze(-1))
    torch.testing.assert_close(s[..., 2], p.max(-1).values)
    # rank 0 for the verifier's own top choice; entropy of a uniform row is log V
    _, s_top = candidate_features(hidden, tl, torch.zeros_like(dl), tl.argmax(-1))
    assert torch.all(s_top[..., 5] == 0)
    torch.testing.assert_close(s_top[..., 4], torch.full((2, 3), math.log(50)))
    # flat inputs work too ([H], [V], [] as the labeller calls it)
    h1, s1 = candidate_features(hidden[0, 0], tl[0, 0], dl[0, 0], tokens[0, 0])
    torch.testing.assert_close(s1, s[0, 0])


def test_is_pivot_rule():
    assert is_pivot(0.0, 1.0)  # the substitution flips the answer
    assert not is_pivot(1.0, 1.0)  # a pure wording change
    assert not is_pivot(0.875, 1.0, margin=0.125)  # one roll-out of 8: within the margin
    assert is_pivot(0.75, 1.0, margin=0.125)
    assert not is_pivot(0.85, 1.0, alpha=0.8, margin=0.0)
    assert is_pivot(0.85, 1.0, alpha=1.0, margin=0.0)


def test_roc_auc_known_cases():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)  # the sklearn docs example
    assert roc_auc([0.1, 0.2, 0.3], [0, 1, 1]) == 1.0
    assert roc_auc([0.3, 0.2, 0.1], [0, 1, 1]) == 0.0
    assert roc_auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == pytest.approx(0.5)  # ties count half
    assert roc_auc([0.1, 0.5, 0.5, 0.9], [0, 0, 1, 1]) == pytest.approx(0.875)
    assert math.isnan(roc_auc([0.1, 0.2], [1, 1]))


def test_binary_metrics():
    m = binary_metrics(torch.tensor([0.9, 0.8, 0.2, 0.6]), torch.tensor([1, 0, 1, 0]), 0.5)
    assert m["precision"] == pytest.approx(1 / 3) and m["recall"] == pytest.approx(0.5)
    assert m["f1"] == pytest.approx(0.4)


def _separable_data(n_prompts=30, per_prompt=10, H=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = n_prompts * per_prompt
    labels = (torch.rand(n, generator=g) < 0.4).long()
    hidden = torch.randn(n, H, generator=g) + labels[:, None] * 1.5
    scalars = torch.rand(n, 6, generator=g)
    scalars[:, 0] = torch.where(labels.bool(), scalars[:, 0] * 0.3, 0.5 + scalars[:, 0] * 0.5)
    return dict(meta=dict(verifier="v", drafter="d", task="t", hidden_layer=-2, k=4, alpha=1.0),
                hidden=hidden.half(), scalars=scalars, labels=labels,
                prompt_index=torch.arange(n_prompts).repeat_interleave(per_prompt))


def test_split_by_prompt_is_disjoint():
    pi = torch.arange(10).repeat_interleave(3)
    tr, va = split_by_prompt(pi, 0.2, 0)
    assert va.sum() == 6 and not set(pi[tr].tolist()) & set(pi[va].tolist())


def test_train_save_load_round_trip(tmp_path):
    clf, report = train_classifier(_separable_data(), epochs=150, lr=3e-3, seed=0)
    assert report["val"]["roc_auc"] > 0.9 and report["prompts_val"] == 6
    assert 0 < clf.threshold < 1
    path = tmp_path / "clf.pt"
    clf.save(path)
    back = load_classifier(path)
    assert back.hidden_layer == -2 and back.spec["verifier"] == "v" and back.spec["hidden_size"] == 12
    assert back.spec["feature_names"] == list(SCALAR_FEATURES) and back.threshold == clf.threshold
    g = torch.Generator().manual_seed(1)
    hidden, tl, dl = torch.randn(2, 5, 12, generator=g), torch.randn(2, 5, 30, generator=g), torch.randn(2, 5, 30, generator=g)
    tokens = torch.randint(0, 30, (2, 5), generator=g)
    fn, fn_back = clf.pivot_fn(), back.pivot_fn()
    assert fn_back.hidden_layer == -2
    out = fn(hidden, tl, dl, tokens)
    assert out.shape == (2, 5) and torch.all((out >= 0) & (out <= 1))
    torch.testing.assert_close(fn_back(hidden, tl, dl, tokens), out, rtol=0, atol=0)
    with pytest.raises(ValueError, match="hidden size"):
        fn_back(torch.randn(2, 5, 7), tl, dl, tokens)


def test_load_classifier_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_classifier(tmp_path / "missing.pt")
    torch.save({"something": 1}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="not a relaxspec pivot classifier"):
        load_classifier(tmp_path / "bad.pt")


def test_classifier_architecture():
    clf = PivotClassifier(128)
    assert clf.hidden_proj.out_features == 64 and clf.scalar_proj.in_features == 6
    assert clf(torch.randn(4, 128), torch.randn(4, 6)).shape == (4,)

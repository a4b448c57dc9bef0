"""End to end with the built-in models: label -> train -> decode through the engine's pad method."""

import re

import pytest
import torch

from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.pivot import builtin_classifier_path, label_pivots, load_classifier, train_classifier
from relaxspec.pivot.label import model_fingerprint
from relaxspec.tasks.base import Example, Task
from relaxspec.tasks.synthetic import examples
from helpers import pair  # noqa: F401  (a fixture)

torch.set_num_threads(1)


def _first_number_task(n):
    """Utility 1 iff the response states the problem's starting number: decided by a few digit
    tokens, so short roll-outs give both pivots (wrong digits) and non-pivots (wording)."""
    exs = [Example(prompt=e.prompt, reference=re.search(r"\d+", e.response).group(0))
           for e in examples("arithmetic", "pivot", n)]
    return Task(name="first-number", examples=exs, utility=lambda r, ref: float(ref in r), metric="contains",
                meta={"split": "pivot"})


@pytest.fixture(scope="module")
def trained(pair, tmp_path_factory):
    verifier, drafter = pair
    out = tmp_path_factory.mktemp("pad") / "labels.pt"
    data = label_pivots(verifier, drafter, _first_number_task(3), 3, k=2, max_new_tokens=14, hidden_layer=-3,
                        out=out, min_baseline=0.0, min_prob=0.0, margin=0.25, progress=False)
    return data, *train_classifier(data, epochs=40, val_fraction=0.34, seed=0)


def test_label_then_train(trained):
    data, clf, report = trained
    assert data["meta"]["hidden_layer"] == -3 and data["hidden"].shape[1] == 128
    assert data["meta"]["verifier_fingerprint"] != data["meta"]["drafter_fingerprint"]
    labels = data["labels"]
    assert len(labels) >= 4 and 0 < int(labels.sum()) < len(labels)  # both classes
    assert clf.hidden_layer == -3 and report["n_train"] + report["n_val"] == len(labels)


def test_pad_decodes_through_engine(pair, trained):
    verifier, drafter = pair
    _, clf, _ = trained
    prompts = [e.prompt for e in examples("arithmetic", "test", 2)]
    inner = clf.pivot_fn()
    seen = []

    def fn(hidden, target_logits, draft_logits, draft_tokens):  # the real classifier, inputs recorded
        out = inner(hidden, target_logits, draft_logits, draft_tokens)
        seen.append((hidden.shape, target_logits.shape, out))
        return out

    fn.hidden_layer = inner.hidden_layer
    pad = generate(verifier, drafter, prompts, method="pad", draft_length=4, max_new_tokens=20, pivot_fn=fn,
                   threshold=1.0, min_prob=0.0)
    assert all(len(r.token_ids) > 0 for r in pad.results)
    assert seen and seen[0][0] == (2, 4, 128) and seen[0][1][:2] == (2, 4)
    assert all(((o >= 0) & (o <= 1)).all() and o.shape == h[:2] for h, _, o in seen)
    # threshold 1, min_prob 0: the classifier branch keeps drafts the strict test rejects (all but those
    # with P(pivot) rounding to exactly 1.0)
    assert sum(sum(rd.relaxed_only) for r in pad.results for rd in r.trace) > 0


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_pad_threshold_zero_is_strict(pair, trained, temperature):
    verifier, drafter = pair
    _, clf, _ = trained
    prompts = [e.prompt for e in examples("arithmetic", "test", 2)]
    kw = dict(draft_length=4, max_new_tokens=24, temperature=temperature, seed=7)
    pad = generate(verifier, drafter, prompts, method="pad", pivot_fn=clf.pivot_fn(), threshold=0.0, **kw)
    strict = generate(verifier, drafter, prompts, method="strict", **kw)
    assert [r.token_ids for r in pad.results] == [r.token_ids for r in strict.results]


def test_builtin_classifier_is_shipped_and_decodes(pair):
    verifier, drafter = pair
    path = builtin_classifier_path()
    assert path.stat().st_size < 2_000_000
    clf = load_classifier(path)
    assert clf.spec["verifier"] == "verifier" and clf.spec["drafter"] == "drafter-weak"
    assert clf.spec["task"] == "arithmetic" and clf.spec["hidden_size"] == verifier.model.config.hidden_size
    # made with the weights shipped now (a retrained verifier or drafter needs a relabelled classifier)
    assert clf.spec["verifier_fingerprint"] == model_fingerprint(verifier)
    assert clf.spec["drafter_fingerprint"] == model_fingerprint(drafter)
    assert clf.metrics["val"]["roc_auc"] >= 0.75
    assert clf.check_models(verifier, drafter) == []
    assert clf.check_models(load_model("drafter-strong"), drafter)  # another model is noticed
    out = generate(verifier, drafter, [examples("arithmetic", "test", 1)[0].prompt], method="pad",
                   draft_length=4, max_new_tokens=16, pivot_fn=clf.pivot_fn(), threshold=0.5)
    assert len(out.results[0].token_ids) > 0


def test_cli_label_and_train(trained, tmp_path, capsys):
    from relaxspec.cli import main

    labels = tmp_path / "l.pt"
    assert main(["pivot", "label", "--verifier", "verifier", "--drafter", "drafter-weak", "--task", "arithmetic",
                 "--out", str(labels), "--prompts", "1", "--k", "2", "--alpha", "1.0", "--max-new-tokens", "6",
                 "--json"]) == 0
    data = torch.load(labels, weights_only=False)
    assert data["meta"]["split"] == "pivot" and len(data["prompts"]) == 1
    torch.save(trained[0], tmp_path / "train.pt")
    assert main(["pivot", "train", str(tmp_path / "train.pt"), "--out", str(tmp_path / "c.pt"), "--epochs", "5",
                 "--val-fraction", "0.34"]) == 0
    assert "roc_auc" in capsys.readouterr().out
    assert load_classifier(tmp_path / "c.pt").hidden_layer == -3

"""The built-in family's training (training/family.py, `relaxspec models train`): layer truncation from the teacher,
the distillation loss, a distilled model's teacher, a whole run on a tiny budget."""

import json

import pytest
import torch

from relaxspec.models import FAMILY, load_model


def _tiny_spec(layers, **kw):
    from relaxspec.models.family import ModelSpec

    return ModelSpec("tiny", layers=layers, hidden=32, heads=2, ffn=64, steps=1, batch_size=2, lr=1e-3, role="",
                     **kw)


def test_layer_truncation_takes_the_teachers_layers_in_order():
    from relaxspec.training.family import _copy_from_teacher, build_model

    teacher = build_model(_tiny_spec(3), 50, 1, 0, seed=1).eval()
    ids = torch.randint(2, 50, (2, 7))
    whole = build_model(_tiny_spec(3), 50, 1, 0, seed=2).eval()
    _copy_from_teacher(whole, teacher, (0, 1, 2))
    assert torch.equal(whole(input_ids=ids).logits, teacher(input_ids=ids).logits)
    # Two of three layers: the same as the teacher with its middle layer removed.
    part = build_model(_tiny_spec(2), 50, 1, 0, seed=2).eval()
    _copy_from_teacher(part, teacher, (0, 2))
    del teacher.model.layers[1]
    teacher.config.num_hidden_layers = 2
    assert torch.allclose(part(input_ids=ids, use_cache=False).logits, teacher(input_ids=ids, use_cache=False).logits,
                          atol=1e-6)
    with pytest.raises(ValueError):  # as many teacher layers as the model has
        _copy_from_teacher(part, teacher, (0,))


def test_distill_loss_is_the_kl_on_response_tokens_only():
    from relaxspec.training.family import _distill_loss

    torch.manual_seed(0)
    teacher, student = torch.randn(2, 6, 11), torch.randn(2, 6, 11)
    labels = torch.full((2, 6), -100)
    labels[0, 3:], labels[1, 4:] = 5, 7  # position k's logits predict labels[k + 1]: 3 + 2 scored positions
    assert _distill_loss(teacher, teacher, labels).item() == pytest.approx(0.0, abs=1e-6)
    scored = [(0, 2), (0, 3), (0, 4), (1, 3), (1, 4)]
    p = torch.stack([teacher[b, k] for b, k in scored]).log_softmax(-1)
    q = torch.stack([student[b, k] for b, k in scored]).log_softmax(-1)
    expected = (p.exp() * (p - q)).sum(-1).mean()
    assert _distill_loss(student, teacher, labels).item() == pytest.approx(expected.item(), rel=1e-5)
    changed = student.clone()
    changed[:, :2] += 5.0  # prompt positions and the last one do not count
    changed[:, 5] += 5.0
    assert _distill_loss(changed, teacher, labels).item() == pytest.approx(expected.item(), rel=1e-5)


def test_a_distilled_model_needs_its_teacher(tmp_path):
    from relaxspec.models.family import TOKENIZER_DIR
    from relaxspec.training.family import train_family

    with pytest.raises(ValueError, match="drafter-strong distils from verifier, which is not in"):
        train_family(tmp_path, only=["drafter-strong"], tokenizer_from=TOKENIZER_DIR, scale=0.001)


def test_training_script_runs_end_to_end_on_a_tiny_budget(tmp_path, capsys):
    from relaxspec.cli import main

    assert main(["models", "train", "--out", str(tmp_path), "--scale", "0.001", "--n", "2",
                 "--tasks", "arithmetic"]) == 0
    table = capsys.readouterr().out
    assert "arithmetic T=0" in table  # the final accuracy table, over the freshly trained models
    assert f"trained {', '.join(FAMILY)} in " in table  # and the training time
    for name in FAMILY:
        info = json.loads((tmp_path / name / "relaxspec.json").read_text())
        lm = load_model(tmp_path / name)
        assert lm.num_parameters() == info["params"]
        assert (tmp_path / name / "model.safetensors").exists()
        assert name in table
    strong = json.loads((tmp_path / "drafter-strong" / "relaxspec.json").read_text())
    assert strong["distilled_from"] == {"teacher": "verifier", "layers": list(FAMILY["drafter-strong"].teacher_layers)}
    # Each warm restart continued the previous stage's saved weights, on a fresh data stream.
    stages = [strong]
    while stages[-1]["continued_from"] is not None:
        stages.append(stages[-1]["continued_from"])
    assert len(stages) == 1 + len(FAMILY["drafter-strong"].restarts) >= 2
    assert all(s["distilled_from"] == strong["distilled_from"] for s in stages)
    assert len({s["seed"] for s in stages}) == len(stages)

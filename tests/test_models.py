import json
import math
import os
import subprocess
import sys

import pytest
import torch

from relaxspec.models import FAMILY, builtin_path, load_model
from relaxspec.cli.models import task_accuracy


PLAIN_LOAD = """
import json, sys, traceback
from transformers import AutoModelForCausalLM, AutoTokenizer
for path in sys.argv[1:]:
    try:
        m, t = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        print(json.dumps([sum(p.numel() for p in m.parameters()), m.config.num_hidden_layers, m.config.hidden_size,
                          t.decode(t('Question: 12 + 3')['input_ids'])]), flush=True)
    except Exception:
        print(json.dumps(traceback.format_exc()), flush=True)
"""


@pytest.fixture(scope="module")
def plain_loads():
    """Every shipped model loaded offline by plain transformers, in one fresh process (one import of torch and
    transformers, not one per model): {name: [params, layers, hidden, decoded text] or its traceback}."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", PLAIN_LOAD, *(str(builtin_path(name)) for name in FAMILY)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return dict(zip(FAMILY, map(json.loads, out.stdout.splitlines())))


@pytest.mark.parametrize("name", list(FAMILY))
def test_shipped_model_loads_offline_with_plain_transformers(name, plain_loads):
    path = builtin_path(name)
    assert isinstance(plain_loads[name], list), plain_loads[name]
    params, layers, hidden, text = plain_loads[name]
    spec = FAMILY[name]
    assert (int(layers), int(hidden)) == (spec.layers, spec.hidden)
    assert int(params) == json.loads((path / "relaxspec.json").read_text())["params"]
    assert text == "Question: 12 + 3"


def test_family_shares_one_tokenizer_and_is_small():
    vocabs = {name: load_model(name).tokenizer.get_vocab() for name in FAMILY}
    assert len({json.dumps(v, sort_keys=True) for v in vocabs.values()}) == 1
    total = sum(f.stat().st_size for name in FAMILY for f in builtin_path(name).glob("*.safetensors"))
    assert total <= 25 * 2**20


# Greedy arithmetic accuracy over 100 held-out problems (docs/models.md); the test reads the first
# N_HELD_OUT of them, whose mean lies within two standard errors sqrt(p (1 - p) / N) of p: verifier >= 0.75,
# drafter-strong >= 0.52 (measured on these 20: 0.90 and 0.75).
MEASURED_ACCURACY = {"verifier": 0.89, "drafter-strong": 0.72}
N_HELD_OUT = 20
ACCURACY_FLOOR = {name: p - 2 * math.sqrt(p * (1 - p) / N_HELD_OUT) for name, p in MEASURED_ACCURACY.items()}


@pytest.mark.parametrize("name", list(ACCURACY_FLOOR))
def test_shipped_model_solves_held_out_problems(name):
    accuracy = task_accuracy(load_model(name), "arithmetic", N_HELD_OUT, max_new_tokens=120)
    assert accuracy >= ACCURACY_FLOOR[name], (accuracy, ACCURACY_FLOOR[name])


def test_drafters_are_ordered_by_competence():
    """verifier > drafter-strong > drafter-weak on the same held-out arithmetic problems (greedy)."""
    accuracy = {name: task_accuracy(load_model(name), "arithmetic", 20, max_new_tokens=120)
                for name in ("verifier", "drafter-strong", "drafter-weak")}
    assert accuracy["verifier"] > accuracy["drafter-strong"] >= accuracy["drafter-weak"] + 0.15, accuracy


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


def test_drafters_know_the_format(builtin_pair):
    """The weak drafter writes a final answer in the task's format even when it is wrong."""
    from relaxspec.engine import generate
    from relaxspec.tasks.synthetic import synthetic_task

    _, drafter = builtin_pair
    task = synthetic_task("arithmetic", "test", 10)
    out = generate(drafter, None, task.prompts, method="ar", max_new_tokens=120)
    assert sum("The answer is" in r.text for r in out.results) >= 7


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


def test_family_table_lists_each_kind_with_its_cost():
    from relaxspec.cli.models import family_table

    table = family_table(tasks=("arithmetic",), n=2, temperatures=(0.0,))
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:] if line and not line.startswith("(")}
    assert set(rows) == {"verifier", "drafter-strong", "drafter-weak", "drafter-mtp"}
    assert rows["verifier"][1] == "verifier" and rows["drafter-weak"][1] == "LM"
    assert rows["drafter-mtp"][1:3] == ["MTP", "head"] and rows["drafter-mtp"][-1] == "-"
    c_rel = float(rows["drafter-mtp"][8])  # name, kind (two words), params, "1 x 128", ms/step, c_rel
    assert 0 < c_rel < 1.5

import json
import math
import os
import subprocess
import sys

import pytest

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


def test_drafters_know_the_format(builtin_pair):
    """The weak drafter writes a final answer in the task's format even when it is wrong."""
    from relaxspec.engine import generate
    from relaxspec.tasks.synthetic import synthetic_task

    _, drafter = builtin_pair
    task = synthetic_task("arithmetic", "test", 10)
    out = generate(drafter, None, task.prompts, method="ar", max_new_tokens=120)
    assert sum("The answer is" in r.text for r in out.results) >= 7


def test_family_table_lists_each_kind_with_its_cost():
    from relaxspec.cli.models import family_table

    table = family_table(tasks=("arithmetic",), n=2, temperatures=(0.0,))
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:] if line and not line.startswith("(")}
    assert set(rows) == {"verifier", "drafter-strong", "drafter-weak", "drafter-mtp"}
    assert rows["verifier"][1] == "verifier" and rows["drafter-weak"][1] == "LM"
    assert rows["drafter-mtp"][1:3] == ["MTP", "head"] and rows["drafter-mtp"][-1] == "-"
    c_rel = float(rows["drafter-mtp"][8])  # name, kind (two words), params, "1 x 128", ms/step, c_rel
    assert 0 < c_rel < 1.5

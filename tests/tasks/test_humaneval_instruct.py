"""humaneval-instruct: EvalPlus's instruct prompt, the answer's code block, the HumanEval scorer in the sandbox."""

import pytest

from relaxspec.tasks import get_task, runs_code
from relaxspec.tasks.humaneval import problems
from relaxspec.tasks.humaneval_instruct import INSTRUCTION, answer_code, sanitize

from conftest import benchmark_module

FENCE = "`" * 3


def fenced(code, lang="python"):
    return f"{FENCE}{lang}\n{code}\n{FENCE}"


def solution(task_id):
    p = problems()[task_id]
    return p["prompt"] + p["canonical_solution"]


def test_prompt_is_evalplus_instruct():
    task = get_task("humaneval-instruct")
    assert len(task.examples) == 164 and runs_code("humaneval-instruct")
    first = problems()["HumanEval/0"]["prompt"].strip()
    assert task.prompts[0] == (
        "Please provide a self-contained Python script that solves the following problem in a markdown code "
        f"block:\n{FENCE}\n{first}\n{FENCE}\n")
    assert INSTRUCTION in task.prompts[163] and task.references[163] == "HumanEval/163"


def test_answer_code_picks_the_first_python_block():
    assert answer_code(f"Sure.\n{fenced('a = 1')}\nand\n{fenced('b = 2')}") == "a = 1"
    assert answer_code(f"{fenced('x y z', 'text')}\n{fenced('b = 2')}") == "b = 2"  # python before other langs
    assert answer_code(f"{fenced('c = 3', '')}\ntext") == "c = 3"  # unlabelled fence: the fallback
    assert answer_code(f"{FENCE}python\nd = 4\ne = 5") == "d = 4\ne = 5"  # unclosed: to the end
    assert answer_code("def f():\n    return 1\n") == "def f():\n    return 1\n"  # no fence: the whole answer


def test_sanitize_keeps_definitions_drops_top_level_code():
    code = ("import math\nfrom typing import List\nK = 3\n\n@staticmethod\ndef f(x):\n    return x\n\n"
            "class C:\n    pass\n\nprint(f(2))\nassert f(1) == 2\nif __name__ == '__main__':\n    input()\n")
    out = sanitize(code)
    assert "print(" not in out and "assert" not in out and "__main__" not in out and "input()" not in out
    for kept in ("import math", "from typing import List", "K = 3", "@staticmethod\ndef f(x):\n    return x",
                 "class C:\n    pass"):
        assert kept in out
    assert sanitize("def broken(:\n") == "def broken(:\n"  # unparsable: run as it is (and fails)


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/2", "HumanEval/4"])
def test_fenced_canonical_solution_passes(task_id):
    task = get_task("humaneval-instruct")
    response = f"Here is the script:\n{fenced(solution(task_id))}\n\nIt loops over the pairs."
    assert task.score(response, task_id) == 1.0


def test_wrong_or_missing_code_fails():
    task = get_task("humaneval-instruct")
    assert task.score(fenced("def truncate_number(number: float) -> float:\n    return 0.0"), "HumanEval/2") == 0.0
    assert task.score("I cannot solve this.", "HumanEval/2") == 0.0
    assert task.score(fenced("def truncate_number(number:"), "HumanEval/2") == 0.0  # syntax error


def test_answer_with_its_own_wrong_assert_and_main_still_passes():
    """The model's example code is not what is scored: a wrong assert of its own, a print and an input() in a
    __main__ block (empty stdin in the sandbox) would fail a correct answer if they ran."""
    task = get_task("humaneval-instruct")
    extra = "\n\nassert truncate_number(3.5) == 0.7\nif __name__ == '__main__':\n    print(truncate_number(float(input())))"
    assert task.score(fenced(solution("HumanEval/2") + extra), "HumanEval/2") == 1.0


def test_tasks_show_prints_the_prompt(forker, tmp_path):
    out = forker.run(["-m", "relaxspec", "tasks", "show", "humaneval-instruct"], cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert INSTRUCTION in out.stdout and "HumanEval/0" in out.stdout


def test_baselines_script_runs_and_resumes(tmp_path, forker):  # (forker: this tree's src first)
    """benchmarks/task_baselines.py at tiny scale on the built-in model (llama.cpp skipped: no GGUF file for
    it); a re-run finds every result stored and generates nothing."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "b.jsonl"
    cmd = [root / "benchmarks" / "task_baselines.py", "--model", "verifier", "--limit", "2", "--max-new-tokens", "12",
           "--threads", "1", "--out", out, "--no-progress"]
    first = forker.run(cmd, cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "llama.cpp: skipped" in first.stdout and "| relaxspec |" in first.stdout
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    import json
    recs = [json.loads(x) for x in lines]
    assert [r["task_id"] for r in recs] == ["HumanEval/0", "HumanEval/1"]
    assert all(r["system"] == "relaxspec" and 0 < len(r["token_ids"]) <= 12 for r in recs)
    again = forker.run(cmd, cwd=tmp_path, timeout=300)
    assert again.returncode == 0 and "2 of 2 relaxspec results stored" in again.stdout
    assert out.read_text().splitlines() == lines


def test_divergence():
    mod = benchmark_module("task_baselines")
    assert mod.divergence([1, 2, 3], [1, 2, 3]) is None
    assert mod.divergence([1, 2, 3], [1, 5, 3]) == 1
    assert mod.divergence([1, 2], [1, 2, 3]) == 2


def test_ours_gap_reads_the_prefix_last_position():
    """The divergence table's gap on our side: top-1 minus top-2 logit after the prefix, the same whatever follows."""
    import torch
    from relaxspec.models import load_model
    mod = benchmark_module("task_baselines")
    model = load_model("verifier")
    prefix = model.tokenizer("Question: Mia has 120 apples. She buys 35 more.")["input_ids"]
    g = mod.ours_gap(model, prefix)
    x = torch.tensor([prefix + [5, 7]])
    logits, _ = model.forward(x, model.new_cache(), None, torch.arange(x.shape[1])[None])
    assert isinstance(g, float) and g > 0
    assert abs(g - mod.gap(logits[0, len(prefix) - 1])) < 1e-4 * max(1.0, abs(g))

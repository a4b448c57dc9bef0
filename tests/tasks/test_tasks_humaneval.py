import pytest

from relaxspec.tasks import get_task
from relaxspec.tasks.humaneval import check_completion, make_utility, problems


def test_shipped_problems_load():
    task = get_task("humaneval", limit=3)
    assert len(problems()) == 164
    assert [e.reference for e in task.examples] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert task.prompts[0].lstrip().startswith("from typing import List")


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/2", "HumanEval/4"])
def test_canonical_solutions_pass(task_id):
    passed, reason = check_completion(task_id, problems()[task_id]["canonical_solution"])
    assert passed, reason


def test_full_function_response_is_run_as_is():
    p = problems()["HumanEval/2"]
    assert check_completion("HumanEval/2", p["prompt"] + p["canonical_solution"])[0]


def test_broken_solution_fails():
    passed, reason = check_completion("HumanEval/2", "    return 0.0\n")  # truncate_number: wrong
    assert not passed and "AssertionError" in reason
    assert not check_completion("HumanEval/0", "    return (\n")[0]  # syntax error
    assert make_utility()("    return 0.0\n", "HumanEval/2") == 0.0


def test_infinite_loop_times_out_to_zero():
    utility = make_utility(timeout=1.0)
    assert utility("    while True:\n        pass\n", "HumanEval/2") == 0.0
    passed, reason = check_completion("HumanEval/2", "    while True:\n        pass\n", timeout=1.0)
    assert not passed and reason == "timed out"


def test_unknown_task_id():
    with pytest.raises(ValueError, match="unknown HumanEval task id"):
        check_completion("HumanEval/9999", "pass")

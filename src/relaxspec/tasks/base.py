"""A task: prompts, one reference per prompt, and a utility in [0, 1] per response."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Callable

# Synthetic problems are assigned to a split by a hash of their prompt, so the
# splits are disjoint by construction, whatever seed or count is asked for.
SPLIT_BUCKETS = {"train": range(0, 8), "pivot": range(8, 9), "test": range(9, 10)}


def split_of(prompt: str) -> str:
    bucket = int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % 10
    return next(name for name, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


@dataclass(frozen=True)
class Example:
    prompt: str
    reference: str
    response: str = ""  # a worked reference solution, where the task has one (used for training)


@dataclass
class Task:
    name: str
    examples: list[Example]
    utility: Callable[[str, str], float]
    metric: str
    meta: dict = field(default_factory=dict)

    @property
    def prompts(self) -> list[str]:
        return [e.prompt for e in self.examples]

    @property
    def references(self) -> list[str]:
        return [e.reference for e in self.examples]

    def score(self, response: str, reference: str) -> float:
        return float(self.utility(response, reference))


_FINAL_ANSWER = re.compile(r"The answer is\s*(.+?)\s*\.?\s*$", re.MULTILINE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(response: str) -> str | None:
    """The text after the last 'The answer is', or None when the response never states one."""
    found = _FINAL_ANSWER.findall(response)
    return found[-1].strip() if found else None


def parse_number(text: str | None) -> float | None:
    if text is None:
        return None
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    try:
        return float(numbers[-1].replace(",", ""))
    except ValueError:
        return None

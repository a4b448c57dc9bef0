"""A task: prompts, one reference per prompt, and a utility in [0, 1] per response."""

from __future__ import annotations

import json

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


def split_examples(make_problem, rng, split: str, n: int) -> list:
    """n distinct problems `make_problem(rng)` makes whose prompt falls in `split` (split_of)."""
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"unknown split {split!r}; known: {sorted(SPLIT_BUCKETS)}")
    out, seen = [], set()
    while len(out) < n:
        ex = make_problem(rng)
        if ex.prompt not in seen and split_of(ex.prompt) == split:
            seen.add(ex.prompt)
            out.append(ex)
    return out


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


ANSWER_MARKER = "The answer is"  # what precedes the final answer the built-in tasks score
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


def jsonl_records(name: str, data: bytes) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line of JSON-lines `data`; a one-line ValueError naming
    name:line for a line that is not UTF-8, not JSON, or not a JSON object."""
    records = []
    for lineno, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") \
                from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name}:{lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        records.append((lineno, obj))
    return records

"""What the scripts print and write: markdown tables with their notes, CSV, and the figures' small pieces."""

from __future__ import annotations

import csv
from pathlib import Path


def num(x, digits: int = 2) -> str:
    """A figure with `digits` decimals, "-" for None (a figure the row has not)."""
    return "-" if x is None else f"{x:.{digits}f}"


def header(*columns: str) -> list[str]:
    """A markdown table's first two lines."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def row(*cells) -> str:
    """A markdown table's line (each cell as str() writes it)."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def with_notes(lines: list[str], notes: list[str]) -> str:
    """A table's lines, a blank line, then its notes as a list."""
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def write_csv(path: Path, columns, rows) -> None:
    """`rows` (dicts holding at least `columns`) as CSV at `path`, its folder made where missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows([{k: r[k] for k in columns} for r in rows])


def first_difference(a: list, b: list) -> int | None:
    """The first position where two token sequences differ (one ending first counts), None when they are equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))

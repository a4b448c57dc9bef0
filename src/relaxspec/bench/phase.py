"""The bench's and tune's `phase` setting: relax only inside a span of each response (relaxspec.engine.phase).

None relaxes everywhere; "think" or "BEGIN..END" as `generate` takes them; "task" is each task's own span
(`relaxspec.tasks.relax_span`: the worked steps before the final answer, for the built-in tasks), resolved per
cell, so a cell's key and report say which markers it ran with.
"""

from __future__ import annotations

from relaxspec.engine.phase import TASK, Phase, parse_phase


def check_phase_setting(value, tasks) -> None:
    """ValueError naming the setting unless it is None, "task" (every one of `tasks` offering a span) or a phase
    spec generate accepts; checked before any model loads."""
    if value is None:
        return
    if value == TASK:
        from relaxspec.tasks import relax_span
        for task in tasks:
            relax_span(task)
        return
    if not isinstance(value, str):
        raise ValueError(f"bench: phase must be a string ('task', 'think' or 'BEGIN..END'), got {value!r}")
    parse_phase(value)


def phase_for(value, task: str) -> str | None:
    """The phase spec a cell of `task` runs with (its markers, for "task")."""
    if value != TASK:
        return value
    from relaxspec.tasks import relax_span
    return str(Phase(*relax_span(task)))


def phase_options(value, task: str) -> dict:
    """generate's and a cell config's `phase` entry: empty when the bench relaxes everywhere (so the keys of
    cells run without a phase are what they always were)."""
    return {} if value is None else {"phase": phase_for(value, task)}

"""A task made of slices of other tasks, in bands: `mix:BAND/BAND/...`.

A band is a comma-separated list of parts `TASK[a:b]` (a slice of a task's examples, Python's slice with
non-negative bounds; `TASK` alone: all of them). Within a band the parts are interleaved evenly (part s's example k
sits at (k + 1/2) / n_s of the band, ties in the order the parts are written), so any prefix of a band holds each
part in proportion; bands follow one another. tune's search and held-out bands are prefixes of a task, so

    mix:mbpp-instruct[0:250],gsm8k[0:250]/humaneval-instruct,mbpp-instruct[250:500],gsm8k[250:500]

searched on its first 500 prompts and held out on the next 664 searches MBPP and GSM8K problems mixed, and
confirms on HumanEval and the other MBPP and GSM8K problems, none of which the search reads.

Each example keeps its own prompt; its reference is `PART_INDEX:reference`, scored by that part's own utility.
The task's `meta["bands"]` holds the bands' sizes. (`get_task("mix:...")` builds it, passing itself as the loader
of the parts.)
"""

from __future__ import annotations

import re

from relaxspec.tasks.base import Example, Task

PREFIX = "mix:"
_PART = re.compile(r"^([^\[\]]+?)(?:\[(\d*):(\d*)\])?$")


def parse(spec: str) -> list[list[tuple[str, int | None, int | None]]]:
    """[[(task spec, start, stop), ...] per band]; a one-line ValueError for a malformed spec."""
    body = spec[len(PREFIX):]
    if not body.strip():
        raise ValueError(f"task spec {spec!r} names no parts; use mix:TASK[a:b],TASK[a:b]/TASK,...")
    bands = []
    for band in body.split("/"):
        parts = []
        for item in band.split(","):
            m = _PART.match(item.strip())
            if not m or m.group(1).startswith(PREFIX.rstrip(":")):
                raise ValueError(f"task spec {spec!r}: {item.strip()!r} is not TASK or TASK[a:b] (a, b >= 0)")
            start, stop = (int(x) if x else None for x in m.group(2, 3)) if m.group(2) is not None else (None, None)
            if start is not None and stop is not None and stop <= start:
                raise ValueError(f"task spec {spec!r}: {item.strip()!r} is an empty slice")
            parts.append((m.group(1).strip(), start, stop))
        bands.append(parts)
    return bands


def interleave(sizes: list[int]) -> list[tuple[int, int]]:
    """(part, k) for every example of parts of these sizes, evenly mixed (see the module doc)."""
    keyed = [((k + 0.5) / n, s, k) for s, n in enumerate(sizes) for k in range(n)]
    return [(s, k) for _, s, k in sorted(keyed)]


def mix_task(spec: str, get_task, limit: int | None = None) -> Task:
    """The mixed task; `get_task(name)` loads each part."""
    tasks, examples, sizes = [], [], []
    for band in parse(spec):
        chosen = []
        for name, start, stop in band:
            task = get_task(name)
            picked = task.examples[slice(start, stop)]
            if stop is not None and stop > len(task.examples):
                raise ValueError(f"task spec {spec!r}: {name} has {len(task.examples)} examples, not {stop}")
            if not picked:
                raise ValueError(f"task spec {spec!r}: {name}[{start or ''}:{stop or ''}] holds no example")
            chosen.append((len(tasks), picked))
            tasks.append(task)
        for s, k in interleave([len(p) for _, p in chosen]):
            index, picked = chosen[s]
            e = picked[k]
            examples.append(Example(e.prompt, f"{index}:{e.reference}", e.response))
        sizes.append(sum(len(p) for _, p in chosen))

    def utility(response: str, reference: str) -> float:
        index, sep, ref = reference.partition(":")
        if not sep or not index.isdigit() or int(index) >= len(tasks):
            raise ValueError(f"reference {reference!r} names no part of {spec!r}")
        return tasks[int(index)].utility(response, ref)

    metrics = sorted({t.metric for t in tasks})
    return Task(name=spec, examples=examples[:limit] if limit else examples, utility=utility,
                metric=metrics[0] if len(metrics) == 1 else "mixed",
                meta={"bands": sizes, "parts": [t.name for t in tasks]})


def part_specs(spec: str) -> list[str]:
    return [name for band in parse(spec) for name, _, _ in band]


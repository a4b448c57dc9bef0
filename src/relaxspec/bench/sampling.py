"""Which samples (prompt, repeat) a bench cell holds after each look: independent prompts first.

Look 1: the task's first `limit` prompts x `repeats` repeats. Each later look doubles a cell's samples with new
prompts (each at `repeats` repeats), drawn after a band of `band` prompts, [limit, limit + band) (the bench's
setting `heldout_band`: the band `relaxspec tune` holds out for its confirmation by default when its search cells
are these cells, --search-prompts = limit). When the task has no more prompts (a benchmark's pool, e.g. AIME's 30), the rest of the growth comes as more repeats of
the prompts it has: samples of one prompt are then clustered, which the intervals account for (bench.stats).
Every look's samples contain the previous look's, so a cell grows by looks and a re-run continues it.
"""

from __future__ import annotations

import math


def prompts_needed(limit: int, looks: int, band: int) -> int:
    """How many of the task's examples a bench with `looks` looks may read (the held-out band included)."""
    return limit + band + limit * (2 ** (looks - 1) - 1)


def look_design(limit: int, repeats: int, look: int, pool: int, band: int) -> tuple[list[int], int]:
    """(example indices, repeats per prompt) of a cell after look `look` (1-based) when the task has `pool`
    examples (see the module doc)."""
    first = min(limit, pool)
    spare = max(0, pool - limit - band)
    new = min(limit * (2 ** (look - 1) - 1), spare)
    prompts = list(range(first)) + list(range(limit + band, limit + band + new))
    target = first * repeats * 2 ** (look - 1)
    return prompts, repeats * math.ceil(target / (len(prompts) * repeats))


def samples_at(limit: int, repeats: int, look: int, pool: int, band: int) -> list[tuple[int, int]]:
    """The cell's (example index, repeat) samples after look `look` (look 0: none), repeat-major."""
    if look < 1:
        return []
    prompts, reps = look_design(limit, repeats, look, pool, band)
    return [(i, r) for r in range(reps) for i in prompts]


def looks_done(stored, plan, looks: int) -> int:
    """The last look (up to `looks`) whose samples (`plan(look)`, e.g. samples_at) are all among `stored`
    ((prompt, repeat) keys); 0 if none."""
    stored = set(stored)
    done = 0
    for look in range(1, looks + 1):
        if not set(plan(look)) <= stored:
            break
        done = look
    return done

"""Running the bench grid: cells in looks, each look's samples stored as it finishes.

Every cell runs its samples through `relaxspec.engine.generate` (batched), sample (prompt i, repeat r) with
the per-sequence seed derive_seed(cell seed, i, r), the same for every method, so that cells are coupled
sample by sample. Look 1 runs `repeats` repeats of `limit` prompts in every cell; each later look doubles the
samples of the relaxed cells whose difference vs strict is still undecided (and of strict at their N), with
new prompts while the task has them (bench.sampling), while the time budget allows. A cell's key hashes what
decides its samples (not how many there are), so a re-run continues every cell where it stopped and loses at most
the look in flight.

The driver, `run_grid`: `plan` (the cells in run order), then a workbench (bench.workbench: the store, the
versions, the PAD classifier, the models, the speed constants and batch-1 timing, measured before any worker
starts) that `ensure`s each look's samples (`run_look`) on an executor (bench.executors), then the run's report
(`RunSummary`).
"""

from __future__ import annotations

import itertools
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

from relaxspec.bench.cell import CellSpec
from relaxspec.bench.config import BenchConfig
from relaxspec.bench.executors import make_executor, status_line
from relaxspec.bench.metrics import compare, decision_confidence
from relaxspec.bench.names import AR, STRICT
from relaxspec.bench.sampling import looks_done
from relaxspec.bench.stats import decision, is_decided
from relaxspec.bench.workbench import Workbench, Wanted


def plan(config: BenchConfig) -> list[CellSpec]:
    """All cells in run order: per (verifier, seed), AR on every task first, then per draft length, task and
    drafter the cells of every method, strict first. A run stopped part-way has then covered every drafter and
    task at the first draft lengths (what most comparisons need) rather than one task or drafter wholly."""
    specs = config.method_specs()
    cells = []
    for verifier, seed in itertools.product(config.verifiers, config.seeds):
        if any(m == AR for m, _ in specs):
            cells.extend(CellSpec(verifier, None, task, AR, {}, 0, seed) for task in config.tasks)
        for n, task, drafter in itertools.product(config.draft_lengths, config.tasks, config.drafters):
            cells.extend(CellSpec(verifier, drafter, task, m, dict(params), n, seed) for m, params in specs if m != AR)
    return cells


@dataclass
class RunSummary:
    ran: list[str] = field(default_factory=list)  # keys of cells that got samples in this run
    skipped: list[str] = field(default_factory=list)  # keys whose first look was already stored
    unavailable: list[str] = field(default_factory=list)  # labels of cells that could not run (e.g. no classifier)
    looks_run: int = 0
    failed: list[str] = field(default_factory=list)  # "label: error" of cells that raised (not stored)
    out_of_time: list[str] = field(default_factory=list)  # labels of cells a later look could not extend in time
    wall_s: float = 0.0
    out: str = ""
    # wall-clock (start, end) (time.time()) of the run's phases: "speed constants", "batch 1" (the quiet batch-1
    # timing of the cells new in this run) and "look N" (first start to last end of that look's sample jobs)
    phases: dict = field(default_factory=dict)


def run_grid(config: BenchConfig, on_cell=None, progress: bool = True, log=print, executor=None) -> RunSummary:
    """Run the grid in looks (see the module doc), writing each cell's look to the store as it finishes: `plan`
    the cells, open a workbench on them (`prepare`: keys, speed constants, batch-1 timing), then each look
    (`run_look`) on an executor. With config.workers > 1, cells run in that many processes; the driver alone
    writes the store.

    `on_cell(index, spec, key, metrics)` is called after each stored look of a cell (e.g. to stop early);
    KeyboardInterrupt anywhere loses only the looks in flight. `executor`: bench.executors.ExecutorOptions;
    kind "ray" runs the cells on Ray workers instead (bench.cell_job); every worker runs a cell through
    bench.cell.run_cell."""
    config.validate()
    t_start = time.perf_counter()
    with Workbench(config) as workbench:
        grid = Grid(workbench, summary=RunSummary(out=str(config.out)), log=log, t_start=t_start, on_cell=on_cell,
                    progress=progress)
        try:
            prepare(grid, plan(config))
            remote = executor is not None and executor.kind == "ray"
            if remote or config.workers > 1:  # else the workbench's own process, with the models it loaded
                workbench.executor = make_executor(executor if remote else None, workers=config.workers)
            with workbench.executor:
                index = 0
                for look in range(1, config.looks + 1):
                    index = run_look(grid, look, index)
        finally:
            grid.summary.wall_s = time.perf_counter() - t_start
    return grid.summary


@dataclass
class Grid:
    """A run of the grid: its workbench, its cells and what the run reports into; `prepare` fills the cells."""
    workbench: Workbench
    summary: RunSummary
    log: Callable = print
    t_start: float = 0.0  # time.perf_counter() at the run's start (later looks fit in the time budget from it)
    on_cell: Callable | None = None
    progress: bool = True
    keyed: list = field(default_factory=list)  # (CellSpec, key) of each cell, in plan order
    strict_key: dict = field(default_factory=dict)  # a relaxed cell's key -> strict's at its pair, task, N and seed
    samples_at: Callable | None = None  # (task, look) -> a cell's samples after the look (None: the workbench's)

    def samples(self, task: str, look: int) -> list[tuple[int, int]]:
        """A cell's samples of `task` after look `look`."""
        return (self.samples_at or self.workbench.samples_at)(task, look)


def prepare(grid: Grid, cells: list[CellSpec]) -> None:
    """The cells that can run (a warning names the others, listed in summary.unavailable), their keys, and the speed
    constants and batch-1 timing of the cells new in this run, measured here before any worker starts (a quiet
    machine); with one look and every cell stored, none of that: no model loads."""
    workbench, summary, config = grid.workbench, grid.summary, grid.workbench.config
    store = workbench.store  # opened and checked first: a damaged store is an error before anything loads
    cells, skipped = workbench.runnable(cells)
    if skipped:
        pivot_fn, info, clf_spec = workbench.classifier()
        reason = f"no PAD classifier available ({info})" if pivot_fn is None else \
            (f"no PAD classifier ships for their pairs (the one found is for verifier {clf_spec.get('verifier')!r} + "
             f"drafter {clf_spec.get('drafter')!r}); pass --pad-classifier")
        warnings.warn(f"bench: skipping {len(skipped)} pad cells: {reason}", stacklevel=3)
        summary.unavailable = [c.label for c in skipped]
    grid.keyed = [(c, workbench.key(c)) for c in cells]
    key_of = {c.identity: k for c, k in grid.keyed}  # not the label: it does not name the pair
    grid.strict_key = {k: key_of.get(c.strict.identity) for c, k in grid.keyed if c.method not in (AR, STRICT)}
    if config.looks == 1 and all(_looks_stored(grid, grid.keyed, 1).values()):
        return  # all stored: no model loads, nothing runs
    phase_start = time.time()
    workbench.measure_speed(cells)
    summary.phases["speed constants"] = (phase_start, time.time())
    # Batch-1 timing of the speculative cells new in this run, here in the driver, with the speed constants'
    # torch threads and before any worker starts (a quiet machine, as the speed constants had).
    phase_start = time.time()
    new = [c for c, k in grid.keyed if c.method != AR and not store.has(k)]
    if config.speed_prompts:
        workbench.time_batch1(new)
    summary.phases["batch 1"] = (phase_start, time.time())
    if workbench.batch1:
        grid.log(f"bench: batch-1 timing of {len(new)} cells ({config.speed_prompts} prompts each): "
                 f"{summary.phases['batch 1'][1] - phase_start:.0f} s")


def run_look(grid: Grid, look: int, index: int = 0) -> int:
    """Ensure look `look`'s samples of the cells it extends (`_look_jobs`) on the workbench's executor, each stored as
    it finishes; a cell that failed is listed in summary.failed, not stored. Returns `index` (on_cell's count) after
    this look's cells."""
    from tqdm import tqdm
    workbench, summary, config = grid.workbench, grid.summary, grid.workbench.config
    wanted = _look_jobs(grid, look, workbench.executor.capacity())
    if not wanted:
        return index
    summary.looks_run = look
    done = workbench.ensure_all(wanted, looks=config.looks, first_repeats=config.repeats, look=look,
                              run_id=workbench.run_id)
    bar = tqdm(done, total=len(wanted), desc=f"bench look {look}/{config.looks}", unit="cell",
               disable=not grid.progress, dynamic_ncols=True)
    if workbench.remote:
        pool = workbench.executor
        pool.on_change = lambda: bar.set_postfix_str(status_line(pool.status), refresh=True)
    try:
        for result, metrics in bar:
            spec, key = result.request.spec, result.request.key
            if metrics is None:  # the cell raised: reported, not stored
                summary.failed.append(f"{spec.label}: {result.error}")
                continue
            span = summary.phases.get(f"look {look}", result.span)
            summary.phases[f"look {look}"] = (min(span[0], result.span[0]), max(span[1], result.span[1]))
            bar.set_postfix_str(spec.label, refresh=False)
            if key not in summary.ran:
                summary.ran.append(key)
            if grid.on_cell is not None:
                grid.on_cell(index, spec, key, metrics)
            index += 1
    finally:
        bar.close()
    return index


def _look_jobs(grid: Grid, look: int, parallel: int | None = None) -> list[Wanted]:
    """The samples look `look` wants of the cells it extends (each cell's samples after the look, `Grid.samples`).
    Look 1: every cell short of its first repeats. Later looks, among the cells stored (not those that failed): the
    relaxed cells whose difference vs strict is undecided, and strict at their N, as long as their estimated cost
    (seconds per sample so far, spread over the `parallel` workers that run cells at once: config.workers when
    None) fits in the time budget; a relaxed cell only with its strict reference."""
    store, config, summary = grid.workbench.store, grid.workbench.config, grid.summary
    keyed = grid.keyed if look == 1 else [(c, k) for c, k in grid.keyed if store.has(k)]
    done = _looks_stored(grid, keyed, look)
    target = look
    for c, k in keyed:  # samples stored under another plan (e.g. --repeats changed): not mixed in
        if done[k] == 0 and store.has(k):
            message = f"{c.label}: its stored samples follow another --repeats; use another --out"
            if message not in summary.failed:
                summary.failed.append(message)
    keyed = [(c, k) for c, k in keyed if done[k] or not store.has(k)]
    if look == 1:
        summary.skipped = [k for c, k in keyed if done[k] >= target]
        if summary.skipped:
            rest = "nothing to run" if len(summary.skipped) == len(keyed) else "running the rest"
            grid.log(f"bench: {len(summary.skipped)} of {len(keyed)} cells already in {store.path}; {rest}")
        return [Wanted(c, grid.samples(c.task, target)) for c, k in keyed if done[k] < target]
    strict_key = grid.strict_key
    confidence = decision_confidence(config.looks)
    undecided = {k for c, k in keyed if strict_key.get(k) and store.has(strict_key[k]) and not is_decided(
        decision(compare(store.utilities(k), store.utilities(strict_key[k]), confidence), config.max_drop))}
    refs = {strict_key[k] for k in undecided}
    planned, cost = set(), 0.0
    jobs = []
    for c, k in keyed:  # strict precedes its relaxed cells in plan order
        if (k not in undecided and k not in refs) or done[k] >= target:
            if k in refs:
                planned.add(k)
            continue
        cell = store.get(k)
        samples = grid.samples(c.task, target)
        new_cost = cell.metrics["sample_wall_s"] / cell.metrics["n_samples"] * \
            (len(samples) - cell.metrics["n_samples"]) / (parallel or config.workers)
        fits = time.perf_counter() - grid.t_start + cost + new_cost <= config.time_budget_s
        if not fits or (k in undecided and strict_key[k] not in planned):
            if c.label not in summary.out_of_time:  # said once, whichever look it missed first
                summary.out_of_time.append(c.label)
            continue
        cost += new_cost
        planned.add(k)
        jobs.append(Wanted(c, samples))
    return jobs


def _looks_stored(grid: Grid, keyed: list, look: int) -> dict:
    """{key: the last look up to `look` whose samples are all stored, 0 if none} for each (cell, key) of `keyed`
    (bench.sampling.looks_done over `Grid.samples`)."""
    store = grid.workbench.store
    return {k: looks_done(store.utilities(k), lambda n, t=c.task: grid.samples(t, n), look) for c, k in keyed}


__all__ = ["RunSummary", "Grid", "run_grid", "plan", "prepare", "run_look"]

"""Running the bench grid: cells in looks, each look's samples stored as it finishes.

Every cell runs its samples through `relaxspec.engine.generate` (batched), sample (prompt i, repeat r) with
the per-sequence seed derive_seed(cell seed, i, r), the same for every method, so that cells are coupled
sample by sample. Look 1 runs `repeats` repeats of `limit` prompts in every cell; each later look doubles the
samples of the relaxed cells whose difference vs strict is still undecided (and of strict at their N), with
new prompts while the task has them (bench.sampling), while the time budget allows. A cell's key hashes what
decides its samples (not how many there are), so a re-run continues every cell where it stopped and loses at most
the look in flight.

The driver, `run_grid`, is four named steps: `plan` (the cells in run order), `prepare` (the cells that can run,
their keys, the speed constants and batch-1 timing, measured before any worker starts), `run_look` (one look's
cells on an executor: bench.executors) and `store_result` (a cell's new rows and metrics).
"""

from __future__ import annotations

import itertools
import math
import time
import uuid
import warnings
from dataclasses import dataclass, field

from relaxspec.bench.cell import (CellRequest, CellResult, CellRunner, CellSpec, cell_config, pad_applies,
                                  pad_classifier, runner_key, speed_constants)
from relaxspec.bench.cell_job import CellJob
from relaxspec.bench.config import BenchConfig, extra_draft_passes, needs_classifier
from relaxspec.bench.executors import Executor, make_executor, status_line
from relaxspec.bench.metrics import (cell_metrics, compare, decision, decision_confidence, is_decided,
                                     merge_engine_stats)
from relaxspec.bench.names import AR, STRICT
from relaxspec.bench.sampling import looks_done, samples_at
from relaxspec.bench.store import Store, cell_key
from relaxspec.bench.versions import code_version, model_version


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
    the cells, `prepare` them (keys, speed constants, batch-1 timing), then each look (`run_look`) on an executor
    and `store_result`. With config.workers > 1, cells run in that many processes; the driver alone writes the
    store.

    `on_cell(index, spec, key, metrics)` is called after each stored look of a cell (e.g. to stop early);
    KeyboardInterrupt anywhere loses only the looks in flight. `executor`: bench.executors.ExecutorOptions;
    kind "ray" runs the cells on Ray workers instead (bench.cell_job); every process runs a cell through
    bench.cell.run_cell."""
    config.validate()
    store = Store(config.out)  # a damaged store is an error before any model loads
    t_start = time.perf_counter()
    summary = RunSummary(out=str(config.out))
    try:
        store.check_consistent()
        remote = executor is not None and executor.kind == "ray"
        grid = prepare(config, store, summary, log, remote)
        local = {"runner": grid.runner, "runner_key": runner_key(config)}  # run_cell's, in this process
        with make_executor(executor if remote else None, local, config.workers) as pool:
            index = 0
            for look in range(1, config.looks + 1):
                index = run_look(look, grid, pool, store, config, summary, log, t_start,
                                 on_cell=on_cell, progress=progress, index=index)
    finally:
        summary.wall_s = time.perf_counter() - t_start
        store.close()
    return summary


@dataclass
class Grid:
    """The prepared grid (`prepare`): what every look reads."""
    keyed: list  # (CellSpec, key) of each cell, in plan order
    strict_key: dict  # a relaxed cell's key -> the key of strict at its pair, task, N and seed
    versions: dict  # the code, model and PAD classifier versions in the cells' keys
    runner: CellRunner  # this process's models, tasks and PAD classifier
    speed: dict  # speed_constants, per (verifier, drafter, N)
    batch1: dict  # {spec.identity: batch-1 timing} of the cells new in this run
    remote: bool = False  # the cells run on Ray workers (their versions are checked there)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


def prepare(config: BenchConfig, store: Store, summary: RunSummary, log=print, remote: bool = False) -> Grid:
    """The grid's cells that can run (`runnable`), this process's runner, the cells' keys, and the speed constants
    and batch-1 timing of the cells new in this run, measured here before any worker starts (a quiet machine); with
    one look and every cell stored, none of that: no model loads."""
    cells, pivot_fn, versions = runnable(plan(config), config, summary)
    runner = CellRunner(config, pivot_fn)
    versions.update({name: model_version(name) for name in [*dict.fromkeys(config.verifiers), *config.drafters]})
    keyed = [(c, cell_key(cell_config(c, config, versions))) for c in cells]
    key_of = {c.identity: k for c, k in keyed}  # not the label: it does not name the pair
    strict_key = {k: key_of.get(c.strict.identity) for c, k in keyed if c.method not in (AR, STRICT)}
    if config.looks == 1 and all(_looks_stored(keyed, store, runner.samples_at, 1).values()):
        return Grid(keyed, strict_key, versions, runner, {}, {}, remote)  # all stored: no model loads, nothing runs
    phase_start = time.time()
    speed = speed_constants(runner.models, cells, drafters=runner.drafters,
                            dynamic=config.draft_confidence is not None, pivot_fn=pivot_fn)
    summary.phases["speed constants"] = (phase_start, time.time())
    # Batch-1 timing of the speculative cells new in this run, here in the driver, with the speed constants'
    # torch threads and before any worker starts (a quiet machine, as the speed constants had).
    phase_start = time.time()
    new = [c for c, k in keyed if c.method != AR and not store.has(k)]
    batch1 = runner.time_batch1(new) if config.speed_prompts else {}
    summary.phases["batch 1"] = (phase_start, time.time())
    if batch1:
        log(f"bench: batch-1 timing of {len(new)} cells ({config.speed_prompts} prompts each): "
            f"{summary.phases['batch 1'][1] - phase_start:.0f} s")
    return Grid(keyed, strict_key, versions, runner, speed, batch1, remote)


def runnable(cells: list[CellSpec], config: BenchConfig, summary: RunSummary) -> tuple[list[CellSpec], object, dict]:
    """(the cells that can run, the PAD classifier's pivot_fn or None, the versions known before models load): a
    cell whose rule reads the PAD classifier runs only with one that fits its pair (a warning names the others,
    listed in summary.unavailable)."""
    versions = {"code": code_version()}
    if not any(needs_classifier(c.method) for c in cells):
        return cells, None, versions
    pivot_fn, info, clf_spec = pad_classifier(config)
    if pivot_fn is None:
        skipped = [c for c in cells if needs_classifier(c.method)]
        reason = f"no PAD classifier available ({info})"
    else:
        versions["pad_classifier"] = info
        skipped = [c for c in cells if needs_classifier(c.method)
                   and not pad_applies(c, clf_spec, bool(config.pad_classifier))]
        reason = (f"no PAD classifier ships for their pairs (the one found is for verifier "
                  f"{clf_spec.get('verifier')!r} + drafter {clf_spec.get('drafter')!r}); pass --pad-classifier")
    if skipped:
        warnings.warn(f"bench: skipping {len(skipped)} pad cells: {reason}", stacklevel=4)
        summary.unavailable = [c.label for c in skipped]
        cells = [c for c in cells if all(c is not s for s in skipped)]
    return cells, pivot_fn, versions


def run_look(look: int, grid: Grid, pool: Executor, store: Store, config: BenchConfig, summary: RunSummary, log,
             t_start: float, on_cell=None, progress: bool = True, index: int = 0) -> int:
    """Run look `look`'s cells (`_look_jobs`) on `pool`, storing each as it finishes (`store_result`); a cell that
    failed is listed in summary.failed, not stored. Returns `index` (on_cell's count) after this look's cells."""
    from tqdm import tqdm
    stored = grid.keyed if look == 1 else [(c, k) for c, k in grid.keyed if store.has(k)]  # not cells that failed
    requests = _look_jobs(look, stored, grid.strict_key, store, config, t_start, summary, log, pool.capacity(),
                          grid.runner.samples_at)
    if not requests:
        return index
    summary.looks_run = look
    versions = grid.versions if grid.remote else None  # a worker on this machine has the driver's files
    jobs = (CellJob(request, config, versions) for request in requests)
    bar = tqdm(pool.run(jobs), total=len(requests), desc=f"bench look {look}/{config.looks}", unit="cell",
               disable=not progress, dynamic_ncols=True)
    if grid.remote:
        pool.on_change = lambda: bar.set_postfix_str(status_line(pool.status), refresh=True)
    try:
        for done in bar:
            result = done.result
            if done.error is not None or result.error is not None:  # the cell raised: reported, not stored
                summary.failed.append(f"{done.job.label}: {done.error or result.error}")
                continue
            spec, key = result.request.spec, result.request.key
            span = summary.phases.get(f"look {look}", result.span)
            summary.phases[f"look {look}"] = (min(span[0], result.span[0]), max(span[1], result.span[1]))
            metrics = store_result(store, result, cell_config(spec, config, grid.versions),
                                   grid.speed.get((spec.verifier, spec.drafter, spec.draft_length), {}),
                                   grid.batch1.get(spec.identity, {}), config.draft_confidence is not None,
                                   looks=config.looks, first_repeats=config.repeats, look=look, run_id=grid.run_id)
            bar.set_postfix_str(spec.label, refresh=False)
            if key not in summary.ran:
                summary.ran.append(key)
            if on_cell is not None:
                on_cell(index, spec, key, metrics)
            index += 1
    finally:
        bar.close()
    return index


def _look_jobs(look: int, keyed: list, strict_key: dict, store: Store, config: BenchConfig, t_start: float,
               summary: RunSummary, log, parallel: int | None = None, plan=None) -> list[CellRequest]:
    """The requests (cell, key, looks done, target look) of the cells this look extends. `plan(task, look)`: a cell's samples
    after a look (CellRunner.samples_at; None: bench.sampling with a task of unlimited prompts). Look 1: every cell short of
    its first repeats. Later looks: the relaxed cells whose difference vs strict is undecided, and strict at
    their N, as long as their estimated cost (seconds per sample so far, spread over the `parallel` workers
    that run cells at once: config.workers when None) fits in the time budget; a relaxed cell only with its
    strict reference."""
    plan = plan or (lambda task, n: samples_at(config.limit, config.repeats, n, math.inf, config.heldout_band))
    done = _looks_stored(keyed, store, plan, look)
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
            log(f"bench: {len(summary.skipped)} of {len(keyed)} cells already in {store.path}; {rest}")
        return [CellRequest(c, k, done[k], target) for c, k in keyed if done[k] < target]
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
        new_cost = cell.metrics["sample_wall_s"] / cell.metrics["n_samples"] * \
            (len(plan(c.task, target)) - cell.metrics["n_samples"]) / (parallel or config.workers)
        fits = time.perf_counter() - t_start + cost + new_cost <= config.time_budget_s
        if not fits or (k in undecided and strict_key[k] not in planned):
            if c.label not in summary.out_of_time:  # said once, whichever look it missed first
                summary.out_of_time.append(c.label)
            continue
        cost += new_cost
        planned.add(k)
        jobs.append(CellRequest(c, k, done[k], target))
    return jobs


def _looks_stored(keyed: list, store: Store, plan, look: int) -> dict:
    """{key: the last look up to `look` whose samples are all stored, 0 if none} for each (cell, key) of `keyed`;
    `plan(task, look)`: a cell's samples after a look (bench.sampling.looks_done)."""
    return {k: looks_done(store.utilities(k), lambda n, t=c.task: plan(t, n), look) for c, k in keyed}


def store_result(store: Store, result: CellResult, cell_conf: dict, speed: dict, batch1: dict, dynamic: bool,
                 **extra) -> dict:
    """Store a result's new rows with the cell's metrics over all its rows (stored and new), in one transaction;
    returns the metrics. `cell_conf`: the cell's config (cell_config, as keyed); `speed`: its speed constants;
    `batch1`: its batch-1 timing, used when the cell is new (a stored cell keeps its own); `dynamic`: its drafts
    per round vary (a confidence stop); `extra`: more metrics (e.g. the look, the run's id)."""
    spec, key = result.request.spec, result.request.key
    old = store.get(key)
    parts = (old.metrics["engine_stats"] if old else []) + result.parts
    batch1 = old.metrics.get("batch1", {}) if old else batch1
    all_rows = (store.rows(key) if old else []) + result.rows
    metrics = cell_metrics(spec.method, spec.draft_length, extra_draft_passes(spec.method), all_rows,
                           merge_engine_stats(parts), {**speed, **batch1}, dynamic=dynamic)
    metrics.update(engine_stats=parts, batch1=batch1, **extra,
                   sample_wall_s=(old.metrics["sample_wall_s"] if old else 0.0) + result.sample_wall_s)
    store.put(key, cell_conf, metrics, result.rows)
    return metrics


__all__ = ["RunSummary", "Grid", "run_grid", "plan", "prepare", "runnable", "run_look", "store_result"]

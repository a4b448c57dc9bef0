"""Running the bench grid: cells in looks, each look's samples stored as it finishes.

Every cell runs its samples through `relaxspec.engine.generate` (batched), sample (prompt i, repeat r) with
the per-sequence seed derive_seed(cell seed, i, r), the same for every method, so that cells are coupled
sample by sample. Look 1 runs `repeats` repeats of `limit` prompts in every cell; each later look doubles the
samples of the relaxed cells whose difference vs strict is still undecided (and of strict at their N), with
new prompts while the task has them (bench.sampling), while the time budget allows. A cell's key hashes what decides its samples (not how many there are), so a
re-run continues every cell where it stopped and loses at most the look in flight.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
import uuid
import warnings
from dataclasses import dataclass, field

from relaxspec.bench.cell import (CellRunner, CellSpec, cell_config, pad_applies, pad_classifier, run_cell, runner_key,
                                  speed_constants)
from relaxspec.bench.config import BenchConfig, extra_draft_passes, needs_classifier
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
    """Run the grid in looks (see the module doc), writing each cell's look to the store as it finishes.
    With config.workers > 1, cells run in that many processes; the driver alone writes the store.

    `on_cell(index, spec, key, metrics)` is called after each stored look of a cell (e.g. to stop early);
    KeyboardInterrupt anywhere loses only the looks in flight. `executor`: bench.executors.ExecutorOptions;
    kind "ray" runs the cells on Ray workers instead (see bench.cell_job); every process runs a cell through
    bench.cell.run_cell."""
    import torch
    from tqdm import tqdm

    config.validate()
    store = Store(config.out)  # a damaged store is an error before any model loads
    try:
        store.check_consistent()
    except ValueError:
        store.close()
        raise
    t_start = time.perf_counter()
    summary = RunSummary(out=str(config.out))
    cells = plan(config)
    versions = {"code": code_version()}
    pivot_fn = None
    if any(needs_classifier(c.method) for c in cells):
        pivot_fn, info, clf_spec = pad_classifier(config)
        if pivot_fn is None:
            skipped = [c for c in cells if needs_classifier(c.method)]
            reason = f"no PAD classifier available ({info})"
        else:
            versions["pad_classifier"] = info
            skipped = [c for c in cells if needs_classifier(c.method)
                       and not pad_applies(c, clf_spec, bool(config.pad_classifier))]
            reason = (f"the built-in PAD classifier is for verifier {clf_spec.get('verifier')!r} + drafter "
                      f"{clf_spec.get('drafter')!r}; pass --pad-classifier for other pairs")
        if skipped:
            warnings.warn(f"bench: skipping {len(skipped)} pad cells: {reason}", stacklevel=2)
            summary.unavailable = [c.label for c in skipped]
            cells = [c for c in cells if all(c is not s for s in skipped)]
    worker = CellRunner(config, pivot_fn)
    local = {"runner": worker, "runner_key": runner_key(config)}  # run_cell's, in this process
    versions.update({name: model_version(name) for name in [*worker.models, *config.drafters]})  # next to loading
    keyed = [(c, cell_key(cell_config(c, config, versions))) for c in cells]
    key_of = {c.identity: k for c, k in keyed}  # not the label: it does not name the pair
    strict_key = {k: key_of.get(c.strict.identity) for c, k in keyed if c.method not in (AR, STRICT)}
    phase_start = time.time()
    speed = speed_constants(worker.models, cells, drafters=worker.drafters,
                            dynamic=config.draft_confidence is not None, pivot_fn=pivot_fn)
    summary.phases["speed constants"] = (phase_start, time.time())
    # Batch-1 timing of the speculative cells new in this run, here in the driver, with the speed constants'
    # torch threads and before any worker starts (a quiet machine, as the speed constants had).
    phase_start = time.time()
    new = [c for c, k in keyed if c.method != AR and not store.has(k)]
    batch1 = worker.time_batch1(new) if config.speed_prompts else {}
    summary.phases["batch 1"] = (phase_start, time.time())
    if batch1:
        log(f"bench: batch-1 timing of {len(new)} cells ({config.speed_prompts} prompts each): "
            f"{summary.phases['batch 1'][1] - phase_start:.0f} s")
    run_id = uuid.uuid4().hex[:12]
    pool = ray_pool = None
    if executor is not None and executor.kind == "ray":
        from relaxspec.bench.cell_job import ray_results
        from relaxspec.bench.executors import make_executor, status_line
        ray_pool = make_executor(executor)
    elif config.workers > 1:
        import multiprocessing
        pool = multiprocessing.get_context("spawn").Pool(config.workers, torch.set_num_threads,
                                                          (torch.get_num_threads(),))
    index = 0
    try:
        for look in range(1, config.looks + 1):
            stored = keyed if look == 1 else [(c, k) for c, k in keyed if store.has(k)]  # not cells that failed
            jobs = _look_jobs(look, stored, strict_key, store, config, t_start, summary, log,
                              ray_pool.capacity() if ray_pool is not None else config.workers, worker.samples_at)
            if not jobs:
                continue
            summary.looks_run = look
            if ray_pool is not None:
                results = ray_results(ray_pool, jobs, config, versions, summary.failed)
            else:
                results = pool.imap_unordered(functools.partial(run_cell, config=config), jobs) if pool else \
                    (run_cell(job, config, local) for job in jobs)
            bar = tqdm(results, total=len(jobs), desc=f"bench look {look}/{config.looks}", unit="cell",
                       disable=not progress, dynamic_ncols=True)
            if ray_pool is not None:
                ray_pool.on_change = lambda: bar.set_postfix_str(status_line(ray_pool.status), refresh=True)
            try:
                for spec, key, result in bar:
                    if isinstance(result, str):  # the cell raised: reported, not stored
                        summary.failed.append(f"{spec.label}: {result}")
                        continue
                    span = summary.phases.get(f"look {look}", result["span"])
                    summary.phases[f"look {look}"] = (min(span[0], result["span"][0]), max(span[1], result["span"][1]))
                    metrics = _store_look(store, spec, key, result, look, speed, batch1.get(spec.identity, {}), config,
                                          versions, run_id)
                    bar.set_postfix_str(spec.label, refresh=False)
                    if key not in summary.ran:
                        summary.ran.append(key)
                    if on_cell is not None:
                        on_cell(index, spec, key, metrics)
                    index += 1
            finally:
                bar.close()
    finally:
        if pool is not None:
            pool.terminate()
        if ray_pool is not None:
            ray_pool.close()
        summary.wall_s = time.perf_counter() - t_start
        store.close()
    return summary


def _look_jobs(look: int, keyed: list, strict_key: dict, store: Store, config: BenchConfig, t_start: float,
               summary: RunSummary, log, parallel: int | None = None, plan=None) -> list[tuple]:
    """(spec, key, looks done, target look) of the cells this look extends. `plan(task, look)`: a cell's samples
    after a look (CellRunner.samples_at; None: bench.sampling with a task of unlimited prompts). Look 1: every cell short of
    its first repeats. Later looks: the relaxed cells whose difference vs strict is undecided, and strict at
    their N, as long as their estimated cost (seconds per sample so far, spread over the `parallel` workers
    that run cells at once: config.workers when None) fits in the time budget; a relaxed cell only with its
    strict reference."""
    plan = plan or (lambda task, n: samples_at(config.limit, config.repeats, n, math.inf))
    done = {k: looks_done(store.utilities(k), lambda n, t=c.task: plan(t, n), look) for c, k in keyed}
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
            log(f"bench: {len(summary.skipped)} of {len(keyed)} cells already in {store.path}; running the rest")
        return [(c, k, done[k], target) for c, k in keyed if done[k] < target]
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
        jobs.append((c, k, done[k], target))
    return jobs


def _store_look(store: Store, spec: CellSpec, key: str, result: dict, look: int, speed: dict, batch1: dict,
                config: BenchConfig, versions: dict, run_id: str) -> dict:
    """The cell's metrics over all its rows (stored and new), written with the new rows in one transaction;
    `batch1`: the cell's batch-1 timing from this run (used when the cell is new)."""
    old = store.get(key)
    parts = (old.metrics["engine_stats"] if old else []) + result["parts"]
    batch1 = old.metrics["batch1"] if old else batch1
    all_rows = (store.rows(key) if old else []) + result["rows"]
    metrics = cell_metrics(spec.method, spec.draft_length, extra_draft_passes(spec.method), all_rows,
                           merge_engine_stats(parts),
                           {**speed.get((spec.verifier, spec.drafter, spec.draft_length), {}), **batch1},
                           dynamic=config.draft_confidence is not None)
    metrics.update(engine_stats=parts, batch1=batch1, looks=config.looks, first_repeats=config.repeats, look=look,
                   run_id=run_id, sample_wall_s=(old.metrics["sample_wall_s"] if old else 0.0)
                   + result["sample_wall_s"])
    store.put(key, cell_config(spec, config, versions), metrics, result["rows"])
    return metrics


__all__ = ["RunSummary", "run_grid", "plan"]

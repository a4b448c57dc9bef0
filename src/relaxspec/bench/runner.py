"""Running the bench grid: cells in looks, each look's samples stored as it finishes.

Every cell runs its prompts x repeats through `relaxspec.engine.generate` (batched), sample (prompt i,
repeat r) with the per-sequence seed derive_seed(cell seed, i, r), the same for every method, so that
cells are coupled sample by sample. Look 1 runs `repeats` repeats in every cell; each later look doubles
the repeats of the relaxed cells whose difference vs strict is still undecided (and of strict at their N),
while the time budget allows. A cell's key hashes what decides its samples (not how many there are), so a
re-run continues every cell where it stopped and loses at most the look in flight.
"""

from __future__ import annotations

import itertools
import statistics
import time
import uuid
import warnings
from dataclasses import dataclass, field

from relaxspec.bench.config import BenchConfig, extra_draft_passes, needs_classifier
from relaxspec.bench.metrics import (cell_metrics, compare, decision, decision_confidence, is_decided,
                                     merge_engine_stats)
from relaxspec.bench.names import AR, STRICT, method_label
from relaxspec.bench.store import Row, Store, cell_key, token_hash
from relaxspec.bench.versions import code_version, file_version, model_version


@dataclass
class CellSpec:
    verifier: str
    drafter: str | None  # None for AR
    task: str
    method: str
    params: dict
    draft_length: int  # 0 for AR
    seed: int

    @property
    def label(self) -> str:
        n = f" N={self.draft_length}" if self.method != AR else ""
        return f"{self.task} {method_label(self.method, self.params)}{n} seed={self.seed}"

    @property
    def strict(self) -> "CellSpec":
        """The strict cell at the same pair, task, N and seed (its coupled reference)."""
        return CellSpec(self.verifier, self.drafter, self.task, STRICT, {}, self.draft_length, self.seed)


def plan(config: BenchConfig) -> list[CellSpec]:
    """All cells in run order: per (verifier, task, seed), AR first, then each drafter's cells."""
    specs = config.method_specs()
    cells = []
    for verifier, task, seed in itertools.product(config.verifiers, config.tasks, config.seeds):
        if any(m == AR for m, _ in specs):
            cells.append(CellSpec(verifier, None, task, AR, {}, 0, seed))
        for drafter in config.drafters:
            for n in config.draft_lengths:
                for m, params in specs:
                    if m != AR:
                        cells.append(CellSpec(verifier, drafter, task, m, dict(params), n, seed))
    return cells


def cell_config(spec: CellSpec, config: BenchConfig, versions: dict) -> dict:
    """Everything that decides a cell's samples; its hash is the cell's key. How many samples a cell
    gets (repeats, looks, budget) does not enter: later looks add to the same cell."""
    return {
        "verifier": spec.verifier, "verifier_version": versions[spec.verifier],
        "drafter": spec.drafter, "drafter_version": versions.get(spec.drafter) if spec.drafter else None,
        "task": spec.task, "method": spec.method, "params": spec.params,
        "draft_length": spec.draft_length, "seed": spec.seed, "limit": config.limit,
        "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens, "batch_size": config.batch_size,
        "device": config.device, "dtype": config.dtype, "chat_template": config.chat_template,
        "system": config.system,
        "pad_classifier": versions.get("pad_classifier") if needs_classifier(spec.method) else None,
        "code_version": versions["code"],
    }


def _generate(spec: CellSpec, prompts: list[str], seeds: list[int], verifier, drafter, config: BenchConfig,
              pivot_fn):
    from relaxspec.engine import generate
    extra = {"pivot_fn": pivot_fn} if needs_classifier(spec.method) else {}
    return generate(verifier, drafter if spec.method != AR else None, prompts, method=spec.method,
                    draft_length=spec.draft_length if spec.method != AR else 1,
                    max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_k=config.top_k,
                    top_p=config.top_p, seed=seeds, **generation_options(config), **extra, **spec.params)


def run_samples(spec: CellSpec, task, repeats: range, verifier, drafter, config: BenchConfig, pivot_fn=None):
    """Generate every prompt for each repeat in `repeats`; (rows, the engine stats of each call, as dicts)."""
    from relaxspec.engine import derive_seed
    jobs = [(i, r) for r in repeats for i in range(len(task.examples))]
    rows, parts = [], []
    for start in range(0, len(jobs), config.batch_size):
        chunk = jobs[start:start + config.batch_size]
        out = _generate(spec, [task.examples[i].prompt for i, _ in chunk],
                        [derive_seed(spec.seed, i, r) for i, r in chunk], verifier, drafter, config, pivot_fn)
        parts.append(out.stats.as_dict())
        for (i, r), res in zip(chunk, out.results):
            ex = task.examples[i]
            rows.append(Row(prompt_index=i, repeat=r, prompt=ex.prompt, reference=ex.reference, response=res.text,
                            utility=task.score(res.text, ex.reference), tokens=len(res.token_ids),
                            stats={"mean_acceptance_length": res.stats.mean_acceptance_length,
                                   "truncated": len(res.token_ids) >= config.max_new_tokens},
                            token_hash=token_hash(res.token_ids)))
    return rows, parts


def time_batch1(spec: CellSpec, task, verifier, drafter, config: BenchConfig, pivot_fn=None) -> dict:
    """Measured speed-up at batch 1 (latency): the first `speed_prompts` prompts one at a time, AR and the
    method taking turns prompt by prompt (a drift of the machine's speed hits both); per-token seconds of
    each run; ratio of the medians (AR / method)."""
    from relaxspec.engine import derive_seed
    n = min(config.speed_prompts, len(task.examples))
    if n == 0:
        return {}
    ar = CellSpec(spec.verifier, None, spec.task, AR, {}, 0, spec.seed)
    per_token = {AR: [], spec.method: []}
    for i in range(n):
        for cell in (ar, spec) if i % 2 == 0 else (spec, ar):
            t0 = time.perf_counter()
            out = _generate(cell, [task.examples[i].prompt], [derive_seed(spec.seed, i, 0)], verifier,
                            drafter, config, pivot_fn)
            per_token[cell.method].append((time.perf_counter() - t0) / max(1, len(out.results[0].token_ids)))
    ar_s, method_s = statistics.median(per_token[AR]), statistics.median(per_token[spec.method])
    return {"batch1_prompts": n, "batch1_ar_s_per_token": ar_s, "batch1_s_per_token": method_s,
            "measured_speedup_batch1": ar_s / method_s if method_s else float("nan")}


@dataclass
class RunSummary:
    ran: list[str] = field(default_factory=list)  # keys of cells that got samples in this run
    skipped: list[str] = field(default_factory=list)  # keys whose first look was already stored
    unavailable: list[str] = field(default_factory=list)  # labels of cells that could not run (e.g. no classifier)
    looks_run: int = 0
    out_of_time: list[str] = field(default_factory=list)  # labels of cells a later look could not extend in time
    failed: list[str] = field(default_factory=list)  # "label: error" of cells that raised (not stored)
    wall_s: float = 0.0
    out: str = ""


def _pad_classifier(config: BenchConfig):
    """(pivot_fn, version, spec) or (None, reason, None)."""
    try:
        import relaxspec.pivot as pivot
        path = config.pad_classifier or pivot.builtin_classifier_path()
        clf = pivot.load_classifier(path)
        return clf.pivot_fn(), file_version(path), dict(getattr(clf, "spec", {}) or {})
    except (ImportError, AttributeError, FileNotFoundError, OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}", None


def _pad_applies(cell: CellSpec, spec: dict, explicit: bool) -> bool:
    """The built-in classifier was trained for one pair: use it only there. An explicit one is used as given."""
    if explicit:
        return True
    return all(spec.get(k) in (None, getattr(cell, k)) for k in ("verifier", "drafter"))


def generation_options(config: BenchConfig) -> dict:
    """generate keyword arguments the user set (--chat-template, --system); the engine's defaults otherwise."""
    return {k: v for k, v in (("chat_template", config.chat_template), ("system", config.system))
            if v != getattr(BenchConfig, k)}


def model_options(config: BenchConfig) -> dict:
    """load_model keyword arguments the user set (--device, --dtype)."""
    return {k: v for k, v in (("device", config.device), ("dtype", config.dtype)) if v is not None}


class _Grid:
    """The store and the versions of one bench run; records what the executor's cell jobs return."""

    def __init__(self, config: BenchConfig, store: Store, versions: dict):
        self.config, self.store, self.versions = config, store, versions
        self.run_id = uuid.uuid4().hex[:12]

    def job(self, spec: CellSpec, key: str, target_repeats: int):
        """The job running the repeats the cell lacks up to `target_repeats` (batch-1 timing on its first look)."""
        from relaxspec.bench.cell_job import CellJob
        return CellJob(spec, key, self.config, self.versions, self.store.repeats_done(key), target_repeats,
                       batch1=spec.method != AR and not self.store.has(key))

    def record(self, job, result, look: int) -> dict:
        """Store a finished job's rows with the cell's updated metrics (one transaction)."""
        spec, key = job.spec, job.key
        old = self.store.get(key)
        batch1 = old.metrics.get("batch1", {}) if old else result.batch1
        parts = (old.metrics["engine_stats"] if old else []) + result.parts
        all_rows = (self.store.rows(key) if old else []) + result.rows
        metrics = cell_metrics(spec.method, spec.draft_length, extra_draft_passes(spec.method), all_rows,
                               merge_engine_stats(parts), {**result.speed, **batch1})
        metrics.update(engine_stats=parts, batch1=batch1, looks=self.config.looks, first_repeats=self.config.repeats,
                       look=look, run_id=self.run_id,
                       sample_wall_s=(old.metrics["sample_wall_s"] if old else 0.0) + result.sample_wall_s)
        self.store.put(key, cell_config(spec, self.config, self.versions), metrics, result.rows)
        return metrics

    def diff_vs_strict(self, key: str, strict_key: str | None):
        from relaxspec.bench.stats import NAN_INTERVAL
        if strict_key is None or not self.store.has(strict_key):
            return NAN_INTERVAL
        return compare(self.store.utilities(key), self.store.utilities(strict_key),
                       decision_confidence(self.config.looks))


def run_grid(config: BenchConfig, on_cell=None, progress: bool = True, log=print, executor=None) -> RunSummary:
    """Run the grid in looks (see the module doc), writing each cell's look to the store as it finishes.

    `executor`: bench.executors.ExecutorOptions (None: local, in this process). Whatever runs the cells, only
    this driver writes the store. `on_cell(index, spec, key, metrics)` is called after each stored look of a
    cell (e.g. to stop early); a cell that raises is listed in `summary.failed` and the others go on;
    KeyboardInterrupt anywhere loses only the looks in flight."""
    from tqdm import tqdm

    from relaxspec.bench.cell_job import seeded_cache
    from relaxspec.bench.executors import ExecutorOptions, make_executor, status_line
    from relaxspec.models import load_model

    config.validate()
    options = executor or ExecutorOptions()
    options.validate()
    t_start = time.perf_counter()
    summary = RunSummary(out=str(config.out))
    cells = plan(config)
    versions = {"code": code_version()}
    models = {}
    for name in dict.fromkeys([*config.verifiers, *config.drafters]):
        if options.kind == "local":  # Ray workers load their own
            models[name] = load_model(name, **model_options(config))  # loaded next to hashing its weights
        versions[name] = model_version(name)
    pivot_fn = None
    if any(needs_classifier(c.method) for c in cells):
        pivot_fn, info, clf_spec = _pad_classifier(config)
        if pivot_fn is None:
            skipped = [c for c in cells if needs_classifier(c.method)]
            reason = f"no PAD classifier available ({info})"
        else:
            versions["pad_classifier"] = info
            skipped = [c for c in cells if needs_classifier(c.method)
                       and not _pad_applies(c, clf_spec, bool(config.pad_classifier))]
            reason = (f"the built-in PAD classifier is for verifier {clf_spec.get('verifier')!r} + drafter "
                      f"{clf_spec.get('drafter')!r}; pass --pad-classifier for other pairs")
        if skipped:
            warnings.warn(f"bench: skipping {len(skipped)} pad cells: {reason}", stacklevel=2)
            summary.unavailable = [c.label for c in skipped]
            cells = [c for c in cells if all(c is not s for s in skipped)]
    store = Store(config.out)
    grid = _Grid(config, store, versions)
    keyed = [(c, cell_key(cell_config(c, config, versions))) for c in cells]
    key_of = {c.label: k for c, k in keyed}
    strict_key = {k: key_of.get(c.strict.label) for c, k in keyed if c.method not in (AR, STRICT)}
    failed = set()
    index = 0
    pool = None
    try:
        pool = make_executor(options, seeded_cache(models, pivot_fn, versions.get("pad_classifier")))
        for look in range(1, config.looks + 1):
            target = config.repeats_at(look)
            if look == 1:
                todo = [(c, k) for c, k in keyed if store.repeats_done(k) < target]
                summary.skipped = [k for c, k in keyed if store.repeats_done(k) >= target]
                if summary.skipped:
                    log(f"bench: {len(summary.skipped)} of {len(keyed)} cells already in {store.path}; running the "
                        f"other {len(todo)}")
            else:
                undecided = {k for c, k in keyed if k in strict_key and strict_key[k] is not None
                             and not is_decided(decision(grid.diff_vs_strict(k, strict_key[k]), config.max_drop))}
                refs = {strict_key[k] for k in undecided}
                todo = [(c, k) for c, k in keyed if (k in undecided or k in refs) and store.repeats_done(k) < target
                        and k not in failed]
            if not todo:
                continue
            summary.looks_run = look
            bar = tqdm(total=len(todo), desc=f"bench look {look}/{config.looks}", unit="cell", disable=not progress,
                       dynamic_ncols=True)

            def jobs():
                for spec, key in todo:
                    if look > 1 and not _fits(grid, store, key, target, t_start, config.time_budget_s):
                        summary.out_of_time.append(spec.label)
                        bar.update(1)
                        continue
                    yield grid.job(spec, key, target)

            pool.on_change = lambda: bar.set_postfix_str(status_line(pool.status), refresh=True)
            try:
                for done in pool.run(jobs()):
                    bar.update(1)
                    bar.set_postfix_str(status_line(pool.status), refresh=True)
                    if done.error is not None:
                        failed.add(done.job.key)
                        summary.failed.append(f"{done.job.label}: {done.error}")
                        continue
                    metrics = grid.record(done.job, done.result, look)
                    if done.job.key not in summary.ran:
                        summary.ran.append(done.job.key)
                    if on_cell is not None:
                        on_cell(index, done.job.spec, done.job.key, metrics)
                    index += 1
            finally:
                bar.close()
    finally:
        summary.wall_s = time.perf_counter() - t_start
        if pool is not None:
            pool.close()
        store.close()
    return summary


def _fits(grid: _Grid, store: Store, key: str, target: int, t_start: float, budget_s: float) -> bool:
    """Whether the cell's next look, at its measured seconds per sample so far, ends within the budget."""
    cell = store.get(key)
    per_sample = cell.metrics["sample_wall_s"] / max(1, cell.metrics["n_samples"])
    new = (target - store.repeats_done(key)) * cell.metrics["n_prompts"]
    return time.perf_counter() - t_start + per_sample * new <= budget_s


__all__ = ["CellSpec", "RunSummary", "run_grid", "plan", "cell_config", "run_samples", "time_batch1"]

"""Running the bench grid: cells in looks, each look's samples stored as it finishes.

Every cell runs its prompts x repeats through `relaxspec.engine.generate` (batched), sample (prompt i,
repeat r) with the per-sequence seed derive_seed(cell seed, i, r), the same for every method, so that
cells are coupled sample by sample. Look 1 runs `repeats` repeats in every cell; each later look doubles
the repeats of the relaxed cells whose difference vs strict is still undecided (and of strict at their N),
while the time budget allows. A cell's key hashes what decides its samples (not how many there are), so a
re-run continues every cell where it stopped and loses at most the look in flight.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import time
import uuid
import warnings
from dataclasses import dataclass, field

from relaxspec.bench.config import BenchConfig, extra_draft_passes, needs_classifier
from relaxspec.bench.metrics import (cell_metrics, compare, decision, decision_confidence, is_decided,
                                     merge_engine_stats)
from relaxspec.bench.names import AR, STRICT, method_label
from relaxspec.bench.phase import phase_options
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
    def identity(self) -> str:
        """Every field (the label leaves out the models)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @property
    def strict(self) -> "CellSpec":
        """The strict cell at the same pair, task, N and seed (its coupled reference)."""
        return CellSpec(self.verifier, self.drafter, self.task, STRICT, {}, self.draft_length, self.seed)


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
        **phase_options(config.phase, spec.task),
    }


def generate_samples(spec: CellSpec, prompts: list[str], seeds: list[int], verifier, drafter, config: BenchConfig,
              pivot_fn):
    from relaxspec.engine import generate
    extra = {"pivot_fn": pivot_fn} if needs_classifier(spec.method) else {}
    return generate(verifier, drafter if spec.method != AR else None, prompts, method=spec.method,
                    draft_length=spec.draft_length if spec.method != AR else 1,
                    max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_k=config.top_k,
                    top_p=config.top_p, seed=seeds, **generation_options(config), **extra, **spec.params,
                    **phase_options(config.phase, spec.task))


def run_samples(spec: CellSpec, task, repeats: range, verifier, drafter, config: BenchConfig, pivot_fn=None):
    """Generate every prompt for each repeat in `repeats`; (rows, the engine stats of each call, as dicts)."""
    from relaxspec.engine import derive_seed
    jobs = [(i, r) for r in repeats for i in range(len(task.examples))]
    rows, parts = [], []
    for start in range(0, len(jobs), config.batch_size):
        chunk = jobs[start:start + config.batch_size]
        out = generate_samples(spec, [task.examples[i].prompt for i, _ in chunk],
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
            out = generate_samples(cell, [task.examples[i].prompt], [derive_seed(spec.seed, i, 0)], verifier,
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
    failed: list[str] = field(default_factory=list)  # "label: error" of cells that raised (not stored)
    out_of_time: list[str] = field(default_factory=list)  # labels of cells a later look could not extend in time
    wall_s: float = 0.0
    out: str = ""


def pad_classifier(config: BenchConfig):
    """(pivot_fn, version, spec) or (None, reason, None)."""
    try:
        import relaxspec.pivot as pivot
        path = config.pad_classifier or pivot.builtin_classifier_path()
        clf = pivot.load_classifier(path)
        return clf.pivot_fn(), file_version(path), dict(getattr(clf, "spec", {}) or {})
    except (ImportError, AttributeError, FileNotFoundError, OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}", None


def pad_applies(cell: CellSpec, spec: dict, explicit: bool) -> bool:
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


class CellRunner:
    """Models, tasks and the PAD classifier of a process that runs cells (the driver itself, or a pool worker)."""

    def __init__(self, config: BenchConfig, pivot_fn=None):
        from relaxspec.models import load_model
        from relaxspec.models.drafters import load_drafter
        self.config, self.pivot_fn, self.tasks = config, pivot_fn, {}
        self.models = {name: load_model(name, **model_options(config)) for name in dict.fromkeys(config.verifiers)}
        # Drafters of any kind (LM, MTP head, prompt lookup), loaded for each verifier: a head is bound to its own.
        self.drafters = {(v, d): load_drafter(d, self.models[v]) for v in self.models
                         for d in dict.fromkeys(config.drafters)}

    def pair(self, spec: CellSpec) -> tuple:
        """(verifier, drafter or None for AR) of a cell."""
        return self.models[spec.verifier], self.drafters[(spec.verifier, spec.drafter)] if spec.drafter else None

    def task(self, name: str):
        from relaxspec.tasks import get_task
        if name not in self.tasks:
            self.tasks[name] = get_task(name, limit=self.config.limit)
        return self.tasks[name]

    def run(self, spec: CellSpec, done: int, target: int) -> dict:
        """Repeats [done, target) of the cell, and its batch-1 timing when it has no samples yet."""
        import torch
        task = self.task(spec.task)
        verifier, drafter = self.pair(spec)
        pivot_fn = self.pivot_fn if needs_classifier(spec.method) else None
        with torch.inference_mode():
            wall0 = time.perf_counter()
            rows, parts = run_samples(spec, task, range(done, target), verifier, drafter, self.config, pivot_fn)
            sample_wall = time.perf_counter() - wall0
            batch1 = time_batch1(spec, task, verifier, drafter, self.config, pivot_fn) \
                if done == 0 and spec.method != AR else None
        return {"rows": rows, "parts": parts, "sample_wall_s": sample_wall, "batch1": batch1}


_RUNNER: CellRunner | None = None


def _init_worker(config: BenchConfig, threads: int) -> None:
    import torch
    global _RUNNER
    torch.set_num_threads(threads)
    needed = any(needs_classifier(m) for m, _ in config.method_specs())
    _RUNNER = CellRunner(config, pad_classifier(config)[0] if needed else None)


def _run_job(runner: CellRunner, job: tuple) -> tuple:
    """(spec, key, result) of a look of a cell; a cell that raises for a reason of its own (e.g. a parameter
    out of range) gives its one-line error as the result instead, so the rest of the grid goes on."""
    spec, key, done, target = job
    try:
        return spec, key, runner.run(spec, done, target)
    except Exception as e:  # noqa: BLE001 - reported per cell, never stored
        return spec, key, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _run_in_worker(job: tuple) -> tuple:
    return _run_job(_RUNNER, job)


SPEED_ROUNDS = 40  # interleaved measurement rounds of the speed constants


def speed_constants(models: dict, cells: list[CellSpec], rounds: int = SPEED_ROUNDS,
                    drafters: dict | None = None) -> dict:
    """c_rel (drafter / verifier one-token step) and c_block (verifier (N+1)-token block / one-token step) per
    speculative cell's (verifier, drafter, N), measured once before any cell runs: every forward they need
    (each verifier's step and blocks, each LM drafter's step) runs once per round, interleaved, and each
    constant is the median over rounds of the ratio within a round, so a load that comes and goes cancels out.
    `drafters` maps (verifier, drafter) to a loaded Drafter (CellRunner.drafters); without it every drafter is
    an LM in `models`. A drafter of another kind (MTP head, prompt lookup) is timed per drafted token through
    the drafter protocol (as `relaxspec models list` does), over the verifier's median step."""
    import statistics

    from relaxspec.models import measure_step_latencies, relative_costs
    from relaxspec.models.drafters import measure_draft_latency
    keys = list(dict.fromkeys((c.verifier, c.drafter, c.draft_length) for c in cells if c.method != AR))
    if not keys:
        return {}
    labels, steps = [], []

    def add(label, lm, block):
        if label not in labels:
            labels.append(label)
            steps.append((lm, block))

    for v, d, n in keys:
        add((v, 1), models[v], 1)
        add((v, n + 1), models[v], n + 1)
        lm = models[d] if drafters is None else getattr(drafters[(v, d)], "lm", None)
        if lm is not None:
            add((v, d), lm, 1)
    times = measure_step_latencies(steps, rounds=rounds)
    out = {}
    for v, d, n in keys:
        iv, ib = labels.index((v, 1)), labels.index((v, n + 1))
        costs = relative_costs(times, reference=iv)
        lat_v = statistics.median(t[iv] for t in times)
        if (v, d) in labels:
            lat_d, c_rel = statistics.median(t[labels.index((v, d))] for t in times), costs[labels.index((v, d))]
        else:
            lat_d = measure_draft_latency(drafters[(v, d)], models[v])
            c_rel = lat_d / lat_v
        out[(v, d, n)] = {"c_rel_measured": c_rel, "c_block_measured": costs[ib],
                          "latency_verifier_s": lat_v, "latency_drafter_s": lat_d}
    return out


def run_grid(config: BenchConfig, on_cell=None, progress: bool = True, log=print, executor=None) -> RunSummary:
    """Run the grid in looks (see the module doc), writing each cell's look to the store as it finishes.
    With config.workers > 1, cells run in that many processes; the driver alone writes the store.

    `on_cell(index, spec, key, metrics)` is called after each stored look of a cell (e.g. to stop early);
    KeyboardInterrupt anywhere loses only the looks in flight. `executor`: bench.executors.ExecutorOptions;
    kind "ray" runs the cells on Ray workers instead (see bench.cell_job)."""
    import torch
    from tqdm import tqdm

    config.validate()
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
    versions.update({name: model_version(name) for name in [*worker.models, *config.drafters]})  # next to loading
    store = Store(config.out)
    keyed = [(c, cell_key(cell_config(c, config, versions))) for c in cells]
    key_of = {c.identity: k for c, k in keyed}  # not the label: it does not name the pair
    strict_key = {k: key_of.get(c.strict.identity) for c, k in keyed if c.method not in (AR, STRICT)}
    speed = speed_constants(worker.models, cells, drafters=worker.drafters)
    run_id = uuid.uuid4().hex[:12]
    pool = ray_pool = None
    if executor is not None and executor.kind == "ray":
        from relaxspec.bench.cell_job import ray_results
        from relaxspec.bench.executors import make_executor, status_line
        ray_pool = make_executor(executor)
    elif config.workers > 1:
        import multiprocessing
        pool = multiprocessing.get_context("spawn").Pool(config.workers, _init_worker,
                                                          (config, torch.get_num_threads()))
    index = 0
    try:
        for look in range(1, config.looks + 1):
            stored = keyed if look == 1 else [(c, k) for c, k in keyed if store.has(k)]  # not cells that failed
            jobs = _look_jobs(look, stored, strict_key, store, config, t_start, summary, log,
                              ray_pool.capacity() if ray_pool is not None else config.workers)
            if not jobs:
                continue
            summary.looks_run = look
            if ray_pool is not None:
                results = ray_results(ray_pool, jobs, config, versions, summary.failed)
            else:
                results = pool.imap_unordered(_run_in_worker, jobs) if pool else \
                    (_run_job(worker, job) for job in jobs)
            bar = tqdm(results, total=len(jobs), desc=f"bench look {look}/{config.looks}", unit="cell",
                       disable=not progress, dynamic_ncols=True)
            if ray_pool is not None:
                ray_pool.on_change = lambda: bar.set_postfix_str(status_line(ray_pool.status), refresh=True)
            try:
                for spec, key, result in bar:
                    if isinstance(result, str):  # the cell raised: reported, not stored
                        summary.failed.append(f"{spec.label}: {result}")
                        continue
                    metrics = _store_look(store, spec, key, result, look, speed, config, versions, run_id)
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
               summary: RunSummary, log, parallel: int | None = None) -> list[tuple]:
    """(spec, key, repeats done, target repeats) of the cells this look extends. Look 1: every cell short of
    its first repeats. Later looks: the relaxed cells whose difference vs strict is undecided, and strict at
    their N, as long as their estimated cost (seconds per sample so far, spread over the `parallel` workers
    that run cells at once: config.workers when None) fits in the time budget; a relaxed cell only with its
    strict reference."""
    target = config.repeats_at(look)
    if look == 1:
        summary.skipped = [k for c, k in keyed if store.repeats_done(k) >= target]
        if summary.skipped:
            log(f"bench: {len(summary.skipped)} of {len(keyed)} cells already in {store.path}; running the rest")
        return [(c, k, store.repeats_done(k), target) for c, k in keyed if store.repeats_done(k) < target]
    confidence = decision_confidence(config.looks)
    undecided = {k for c, k in keyed if strict_key.get(k) and store.has(strict_key[k]) and not is_decided(
        decision(compare(store.utilities(k), store.utilities(strict_key[k]), confidence), config.max_drop))}
    refs = {strict_key[k] for k in undecided}
    planned, cost = set(), 0.0
    jobs = []
    for c, k in keyed:  # strict precedes its relaxed cells in plan order
        if (k not in undecided and k not in refs) or store.repeats_done(k) >= target:
            if k in refs:
                planned.add(k)
            continue
        cell = store.get(k)
        new_cost = cell.metrics["sample_wall_s"] / cell.metrics["n_samples"] * \
            (target - store.repeats_done(k)) * cell.metrics["n_prompts"] / (parallel or config.workers)
        fits = time.perf_counter() - t_start + cost + new_cost <= config.time_budget_s
        if not fits or (k in undecided and strict_key[k] not in planned):
            if c.label not in summary.out_of_time:  # said once, whichever look it missed first
                summary.out_of_time.append(c.label)
            continue
        cost += new_cost
        planned.add(k)
        jobs.append((c, k, store.repeats_done(k), target))
    return jobs


def _store_look(store: Store, spec: CellSpec, key: str, result: dict, look: int, speed: dict,
                config: BenchConfig, versions: dict, run_id: str) -> dict:
    """The cell's metrics over all its rows (stored and new), written with the new rows in one transaction."""
    old = store.get(key)
    parts = (old.metrics["engine_stats"] if old else []) + result["parts"]
    batch1 = old.metrics["batch1"] if old else (result["batch1"] or {})
    all_rows = (store.rows(key) if old else []) + result["rows"]
    metrics = cell_metrics(spec.method, spec.draft_length, extra_draft_passes(spec.method), all_rows,
                           merge_engine_stats(parts),
                           {**speed.get((spec.verifier, spec.drafter, spec.draft_length), {}), **batch1})
    metrics.update(engine_stats=parts, batch1=batch1, looks=config.looks, first_repeats=config.repeats, look=look,
                   run_id=run_id, sample_wall_s=(old.metrics["sample_wall_s"] if old else 0.0)
                   + result["sample_wall_s"])
    store.put(key, cell_config(spec, config, versions), metrics, result["rows"])
    return metrics


__all__ = ["CellSpec", "CellRunner", "RunSummary", "run_grid", "plan", "cell_config", "run_samples", "time_batch1",
           "generate_samples", "speed_constants", "pad_classifier", "pad_applies"]

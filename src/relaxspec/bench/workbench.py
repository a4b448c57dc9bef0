"""A workbench: how the grid's looks (bench.runner) and tune's cells run cells and store their samples.

A workbench holds a results store, the settings its cells run with (a BenchConfig) and an executor (any
bench.executors.Executor; by default this process's, which runs cells one after the other with the workbench's
own models). It owns what every cell run reads: the versions in the cells' keys, the PAD classifier (loaded once, when a
cell needs it), this process's runner (models and tasks, loaded when first read), the speed constants and the
batch-1 timing. It offers "ensure these samples of this cell": `ensure` one cell in this process (a failure raises:
its caller cannot go on without it), `ensure_all` many on the executor (every process runs a cell through
bench.cell.run_cell; a failure is reported and the others go on). Only the samples a cell lacks run, and the driver
alone stores them, with the cell's metrics over all its rows, one transaction per result (`store_result`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from relaxspec.bench.cell import (CellRequest, CellResult, CellRunner, CellSpec, cell_config, pad_applies,
                                  pad_classifier, runner_key, speed_constants)
from relaxspec.bench.cell_job import CellJob
from relaxspec.bench.config import BenchConfig
from relaxspec.bench.executors import Executor, LocalExecutor, PoolExecutor
from relaxspec.bench.methods import extra_draft_passes, needs_classifier
from relaxspec.bench.metrics import cell_metrics, merge_engine_stats
from relaxspec.bench.names import AR
from relaxspec.bench.store import Store, cell_key
from relaxspec.bench.versions import code_version, model_version


@dataclass
class Wanted:
    """Samples one cell should hold: `samples` (prompt index, repeat) of `spec`, keyed by the workbench's cell config
    of the spec with `overrides` added or replaced (e.g. the prompts a band of tune's draws from); `batch_size`:
    samples per generate call (None: the settings'); `timed`: the cell's batch-1 timing is measured when it is
    first stored (else the workbench's, when it has one)."""
    spec: CellSpec
    samples: list
    overrides: dict = field(default_factory=dict)
    batch_size: int | None = None
    timed: bool = False


class Workbench:
    """A store, the settings of its cells and an executor (see the module doc). `store`: an open store (None: the
    settings' `out`, opened and checked when first read: a damaged store is an error before any model loads, and a
    workbench that only measures opens none); `executor`: where `ensure_all` runs cells (None: this process, with
    the workbench's models; it may be set later, e.g. once the quiet measurements are done); `speed_cells(spec)`:
    the cells whose speed constants are measured together when a cell's are first needed (default: the cell
    alone)."""

    def __init__(self, config: BenchConfig, store: Store | None = None, executor: Executor | None = None,
                 speed_cells: Callable[[CellSpec], list[CellSpec]] | None = None):
        self.config = config
        self._store, self._own_store = store, store is None
        self.versions = {"code": code_version(),
                         **{name: model_version(name) for name in dict.fromkeys([*config.verifiers, *config.drafters])}}
        self.runner = CellRunner(config)  # this process's models and tasks; the PAD classifier once loaded
        self._executor = executor
        self.speed_cells = speed_cells or (lambda spec: [spec])
        self.speed: dict = {}  # (verifier, drafter, N) -> its speed constants (speed_constants)
        self.batch1: dict = {}  # spec.identity -> its batch-1 timing
        self.with_pad = False  # a cell that reads the PAD classifier runs (workers load it too)
        self.run_id = uuid.uuid4().hex[:12]
        self._classifier = None  # pad_classifier's (pivot_fn, version or reason, its spec), once loaded

    # ------------------------------------------------------------------ what its cells read

    @property
    def store(self) -> Store:
        if self._store is None:
            store = Store(self.config.out)
            try:
                store.check_consistent()
            except BaseException:
                store.close()
                raise
            self._store = store
        return self._store

    @property
    def executor(self) -> Executor:
        if self._executor is None:  # this process, whose cache holds the workbench's runner (its loaded models)
            cache = {"runner": self.runner, "runner_key": runner_key(self.config, self.with_pad)}
            self._executor = LocalExecutor(cache)
        return self._executor

    @executor.setter
    def executor(self, executor: Executor | None) -> None:
        self._executor = executor

    @property
    def remote(self) -> bool:
        """Whether the executor's workers may lack this machine's files (they check the versions in the keys)."""
        return not isinstance(self.executor, (LocalExecutor, PoolExecutor))

    @property
    def dynamic(self) -> bool:
        """Whether every cell's drafts per round vary (a confidence stop), not only N "auto"'s."""
        return self.config.draft_confidence is not None

    def classifier(self) -> tuple:
        """(pivot_fn, version, its spec) of the settings' PAD classifier, or (None, why not, None); loaded once."""
        if self._classifier is None:
            self._classifier = pad_classifier(self.config)
            if self._classifier[0] is not None:
                self.versions["pad_classifier"] = self._classifier[1]
                self.runner.pivot_fn = self._classifier[0]
        return self._classifier

    def runnable(self, cells: list[CellSpec]) -> tuple[list[CellSpec], list[CellSpec]]:
        """(the cells that can run, the others): a cell whose rule reads the PAD classifier runs only with one that
        fits its pair (`classifier` says why when none loaded)."""
        needing = [c for c in cells if needs_classifier(c.method)]
        if not needing:
            return cells, []
        pivot_fn, _, spec = self.classifier()
        skipped = needing if pivot_fn is None else \
            [c for c in needing if not pad_applies(c, spec, bool(self.config.pad_classifier))]
        kept = [c for c in cells if all(c is not s for s in skipped)]
        self.with_pad = self.with_pad or any(needs_classifier(c.method) for c in kept)
        return kept, skipped

    def cell_config(self, spec: CellSpec, **overrides) -> dict:
        """What decides the cell's samples (bench.cell.cell_config), with `overrides` added or replaced."""
        return {**cell_config(spec, self.config, self.versions), **overrides}

    def key(self, spec: CellSpec, **overrides) -> str:
        """The cell's key in the store (the hash of its cell config)."""
        return cell_key(self.cell_config(spec, **overrides))

    def samples_at(self, task: str, look: int) -> list[tuple[int, int]]:
        """A grid cell's samples of `task` after look `look` (bench.sampling, with the task's pool)."""
        return self.runner.samples_at(task, look)

    def measure_speed(self, cells: list[CellSpec]) -> None:
        """The speed constants of the cells' (verifier, drafter, N), measured now in one interleaved measurement
        (bench.cell.speed_constants) on this process's models, c_pivot with the PAD classifier where a rule reads it."""
        self.speed.update(speed_constants(self.runner.models, cells, drafters=self.runner.drafters,
                                          dynamic=self.dynamic, pivot_fn=self.runner.pivot_fn))

    def speed_of(self, spec: CellSpec) -> dict:
        """A speculative cell's speed constants (with `speed_cells(spec)` when first needed); {} for AR."""
        if spec.method == AR:
            return {}
        key = (spec.verifier, spec.drafter, spec.draft_length)
        if key not in self.speed:
            self.measure_speed(self.speed_cells(spec))
        return self.speed[key]

    def time_batch1(self, specs: list[CellSpec]) -> None:
        """Batch-1 timing of the speculative cells among `specs`, measured now in this process (CellRunner.time_batch1:
        AR shared per verifier, task and seed), kept for when they are first stored."""
        self.batch1.update(self.runner.time_batch1(specs))

    # ------------------------------------------------------------------ ensure samples

    def missing(self, wanted: Wanted) -> list:
        """The samples of `wanted` its cell lacks in the store."""
        have = self.store.utilities(self.key(wanted.spec, **wanted.overrides))
        return [s for s in wanted.samples if s not in have]

    def _request(self, wanted: Wanted) -> tuple[CellRequest | None, dict]:
        """(the request of the samples the cell lacks, None if it has them all; its cell config)."""
        conf = self.cell_config(wanted.spec, **wanted.overrides)
        todo = self.missing(wanted)
        return (CellRequest(wanted.spec, cell_key(conf), todo, wanted.batch_size) if todo else None), conf

    def ensure(self, wanted: Wanted, between=None, **extra) -> CellResult | None:
        """Run the samples the cell lacks in this process (an error raises), storing each generate call's as it
        ends (`store_result`: a cell stopped part-way keeps its finished calls, and the same request goes on from
        there); the result (all of them), None when it had them all. `between()`: called after each call that more
        follow; it may stop the cell there by raising."""
        request, conf = self._request(wanted)
        if request is None:
            return None

        def store(rows, stats, seconds, more):
            now = time.time()
            self.store_result(CellResult(request, rows, [stats], seconds, (now - seconds, now)), conf, wanted.timed,
                              **extra)
            if more and between is not None:
                between()
        return self.runner.run(request, on_call=store)

    def ensure_all(self, wanted: Iterable[Wanted], **extra) -> Iterator[tuple[CellResult, dict | None]]:
        """Run the samples each cell lacks on the executor and store each cell's as it finishes (`store`): yields
        (its result, the metrics stored) in completion order, (the result with its one-line error, None) for a cell
        that failed (nothing stored). A cell named twice runs once."""
        pending: dict = {}
        for w in wanted:
            request, conf = self._request(w)
            if request is not None and request.key not in pending:
                pending[request.key] = (request, conf, w.timed)
        versions = self.versions if self.remote else None  # a worker on this machine has the driver's files
        jobs = [CellJob(request, self.config, versions, self.with_pad) for request, _, _ in pending.values()]
        for done in self.executor.run(jobs):
            request = done.job.request
            result = done.result if done.error is None else CellResult(request, error=done.error)
            if result.error is not None:
                yield result, None
                continue
            _, conf, timed = pending[request.key]
            yield result, self.store_result(result, conf, timed, **extra)

    def store_result(self, result: CellResult, conf: dict, timed: bool = False, **extra) -> dict:
        """Store a result's new rows with the cell's metrics over all its rows (stored and new), in one transaction,
        and return the metrics. `conf`: the cell's config (as keyed); its speed constants (`speed_of`) and, for a
        new cell, its batch-1 timing (measured now when `timed`) go with them; `extra`: more metrics (e.g. the
        look, the run's id)."""
        spec, key = result.request.spec, result.request.key
        old = self.store.get(key)
        if old is None and timed:
            self.time_batch1([spec])
        speed = self.speed_of(spec)
        parts = (old.metrics["engine_stats"] if old else []) + result.parts
        batch1 = old.metrics.get("batch1", {}) if old else self.batch1.get(spec.identity, {})
        all_rows = (self.store.rows(key) if old else []) + result.rows
        metrics = cell_metrics(spec.method, spec.draft_length, extra_draft_passes(spec.method), all_rows,
                               merge_engine_stats(parts), {**speed, **batch1}, dynamic=self.dynamic)
        metrics.update(engine_stats=parts, batch1=batch1, **extra,
                       sample_wall_s=(old.metrics["sample_wall_s"] if old else 0.0) + result.sample_wall_s)
        self.store.put(key, conf, metrics, result.rows)
        return metrics

    def close(self) -> None:
        """Close the store if the workbench opened it (an executor given to it is its caller's)."""
        if self._own_store and self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["Workbench", "Wanted"]

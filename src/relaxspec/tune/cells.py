"""Tune's cells in the bench store: the samples a configuration's cell lacks run (here or on an executor's
workers, as bench cell requests) and are stored before the race reads them, so an interrupted tune resumes
without re-running any."""

from __future__ import annotations

import uuid
from dataclasses import replace

from relaxspec.acceptance import RULES
from relaxspec.bench import (AR, BenchConfig, CellJob, CellRequest, CellResult, CellRunner, CellSpec, Store,
                             cell_config, cell_key, classifier_cost, code_version, model_version, needs_classifier,
                             pad_applies, pad_classifier, speed_constants, store_result, time_batch1)
from relaxspec.tune.objective import priced_round
from relaxspec.tune.space import Config


class Cells:
    """Tune's cells in the bench store: run the samples a cell lacks, read what it has. `config`: the run's settings,
    a run.TuneConfig (run.py builds on this module, so it is not imported here)."""

    def __init__(self, config, executor=None):
        config.resolve_bands()
        self.config = config
        self.executor = executor  # None: every sample runs in this process
        self.remote_samples = 0  # samples run on the executor's workers
        # the settings every sample runs with (the search and held-out bands differ only in the prompts they key)
        bench = config.bench_config(config.search_prompts + config.heldout_prompts)
        self.verifier, self.drafter = bench.verifiers[0], bench.drafters[0]
        self.versions = {"code": code_version()}
        for name in dict.fromkeys([self.verifier, self.drafter]):
            self.versions[name] = model_version(name)
        self.pivot_fn, self.pad_fits = None, False
        # the rules that read a pivot classifier (declared), in the space searched
        names = list(RULES) if config.methods is None else [m.split(":")[0].strip() for m in config.methods]
        classifier_rules = [m for m in names if m in RULES and needs_classifier(m)]
        if classifier_rules:
            self.pivot_fn, info, spec = pad_classifier(bench)
            probe = CellSpec(self.verifier, self.drafter, config.task, classifier_rules[0], {}, 1, config.seed)
            self.pad_fits = self.pivot_fn is not None and pad_applies(probe, spec, bool(config.pad_classifier))
            if self.pad_fits:
                self.versions["pad_classifier"] = info
        self.classifier_rule = classifier_rules[0] if self.pad_fits else None  # whose cells c_pivot is measured for
        self.store = Store(config.out)
        self.store.check_consistent()
        self.grid = CellRunner(bench, self.pivot_fn)  # the bench's models and tasks of one process
        self._speed = {}
        self.all_examples = self.grid.task(config.task).examples
        if len(self.all_examples) < config.search_prompts + config.heldout_prompts:
            raise ValueError(f"tune: task {config.task!r} has {len(self.all_examples)} prompts; it needs "
                             f"{config.search_prompts} search + {config.heldout_prompts} held-out ones")
        self.run_id = uuid.uuid4().hex[:12]
        self.sample_seconds, self.samples_run, self.tokens_run = 0.0, 0, 0

    def spec(self, config: Config | None) -> CellSpec:
        """The bench cell of a configuration (None: AR)."""
        if config is None:
            return CellSpec(self.verifier, None, self.config.task, AR, {}, 0, self.config.seed)
        return CellSpec(self.verifier, self.drafter, self.config.task, config.method, config.params_dict,
                        config.draft_length, self.config.seed)

    def key(self, spec: CellSpec, heldout: bool) -> tuple[str, dict, BenchConfig]:
        c = self.config
        bench = c.bench_config(c.search_prompts + c.heldout_prompts if heldout else c.search_prompts)
        config = cell_config(spec, bench, self.versions)
        if heldout:  # held-out cells draw from prompts the bench's own cells (a prefix of the task) never see
            config["prompts"] = f"held-out {c.search_prompts}..{c.search_prompts + c.heldout_prompts - 1}"
        return cell_key(config), config, bench

    def _todo(self, spec: CellSpec, jobs: list[tuple[int, int]], heldout: bool):
        """(key, cell config, bench config, the jobs (prompt, repeat) the cell lacks)."""
        key, cell_conf, bench = self.key(spec, heldout)
        have = self.store.utilities(key)
        return key, cell_conf, bench, [j for j in jobs if j not in have]

    def _request(self, spec: CellSpec, key: str, todo: list[tuple[int, int]]) -> CellRequest:
        """The samples `todo` of a cell, in generate calls of the run's batch size (default: one call)."""
        return CellRequest(spec, key, samples=todo, batch_size=min(len(todo), self.config.batch_size or len(todo)))

    def ensure(self, spec: CellSpec, jobs: list[tuple[int, int]], heldout: bool = False) -> dict:
        """Run the jobs (prompt, repeat) the cell lacks, store them; return all its rows {(prompt, repeat): Row}."""
        key, cell_conf, bench, todo = self._todo(spec, jobs, heldout)
        if todo:  # in this process, with the models already loaded
            self._store(cell_conf, bench, self.grid.run(self._request(spec, key, todo)), heldout)
        return {(r.prompt_index, r.repeat): r for r in self.store.rows(key)}

    def prefetch(self, wanted: list[tuple[CellSpec, list[tuple[int, int]], bool]]) -> None:
        """Run the samples the given cells lack on the executor (Ray workers: each keeps a CellRunner with the pair
        loaded across its jobs), all at once; the driver stores each cell's samples as they come back. Without an
        executor, `ensure` runs them one cell at a time."""
        if self.executor is None:
            return
        pending = {}
        for spec, jobs, heldout in wanted:
            key, cell_conf, bench, todo = self._todo(spec, jobs, heldout)
            if todo and key not in pending:
                pending[key] = (spec, cell_conf, bench, todo, heldout)
        jobs = [CellJob(self._request(spec, key, todo), self.grid.config, self.versions, self.pad_fits)
                for key, (spec, _, _, todo, _) in pending.items()]
        for done in self.executor.run(jobs):
            error = done.error if done.error is not None else done.result.error
            if error is not None:
                raise ValueError(f"tune: cell {done.job.label} failed on a worker: {error}")
            _, cell_conf, bench, todo, heldout = pending[done.job.request.key]
            self._store(cell_conf, bench, done.result, heldout)
            self.remote_samples += len(todo)

    def _store(self, cell_conf: dict, bench: BenchConfig, result: CellResult, heldout: bool = False) -> None:
        """Store a result's samples with the cell's metrics (its batch-1 timing measured first when it is new)."""
        spec, key = result.request.spec, result.request.key
        batch1 = {} if self.store.has(key) else self._batch1(spec, bench, heldout)
        store_result(self.store, result, cell_conf, self.speed(spec), batch1, self.dynamic, run_id=self.run_id,
                     tune=True)
        self.sample_seconds += result.sample_wall_s
        self.samples_run += len(result.rows)
        self.tokens_run += sum(r.tokens for r in result.rows)

    def _batch1(self, spec: CellSpec, bench: BenchConfig, heldout: bool) -> dict:
        """A new cell's batch-1 timing (objective measured-bs1, or a held-out cell under confirm_timing)."""
        timed = self.config.objective == "measured-bs1" or (heldout and self.config.confirm_timing)
        if not timed or spec.method == AR:
            return {}
        import torch
        with torch.inference_mode():
            return time_batch1(spec, self.grid.task(self.config.task), *self.grid.pair(spec), bench, self.pivot_fn)

    def speed(self, spec: CellSpec) -> dict:
        """The bench's measured c_rel / c_block of the cell's (verifier, drafter, N), measured once, with every
        N of the search (one c_rel for all of them); with c_pivot_measured when the search has a rule that reads
        the pivot classifier."""
        if spec.method == AR:
            return {}
        key = (spec.verifier, spec.drafter, spec.draft_length)
        if key not in self._speed:  # every N of the search (and this one) in one interleaved measurement
            lengths = dict.fromkeys([*self.config.draft_lengths, spec.draft_length])
            cells, pivot_fn = [replace(spec, draft_length=n) for n in lengths], None
            if self.classifier_rule is not None:  # and the classifier's call (c_pivot) in the same rounds
                cells += [replace(c, method=self.classifier_rule, params={}) for c in cells]
                pivot_fn = self.pivot_fn
            self._speed.update(speed_constants(self.grid.models, cells, drafters=self.grid.drafters,
                                               dynamic=self.dynamic, pivot_fn=pivot_fn))
        return self._speed[key]

    @property
    def dynamic(self) -> bool:
        """Whether every configuration's drafts per round vary (a confidence stop), not only N "auto"'s."""
        return self.config.draft_confidence is not None

    def speed_constants(self, config: Config) -> tuple[float, float]:
        """(c_rel, c_block) of the configuration's N: the given ones, or measured for the pair."""
        measured = self.speed(self.spec(config))
        return (self.config.c_rel or measured["c_rel_measured"],
                self.config.c_block or measured["c_block_measured"])

    def c_pivot(self, config: Config) -> float:
        """The pivot classifier's call per round / verifier step at the configuration's N, measured with the
        other constants, for a rule that reads a classifier; 0 for the others."""
        return classifier_cost(config.method, self.speed(self.spec(config)).get("c_pivot_measured"))

    def priced_round(self, config: Config, heldout: bool) -> tuple[float, float, float]:
        """(drafts, c_rel, c_block) the speed objectives price a round of the configuration at (objective.priced_round:
        N, or the cell's mean drafts per round when they vary); a given c_block wins."""
        c_rel, c_block = self.speed_constants(config)
        cell = self.store.get(self.key(self.spec(config), heldout)[0])
        n, model_c_block = priced_round(config.draft_length, cell.metrics if cell else {}, c_block, self.dynamic)
        return n, c_rel, self.config.c_block or model_c_block

    def used(self, wanted: list) -> tuple[int, int]:
        """(samples, generated tokens) of the stored rows [(spec, heldout, jobs)] names (each cell's rows among
        its jobs): what a run read, whether it generated them now or found them stored."""
        samples = tokens = 0
        for spec, heldout, jobs in wanted:
            wanted_jobs = set(jobs)
            mine = [r for r in self.store.rows(self.key(spec, heldout)[0]) if (r.prompt_index, r.repeat) in wanted_jobs]
            samples, tokens = samples + len(mine), tokens + sum(r.tokens for r in mine)
        return samples, tokens

    def batch1_speedup(self, spec: CellSpec, heldout: bool) -> float | None:
        cell = self.store.get(self.key(spec, heldout)[0])
        return (cell.metrics.get("batch1") or {}).get("measured_speedup_batch1") if cell else None

    def close(self) -> None:
        self.store.close()


__all__ = ["Cells"]

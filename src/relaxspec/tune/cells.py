"""Tune's cells in the bench store: the samples a configuration's cell lacks run (here or on an executor's
workers, as bench cell requests) and are stored before the race reads them, so an interrupted tune resumes
without re-running any."""

from __future__ import annotations

from dataclasses import replace

from relaxspec.acceptance import RULES, is_greedy
from relaxspec.bench import CellSpec, Workbench, Wanted, methods
from relaxspec.names import AR
from relaxspec.tune.objective import priced_round
from relaxspec.tune.space import Config


def cell_spec(tune, verifier: str, drafter: str, config: Config | None) -> CellSpec:
    """The bench cell of a configuration (None: AR) in a tune run's settings (`tune`: a run.TuneConfig)."""
    if config is None:
        return CellSpec(verifier, None, tune.task, AR, {}, 0, tune.seed)
    return CellSpec(verifier, drafter, tune.task, config.method, config.params_dict, config.draft_length, tune.seed)


def reference(tune, config: Config) -> Config | None:
    """The configuration whose samples `config`'s drop is measured against: strict at its N (a strict configuration
    is its own); at temperature 0 AR (None), whose tokens strict's are (strict keeps only the verifier's argmax, and
    its greedy path is tested token-identical to AR's), so there a relaxed configuration needs no strict cell."""
    if config.is_strict:
        return config
    return None if is_greedy(tune.temperature) else config.strict


def arm_cells(tune, config: Config) -> list:
    """The cells a configuration's arm reads (Config, None: AR), each once: its own, its reference's, and AR's for
    the length-adjusted objective."""
    return list(dict.fromkeys([config, reference(tune, config), *([None] if tune.objective == "length-adjusted"
                                                                    else [])]))


def band(tune, heldout: bool) -> dict:
    """What a cell's config says of its prompts: the search band's limit (its cells are the bench's own, with
    --limit search_prompts), or the held-out band (prompts a bench's own cells, a prefix of the task, never see)."""
    if heldout:
        return {"prompts": f"held-out {tune.search_prompts}..{tune.search_prompts + tune.heldout_prompts - 1}"}
    return {"limit": tune.search_prompts}


class Cells:
    """Tune's cells in the bench store, through one workbench: run the samples a cell lacks, read what it has.
    `config`: the run's settings, a run.TuneConfig (run.py builds on this module, so it is not imported here);
    `executor`: where `prefetch` runs a rung's cells (None: none, `ensure` runs each in this process); `pace`, if
    given, is called with [(spec, samples it lacks)] before any cell runs, and may raise to stop the run there."""

    def __init__(self, config, executor=None, pace=None):
        config.resolve_bands()
        self.config = config
        self.pace = pace
        self.prefetches = executor is not None
        self.remote_samples = 0  # samples run on the executor's workers
        # the settings every sample runs with (the search and held-out bands differ only in the prompts they key)
        bench = config.bench_config(config.search_prompts + config.heldout_prompts)
        self.verifier, self.drafter = bench.verifiers[0], bench.drafters[0]
        self.workbench = Workbench(bench, executor=executor, speed_cells=self._speed_cells)
        self.store = self.workbench.store
        try:
            # the rules that read a pivot classifier (declared), in the space searched
            names = list(RULES) if config.methods is None else [m.split(":")[0].strip() for m in config.methods]
            classifier_rules = [m for m in names if m in RULES and methods.needs_classifier(m)]
            probe = [CellSpec(self.verifier, self.drafter, config.task, classifier_rules[0], {}, 1, config.seed)] \
                if classifier_rules else []
            self.pad_fits = bool(self.workbench.runnable(probe)[0])  # the classifier loads once, when a rule reads it
            self.classifier_rule = classifier_rules[0] if self.pad_fits else None  # whose cells c_pivot is measured for
            self.all_examples = self.workbench.runner.task(config.task).examples
            if len(self.all_examples) < config.search_prompts + config.heldout_prompts:
                raise ValueError(f"tune: task {config.task!r} has {len(self.all_examples)} prompts; it needs "
                                 f"{config.search_prompts} search + {config.heldout_prompts} held-out ones")
        except BaseException:
            self.workbench.close()
            raise
        self.sample_seconds, self.samples_run, self.tokens_run = 0.0, 0, 0

    def spec(self, config: Config | None) -> CellSpec:
        """The bench cell of a configuration (None: AR)."""
        return cell_spec(self.config, self.verifier, self.drafter, config)

    def band(self, heldout: bool) -> dict:
        return band(self.config, heldout)

    def key(self, spec: CellSpec, heldout: bool) -> str:
        return self.workbench.key(spec, **self.band(heldout))

    def wanted(self, spec: CellSpec, jobs: list[tuple[int, int]], heldout: bool) -> Wanted:
        """The jobs (prompt, repeat) of a cell, in generate calls of the run's batch size (default: one call); a new
        cell's batch-1 timing measured first when the objective or the confirmation reads it."""
        timed = self.config.objective == "measured-bs1" or (heldout and self.config.confirm_timing)
        return Wanted(spec, jobs, self.band(heldout), self.config.batch_size or len(jobs), timed)

    def ensure(self, spec: CellSpec, jobs: list[tuple[int, int]], heldout: bool = False) -> dict:
        """Run the jobs (prompt, repeat) the cell lacks in this process, store them; return all its rows
        {(prompt, repeat): Row}."""
        wanted = self.wanted(spec, jobs, heldout)
        self._paced([wanted])  # (again between its generate calls: a part stops within a cell, its calls stored)
        result = self.workbench.ensure(wanted, between=lambda: self._paced([wanted]), run_id=self.workbench.run_id,
                                       tune=True)
        if result is not None:
            self._count(result)
        return {(r.prompt_index, r.repeat): r for r in self.store.rows(self.key(spec, heldout))}

    def prefetch(self, wanted: list[tuple[CellSpec, list[tuple[int, int]], bool]]) -> None:
        """Run the samples the given cells lack on the executor (Ray workers: each keeps a CellRunner with the pair
        loaded across its jobs), all at once; the driver stores each cell's samples as they come back. Without an
        executor, `ensure` runs them one cell at a time."""
        if not self.prefetches:
            return
        wanted = [self.wanted(spec, jobs, heldout) for spec, jobs, heldout in wanted]
        self._paced(wanted)
        done = self.workbench.ensure_all(wanted, run_id=self.workbench.run_id, tune=True)
        for result, metrics in done:
            if metrics is None:
                raise ValueError(f"tune: cell {result.request.spec.label} failed on a worker: {result.error}")
            self._count(result)
            self.remote_samples += len(result.rows)

    def _paced(self, wanted: list) -> None:
        if self.pace is not None:
            lacking = [(w.spec, len(self.workbench.missing(w))) for w in wanted]
            if any(n for _, n in lacking):
                self.pace(lacking)

    def _count(self, result) -> None:
        self.sample_seconds += result.sample_wall_s
        self.samples_run += len(result.rows)
        self.tokens_run += sum(r.tokens for r in result.rows)

    def _speed_cells(self, spec: CellSpec) -> list[CellSpec]:
        """The cells whose speed constants are measured with a cell's, once: every N of the search (and the cell's;
        one c_rel for all of them), and the classifier's call (c_pivot) at each when the search has a rule that
        reads it."""
        lengths = dict.fromkeys([*self.config.draft_lengths, spec.draft_length])
        cells = [replace(spec, draft_length=n) for n in lengths]
        if self.classifier_rule is not None:
            cells += [replace(c, method=self.classifier_rule, params={}) for c in cells]
        return cells

    def speed(self, spec: CellSpec) -> dict:
        """The bench's measured c_rel / c_block of the cell's (verifier, drafter, N) (`_speed_cells`); {} for AR."""
        return self.workbench.speed_of(spec)

    @property
    def dynamic(self) -> bool:
        """Whether every configuration's drafts per round vary (a confidence stop), not only N "auto"'s."""
        return self.workbench.dynamic

    def speed_constants(self, config: Config) -> tuple[float, float]:
        """(c_rel, c_block) of the configuration's N: the given ones, or measured for the pair."""
        measured = self.speed(self.spec(config))
        return (self.config.c_rel or measured["c_rel_measured"],
                self.config.c_block or measured["c_block_measured"])

    def c_pivot(self, config: Config) -> float:
        """The pivot classifier's call per round / verifier step at the configuration's N, measured with the
        other constants, for a rule that reads a classifier; 0 for the others."""
        return methods.classifier_cost(config.method, self.speed(self.spec(config)).get("c_pivot_measured"))

    def priced_round(self, config: Config, heldout: bool) -> tuple[float, float, float]:
        """(drafts, c_rel, c_block) the speed objectives price a round of the configuration at (objective.priced_round:
        N, or the cell's mean drafts per round when they vary); a given c_block wins."""
        c_rel, c_block = self.speed_constants(config)
        cell = self.store.get(self.key(self.spec(config), heldout))
        n, model_c_block = priced_round(config.draft_length, cell.metrics if cell else {}, c_block, self.dynamic)
        return n, c_rel, self.config.c_block or model_c_block

    def used(self, wanted: list) -> tuple[int, int]:
        """(samples, generated tokens) of the stored rows [(spec, heldout, jobs)] names (each cell's rows among
        its jobs): what a run read, whether it generated them now or found them stored."""
        samples = tokens = 0
        for spec, heldout, jobs in wanted:
            wanted_jobs = set(jobs)
            mine = [r for r in self.store.rows(self.key(spec, heldout)) if (r.prompt_index, r.repeat) in wanted_jobs]
            samples, tokens = samples + len(mine), tokens + sum(r.tokens for r in mine)
        return samples, tokens

    def batch1_speedup(self, spec: CellSpec, heldout: bool) -> float | None:
        cell = self.store.get(self.key(spec, heldout))
        return (cell.metrics.get("batch1") or {}).get("measured_speedup_batch1") if cell else None

    def close(self) -> None:
        self.workbench.close()


__all__ = ["Cells", "cell_spec", "band", "reference", "arm_cells"]

"""Running `relaxspec tune`: the race over real cells of the bench store, then the held-out confirmation.

Prompts: the task's first `search_prompts` examples are the search prompts (exactly the prompts of a bench
run with --limit search_prompts, so the search cells are the bench's own cells and `bench` / `report` reuse
them); the next `heldout_prompts` examples are the held-out prompts. The built-in synthetic test split is a
seeded random stream of distinct problems, so both parts are random draws of the same distribution; a JSONL
file is used in its order (shuffle it first if it is sorted).

A configuration's sample j (the race's first n samples) is (prompt j mod L, repeat j div L), with the bench's
coupled seed derive_seed(seed, prompt, repeat); strict at the same N and AR get the same samples. A relaxed
configuration's drop is measured against strict at its N, or at temperature 0 against AR, whose tokens strict's are
(cells.reference; the space there holds only points that can differ from strict: space.search_space). Each
evaluation stores what it ran in the bench store before the race goes on, so an interrupted tune resumes
without re-running any stored sample.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

from relaxspec.acceptance import is_greedy
from relaxspec.acceptance.random import check_seed
from relaxspec.bench import BenchConfig, make_executor, methods, settings, stats
from relaxspec.names import AR
from relaxspec.tune.cells import Cells, arm_cells, reference
from relaxspec.tune.objective import OBJECTIVES, speed_interval
from relaxspec.tune.racing import ALPHA, DEFAULT_SIZES, Race, default_caps, race, validate_schedule
from relaxspec.tune.space import DEFAULT_DRAFT_LENGTHS, Config, make_config, search_space

DEFAULT_OUT = "relaxspec-tune"
DEFAULT_MAX_DROP = 0.02
DEFAULT_BUDGET_MINUTES = 11.0
DEFAULT_SEARCH_PROMPTS = 240  # the last rung's 240 samples on distinct prompts (repeats are clustered: worth less)
DEFAULT_HELDOUT_PROMPTS = 240  # which a bench's later looks never draw (its setting heldout_band)
DEFAULT_HELDOUT_REPEATS = 1


@dataclass
class TuneConfig:
    verifier: str | None = None  # None: the built-in default pair
    drafter: str | None = None
    task: str = "arithmetic"
    max_drop: float = DEFAULT_MAX_DROP
    objective: str = "length-adjusted"
    c_rel: float | None = None  # None: measured for the pair
    c_block: float | None = None  # None: measured for the pair at each N
    methods: list[str] | None = None  # None: every rule (PAD when a classifier fits the pair)
    draft_lengths: list[int | str] = field(default_factory=lambda: list(DEFAULT_DRAFT_LENGTHS))  # "auto" among them
    draft_confidence: float | None = None  # every configuration: the engine's confidence stop (None: off)
    budget_minutes: float = DEFAULT_BUDGET_MINUTES  # the search's wall time; the confirmation runs after it
    search_prompts: int | None = None  # None: DEFAULT_SEARCH_PROMPTS, or the task's size split (prompt_bands)
    heldout_prompts: int | None = None  # None: DEFAULT_HELDOUT_PROMPTS, or the rest of the task (prompt_bands)
    heldout_repeats: int = DEFAULT_HELDOUT_REPEATS
    sizes: tuple = DEFAULT_SIZES  # samples per configuration at each rung
    caps: tuple | None = None  # configurations going on after each rung but the last (None: racing.default_caps)
    seed: int = 0
    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = 0.95
    max_new_tokens: int = 160
    speed_prompts: int = 10  # batch-1 timing prompts (objective measured-bs1 only)
    pad_classifier: str | None = None
    phase: str | None = None  # relax only inside a span (bench.phase): None, "task", "think" or "BEGIN..END"
    out: str = DEFAULT_OUT
    compile: bool = False  # load_model(compile=True) for the bench cells (models/compiled.py)
    device: str | None = None  # load_model's, for the bench cells (None: the default)
    dtype: str | None = None
    confirm_timing: bool = False  # held-out cells get batch-1 timing too (measured x b1 of the confirmation)
    batch_size: int | None = None  # samples per generate call of a cell (None: all it lacks at once)
    fixed_bands: bool = False  # the held-out band starts after all search_prompts even when the race reads fewer
    # (a protocol's bands: tune.protocol), instead of right after the prompts the race reads

    def validate(self) -> None:
        settings.check_settings_types(
            self, "tune", {"methods": str, "draft_lengths": (int, str)},
            {**{name: float for name in ("max_drop", "c_rel", "c_block", "budget_minutes", "temperature", "top_p",
                                         "draft_confidence")},
             **{name: int for name in ("seed", "top_k", "max_new_tokens", "speed_prompts")},
             **{name: str for name in ("verifier", "drafter", "task", "objective", "out", "phase", "pad_classifier",
                                       "device", "dtype")}})
        if self.methods is not None and not [m for m in self.methods if m.split(":", 1)[0].strip() != AR]:
            raise ValueError("tune: methods name nothing to search (ar is the speed reference, not searched; "
                             "strict is always searched: name rules, or strict alone to pick its N)")
        settings.check_out_dir(self.out, "--out")
        settings.check_sampling_setting(self, "tune")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"tune: unknown objective {self.objective!r}; known: {', '.join(OBJECTIVES)}")
        if not 0 <= self.max_drop < 1:
            raise ValueError(f"tune: max drop must lie in [0, 1), got {self.max_drop}")
        for name in ("c_rel", "c_block"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"tune: {name.replace('_', '-')} must be a finite number > 0 or 'measured', got {value}")
        for name in ("search_prompts", "heldout_prompts", "heldout_repeats"):
            value = getattr(self, name)
            if value is None and name != "heldout_repeats":
                continue
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"tune: {name.replace('_', ' ')} must be a positive integer, got {value!r}")
        check_seed(self.seed, "tune: seed")
        if self.budget_minutes is None or not self.budget_minutes > 0:
            raise ValueError(f"tune: budget must be > 0 minutes (inf: no budget), got {self.budget_minutes}")
        if self.caps is None:
            self.caps = default_caps(self.sizes)
        validate_schedule(self.sizes, self.caps)
        if self.search_prompts is not None and self.search_prompts > max(self.sizes) and not self.fixed_bands:
            warnings.warn(f"tune: search prompts {self.search_prompts}: the race reads at most {max(self.sizes)} "
                          f"samples of a configuration (its last rung), so the first {max(self.sizes)} prompts are "
                          "searched and the held-out prompts follow them", stacklevel=2)
            self.search_prompts = max(self.sizes)
        settings.check_phase_setting(self.phase, [self.task])
        settings.check_draft_confidence_setting(self.draft_confidence, "tune")

    def resolve_bands(self) -> None:
        """Fix the search and held-out bands not given to the task's size (prompt_bands); loads the task."""
        if self.search_prompts is None or self.heldout_prompts is None:
            self.search_prompts, self.heldout_prompts = prompt_bands(task_pool(self.task), self.search_prompts,
                                                                     self.heldout_prompts)

    def bench_config(self, limit: int) -> BenchConfig:
        """The bench settings of tune's cells (`limit`: the prompts the cells draw from)."""
        from relaxspec.models.family import DEFAULT_DRAFTER, DEFAULT_VERIFIER
        return BenchConfig(verifiers=[self.verifier or DEFAULT_VERIFIER], drafters=[self.drafter or DEFAULT_DRAFTER],
                           tasks=[self.task], seeds=[self.seed], limit=limit, temperature=self.temperature,
                           top_k=self.top_k, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
                           speed_prompts=self.speed_prompts, pad_classifier=self.pad_classifier, out=str(self.out),
                           compile=self.compile, phase=self.phase, draft_confidence=self.draft_confidence,
                           device=self.device, dtype=self.dtype)


def prompt_bands(pool: int | None, search: int | None, heldout: int | None) -> tuple[int, int]:
    """(search prompts, held-out prompts) for a task of `pool` examples (None: unlimited, a synthetic task). Each
    band not given is DEFAULT_SEARCH_PROMPTS / DEFAULT_HELDOUT_PROMPTS when both fit the task; otherwise the task
    is split: half (rounded up) searched, the rest held out (HumanEval's 164: 82 + 82), or a band given takes
    its prompts and the other band the rest. ValueError (one line) when the task cannot hold both bands."""
    want_search = DEFAULT_SEARCH_PROMPTS if search is None else search
    want_heldout = DEFAULT_HELDOUT_PROMPTS if heldout is None else heldout
    if pool is None or pool >= want_search + want_heldout or (search is not None and heldout is not None):
        bands = want_search, want_heldout
    elif search is None and heldout is None:
        bands = pool - pool // 2, pool // 2
    elif search is None:
        bands = pool - heldout, heldout
    else:
        bands = search, pool - search
    if pool is not None and (min(bands) < 1 or sum(bands) > pool):
        raise ValueError(f"tune: the task has {pool} prompts; it cannot hold {bands[0]} search + {bands[1]} held-out "
                         "ones (set --search-prompts / --heldout-prompts within it)")
    return bands


def task_pool(spec: str) -> int | None:
    """How many prompts the task offers (None: a synthetic task, which draws as many as asked)."""
    from relaxspec.tasks import get_task, synthetic
    return None if spec in synthetic.GENERATORS else len(get_task(spec).examples)


def serviceable(space: list[Config], cells: Cells) -> list[Config]:
    """The configurations whose rule the pair's drafter can serve (Drafter.check); a warning names the rest."""
    from relaxspec.acceptance import get_rule
    verifier, drafter = cells.workbench.runner.pair(cells.spec(space[0]))
    kept, refused = [], {}
    for c in space:
        try:
            drafter.check(verifier, get_rule(c.method))
            kept.append(c)
        except ValueError as e:
            refused.setdefault(c.method, str(e))
    if refused:
        warnings.warn(f"tune: {', '.join(refused)} left out: the drafter {cells.drafter!r} cannot serve them "
                      f"({next(iter(refused.values()))})", stacklevel=2)
    return kept


def search_jobs(n: int, prompts: int) -> list[tuple[int, int]]:
    """The first n samples of a search cell: (prompt j mod L, repeat j div L)."""
    return [(j % prompts, j // prompts) for j in range(n)]


def heldout_jobs(search_prompts: int, heldout_prompts: int, repeats: int) -> list[tuple[int, int]]:
    """Every held-out prompt (the examples after the search prompts) at each repeat."""
    return [(search_prompts + i, r) for r in range(repeats) for i in range(heldout_prompts)]


class CellArm:
    """A configuration's rows next to strict's at its N and AR's: what the race reads (racing.Arm)."""

    def __init__(self, cells: Cells, config: Config, jobs, heldout: bool = False):
        self.config = config
        tc = cells.config
        wanted = set(jobs)
        rows = {c: {k: v for k, v in cells.ensure(cells.spec(c), jobs, heldout).items() if k in wanted}
                for c in arm_cells(tc, config)}
        self.rows, self.strict_rows, self.ar_rows = rows[config], rows[reference(tc, config)], rows.get(None)
        self.draft_length, self.c_rel, self.c_block = cells.priced_round(config, heldout)
        self.c_pivot = cells.c_pivot(config)
        self.extra = methods.extra_draft_passes(config.method)
        self.objective = tc.objective
        timed = tc.objective == "measured-bs1" or (heldout and tc.confirm_timing)
        self.batch1 = cells.batch1_speedup(cells.spec(config), heldout) if timed else None

    def diff(self, confidence: float) -> stats.Interval:
        if self.config.is_strict:
            return stats.Interval(0.0, 0.0, 0.0, len(self.rows), confidence)
        return stats.paired_diff_interval({k: r.utility for k, r in self.rows.items()},
                                          {k: r.utility for k, r in self.strict_rows.items()}, confidence)

    def speed(self, confidence: float) -> stats.Interval:
        return speed_interval(self.objective, self.rows, self.ar_rows, self.draft_length, self.extra,
                              self.c_rel, self.c_block, confidence, self.batch1, self.c_pivot)

    def identical(self) -> float:
        keys = set(self.rows) & set(self.strict_rows)
        return sum(self.rows[k].token_hash == self.strict_rows[k].token_hash for k in keys) / len(keys) if keys \
            else math.nan


@dataclass
class Confirmation:
    choice: CellArm
    strict_best: CellArm | None  # strict at its best search N (None when that is the choice)
    samples: int
    drop_held: bool  # upper 95% bound of the held-out drop vs strict <= max_drop
    speed_held: bool  # held-out speed interval reaches the search's lower bound (not significantly slower)
    beats_strict: bool | None  # held-out speed point estimate above strict at its best N's


@dataclass
class TuneResult:
    config: TuneConfig
    space: list
    race: Race
    confirmation: Confirmation | None
    search_samples: int  # generated by this run (a resumed run finds the rest stored)
    search_tokens: int
    confirm_samples: int
    confirm_tokens: int
    wall_s: float
    remote_samples: int = 0  # of the search's samples, those run on executor (Ray) workers
    search_used: tuple = (0, 0)  # (samples, tokens) the race read, generated now or before: a fresh run's cost
    confirm_used: tuple = (0, 0)
    toml_path: str = ""
    plot_path: str = ""

    @property
    def choice(self) -> Config | None:
        return self.race.choice


def least_drop_bound(samples: int) -> float:
    """The least upper 95 % bound of a drop vs the reference that `samples` paired samples can show: every output
    identical, each on a prompt of its own. A budget below it at the last rung can choose no relaxed configuration."""
    same = {(i, 0): 0.0 for i in range(samples)}
    return -stats.paired_diff_interval(same, same, 1 - ALPHA).low


def best_strict(result: Race) -> Config | None:
    strict = [r for c, r in result.records.items() if c.is_strict and r.speed is not None
              and not math.isnan(r.speed.mean)]
    return max(strict, key=lambda r: r.speed.mean).config if strict else None


def run_tune(config: TuneConfig, progress: bool = True, executor=None, pace=None) -> TuneResult:
    """Search, then confirm on held-out prompts (see the module doc). Interrupting it loses only the cell calls
    in flight; re-running the same command resumes from the store. `executor` (relaxspec.bench.ExecutorOptions,
    kind "ray"): each rung's missing samples run on Ray workers at once, the driver storing them. `pace`: called
    before any cell runs (cells.Cells), it may stop the run there by raising."""
    from tqdm import tqdm

    config.validate()
    t0 = time.perf_counter()
    pool = make_executor(executor) if executor is not None and executor.kind != "local" else None
    cells = Cells(config, pool, pace)
    try:
        space = search_space(config.methods, config.draft_lengths, with_classifier=cells.pad_fits,
                             greedy=is_greedy(config.temperature))
        if config.methods is None and not cells.pad_fits:
            warnings.warn("tune: pad left out (no PAD classifier fits this pair; pass --pad-classifier)",
                          stacklevel=2)
        if config.methods is None:  # every rule: those the drafter cannot serve (e.g. q-reading ones on prompt lookup)
            space = serviceable(space, cells)
        budget_s = config.budget_minutes * 60
        L = config.search_prompts
        bar = tqdm(total=0, desc="tune", unit="cfg", disable=not progress, dynamic_ncols=True)

        def evaluate(c: Config, n: int) -> CellArm:
            bar.set_postfix_str(f"{c.label} n={n}", refresh=False)
            arm = CellArm(cells, c, search_jobs(n, L))
            bar.update(1)
            return arm

        def fits(alive: list, n: int) -> bool:
            """The rung's new samples (alive configurations, their strict references and AR go from the last
            rung's size to n) at the mean seconds per sample so far (an overestimate: larger batches cost less
            per sample) fit the rest of the budget."""
            per_sample = cells.sample_seconds / max(1, cells.samples_run)
            previous = config.sizes[config.sizes.index(n) - 1]
            new = (n - previous) * len(rung_cells(alive))
            return time.perf_counter() - t0 + per_sample * new <= budget_s

        def rung_cells(alive: list) -> list:
            return list(dict.fromkeys(cell for c in alive for cell in arm_cells(config, c)))

        def prefetch(alive: list, n: int) -> None:
            cells.prefetch([(cells.spec(c), search_jobs(n, L), False) for c in rung_cells(alive)])

        def on_rung(rung: int, alive: list) -> None:
            if rung + 1 < len(config.sizes):
                bar.reset(total=len(alive))
                bar.set_description(f"tune rung {rung + 2}/{len(config.sizes)}")

        bar.reset(total=len(space))
        bar.set_description(f"tune rung 1/{len(config.sizes)}")
        result = race(space, evaluate, config.max_drop, lambda c: c.is_strict, sizes=config.sizes, caps=config.caps,
                      alpha=ALPHA, fits=fits, on_rung=on_rung, reference_of=lambda c: reference(config, c),
                      prefetch=prefetch)
        bar.close()
        search_samples, search_tokens = cells.samples_run, cells.tokens_run
        confirmation = confirm(cells, result, config) if result.choice is not None else None
        return TuneResult(config, space, result, confirmation, search_samples, search_tokens,
                          cells.samples_run - search_samples, cells.tokens_run - search_tokens,
                          time.perf_counter() - t0, cells.remote_samples,
                          search_used=cells.used(search_cells_read(cells, result, L)),
                          confirm_used=cells.used(confirmation_cells_read(cells, confirmation, config)))
    finally:
        cells.close()
        if pool is not None:
            pool.close()


def search_cells_read(cells: Cells, result: Race, prompts: int) -> list:
    """[(spec, False, jobs)] of every search cell the race read: a configuration's samples at its last rung,
    its reference's and AR's (length-adjusted objective) at the largest rung they were read with (cells.arm_cells)."""
    need: dict = {}
    for c, rec in result.records.items():
        for cell in arm_cells(cells.config, c) if rec.samples else ():
            need[cell] = max(need.get(cell, 0), rec.samples)
    return [(cells.spec(c), False, search_jobs(n, prompts)) for c, n in need.items()]


STRICT_SPEED_JOBS = 80  # held-out samples of a strict configuration at T = 0, read for its speed alone


def confirmation_jobs(config: TuneConfig, arm: Config) -> list:
    """The held-out jobs a configuration's confirmation reads: every one; at T = 0 a strict configuration's first
    STRICT_SPEED_JOBS (each part of a mixed band in proportion: tasks.mix). Its tokens are AR's (tested), whose cell
    reads every job, so it is read for its speed alone (tokens per round), which that many answers settle."""
    jobs = heldout_jobs(config.search_prompts, config.heldout_prompts, config.heldout_repeats)
    return jobs[:STRICT_SPEED_JOBS] if arm.is_strict and is_greedy(config.temperature) else jobs


def confirmation_cells_read(cells: Cells, confirmation: Confirmation | None, config: TuneConfig) -> list:
    """[(spec, True, jobs)] of the held-out cells the confirmation read."""
    if confirmation is None:
        return []
    arms = [confirmation.choice] + ([confirmation.strict_best] if confirmation.strict_best else [])
    read = {}
    for arm in arms:
        jobs = confirmation_jobs(config, arm.config)
        for c in arm_cells(config, arm.config):
            read[c] = max(read.get(c, []), jobs, key=len)
    return [(cells.spec(c), True, jobs) for c, jobs in read.items()]


def confirm(cells: Cells, result: Race, config: TuneConfig) -> Confirmation:
    """Re-run the choice, its reference (strict at its N; at T = 0 AR: cells.reference), strict at strict's best
    search N and AR on the held-out prompts (a strict configuration at T = 0: `confirmation_jobs`); say whether the
    drop and the speed-up held."""
    choice = result.choice
    arm = CellArm(cells, choice, confirmation_jobs(config, choice), heldout=True)
    strict = best_strict(result)
    strict_arm = CellArm(cells, strict, confirmation_jobs(config, strict), heldout=True) \
        if strict is not None and strict != choice else None
    diff = arm.diff(1 - ALPHA)
    speed = arm.speed(1 - ALPHA)
    searched = result.records[choice].speed
    return Confirmation(
        choice=arm, strict_best=strict_arm, samples=len(arm.rows),
        drop_held=choice.is_strict or diff.low >= -config.max_drop,
        speed_held=not (speed.high < searched.low),
        beats_strict=None if strict_arm is None else speed.mean > strict_arm.speed(1 - ALPHA).mean)


__all__ = ["prompt_bands", "TuneConfig", "TuneResult", "Confirmation", "run_tune", "search_jobs", "heldout_jobs",
           "confirmation_jobs", "STRICT_SPEED_JOBS",
           "make_config", "least_drop_bound"]

"""One bench cell: what it is (`CellSpec`), what decides its samples (`cell_config`, hashed into its key), how
its samples are generated and scored (`CellRunner.run`), and the one way every worker runs cells (`run_cell` on a
`CellRequest`, giving a `CellResult`: a workbench's executor in the driver, a local pool worker, a Ray worker). Also
the speed constants (`speed_constants`) and batch-1 timing (`time_batch1_cells`) a workbench measures.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import statistics
import time
from dataclasses import dataclass

from relaxspec.bench.config import BenchConfig
from relaxspec.bench.methods import needs_classifier
from relaxspec.bench.names import AR, AUTO, STRICT, method_label
from relaxspec.bench.sampling import prompts_needed, samples_at
from relaxspec.bench.settings import phase_options
from relaxspec.bench.store import Row, token_hash
from relaxspec.bench.versions import code_version, file_version, model_version


@dataclass
class CellSpec:
    verifier: str
    drafter: str | None  # None for AR
    task: str
    method: str
    params: dict
    draft_length: int | str  # 0 for AR; "auto": the engine's per-sequence schedule
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


@dataclass
class CellRequest:
    """Samples to add to one cell: `samples` (prompt index, repeat), `batch_size` per generate call (None: the
    config's)."""
    spec: CellSpec
    key: str  # the cell's key in the store
    samples: list[tuple[int, int]]
    batch_size: int | None = None


@dataclass
class CellResult:
    """A request's new samples, scored (`rows`), the engine stats of each generate call (`parts`), the seconds
    they took (`sample_wall_s`) and their wall-clock start and end (`span`, time.time()); or, for a cell that
    raised for a reason of its own, its one-line `error` instead (nothing to store)."""
    request: CellRequest
    rows: list = dataclasses.field(default_factory=list)
    parts: list = dataclasses.field(default_factory=list)
    sample_wall_s: float = 0.0
    span: tuple = (0.0, 0.0)
    error: str | None = None


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
        "system": config.system, **({"compile": True} if config.compile else {}),  # absent when off: old keys hold
        # likewise the held-out band later looks skip, absent at its default
        **({"heldout_band": config.heldout_band} if config.heldout_band != BenchConfig.heldout_band else {}),
        # likewise (AR's too, though it drafts nothing: the report groups cells by it, AR with the others)
        **({"draft_confidence": config.draft_confidence} if config.draft_confidence is not None else {}),
        "pad_classifier": versions.get("pad_classifier") if needs_classifier(spec.method) else None,
        "code_version": versions["code"],
        **phase_options(config.phase, spec.task),
    }


def generate_samples(spec: CellSpec, prompts: list[str], seeds: list[int], verifier, drafter, config: BenchConfig,
              pivot_fn):
    from relaxspec.engine import generate
    extra = {"pivot_fn": pivot_fn} if needs_classifier(spec.method) else {}
    if config.draft_confidence is not None and spec.method != AR:
        extra["draft_confidence"] = config.draft_confidence
    return generate(verifier, drafter if spec.method != AR else None, prompts, method=spec.method,
                    draft_length=spec.draft_length if spec.method != AR else 1,
                    max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_k=config.top_k,
                    top_p=config.top_p, seed=seeds, **generation_options(config), **extra, **spec.params,
                    **phase_options(config.phase, spec.task))


def run_samples(spec: CellSpec, task, samples: list[tuple[int, int]], verifier, drafter, config: BenchConfig,
                pivot_fn=None, batch_size: int | None = None, on_call=None):
    """Generate the samples (example index, repeat), `batch_size` (default: the config's) per generate call;
    (rows, the engine stats of each call, as dicts). `on_call(rows, stats, seconds, more)`: after each call, its
    rows, its stats, its seconds and whether calls follow (e.g. to store them: workbench.ensure)."""
    from relaxspec.engine import derive_seed
    jobs = list(samples)
    batch = batch_size or config.batch_size
    rows, parts = [], []
    for start in range(0, len(jobs), batch):
        chunk, began = jobs[start:start + batch], time.perf_counter()
        out = generate_samples(spec, [task.examples[i].prompt for i, _ in chunk],
                        [derive_seed(spec.seed, i, r) for i, r in chunk], verifier, drafter, config, pivot_fn)
        parts.append(out.stats.as_dict())
        call = []
        for (i, r), res in zip(chunk, out.results):
            ex = task.examples[i]
            call.append(Row(prompt_index=i, repeat=r, prompt=ex.prompt, reference=ex.reference, response=res.text,
                            utility=task.score(res.text, ex.reference), tokens=len(res.token_ids),
                            stats={"mean_acceptance_length": res.stats.mean_acceptance_length,
                                   "truncated": len(res.token_ids) >= config.max_new_tokens},
                            token_hash=token_hash(res.token_ids)))
        rows += call
        if on_call is not None:
            on_call(call, parts[-1], time.perf_counter() - began, start + batch < len(jobs))
    return rows, parts


BATCH1_CELLS_PER_AR = 6  # batch-1 timing: AR runs again before every this many cells of a prompt


def time_batch1_cells(specs: list[CellSpec], task, pair, config: BenchConfig, pivot_fn=None) -> list[dict]:
    """Measured speed-up at batch 1 (latency) of speculative cells of one verifier, task and seed: the first
    `speed_prompts` prompts one at a time; per prompt, AR then up to BATCH1_CELLS_PER_AR cells, again for
    the next cells (the order within each such turn reversed every other prompt), so each cell's AR reference
    runs next to it and a drift of the machine's speed hits both; per-token seconds of each run, on the speed
    constants' clock (`step_clock`: on a CPU at one thread the thread's CPU time, which other processes'
    load does not inflate; else wall time); ratio of the medians (AR of the cell's turns / cell); with 4 prompts or more
    also `batch1_halves`, that ratio on the first and on the last half of the prompts (the host's drift while timing).
    `pair(spec)`: the cell's (verifier, drafter); `pivot_fn` goes to the cells whose rule needs it
    (generate_samples). One dict per spec."""
    from relaxspec.engine import derive_seed
    from relaxspec.models.hf import step_clock
    n = min(config.speed_prompts, len(task.examples))
    if n == 0 or not specs:
        return [{} for _ in specs]
    first = specs[0]
    ar = CellSpec(first.verifier, None, first.task, AR, {}, 0, first.seed)
    turns = [[ar, *specs[i:i + BATCH1_CELLS_PER_AR]] for i in range(0, len(specs), BATCH1_CELLS_PER_AR)]
    clock = step_clock(pair(first)[0].device)
    per_token = [[[] for _ in turn] for turn in turns]
    for i in range(n):
        for turn, times in zip(turns, per_token):
            for j in (range(len(turn)) if i % 2 == 0 else reversed(range(len(turn)))):
                cell = turn[j]
                verifier, drafter = pair(cell if cell is not ar else first)
                t0 = clock()
                out = generate_samples(cell, [task.examples[i].prompt], [derive_seed(first.seed, i, 0)], verifier,
                                       drafter, config, pivot_fn)
                times[j].append((clock() - t0) / max(1, len(out.results[0].token_ids)))
    out = []
    for times in per_token:
        ar_s = statistics.median(times[0])
        for cell_times in times[1:]:
            timed = {"batch1_prompts": n, "batch1_ar_s_per_token": ar_s, "batch1_s_per_token":
                     statistics.median(cell_times), "measured_speedup_batch1": _speedup(times[0], cell_times)}
            if n >= 4:  # the same figure on the first and on the last half of the prompts: how far the host drifted
                h = n // 2
                timed["batch1_halves"] = [_speedup(times[0][:h], cell_times[:h]),
                                          _speedup(times[0][h:], cell_times[h:])]
            out.append(timed)
    return out


def _speedup(ar_times: list[float], method_times: list[float]) -> float:
    """AR's median per-token time over the method's."""
    method_s = statistics.median(method_times)
    return statistics.median(ar_times) / method_s if method_s else float("nan")


def pad_classifier(config: BenchConfig):
    """(pivot_fn, version, spec) or (None, reason, None): the config's classifier, else the first shipped for one of
    its (verifier, drafter) pairs, else the built-in pair's."""
    try:
        import relaxspec.pivot as pivot
        path = (config.pad_classifier or pivot.shipped_for_names(itertools.product(config.verifiers, config.drafters))
                or pivot.builtin_classifier_path())
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
    """load_model keyword arguments the user set (--device, --dtype, --compile)."""
    return {k: v for k, v in (("device", config.device), ("dtype", config.dtype), ("compile", config.compile or None))
            if v is not None}


class CellRunner:
    """Models, tasks and the PAD classifier of a process that runs cells (the driver itself, or a pool worker)."""

    def __init__(self, config: BenchConfig, pivot_fn=None):
        self.config, self.pivot_fn, self.tasks = config, pivot_fn, {}

    # The models load when first read: a resumed run whose cells are all stored loads none (bench.runner.prepare).
    @functools.cached_property
    def models(self) -> dict:
        from relaxspec.models import load_model
        return {name: load_model(name, **model_options(self.config)) for name in dict.fromkeys(self.config.verifiers)}

    @functools.cached_property
    def drafters(self) -> dict:
        """Drafters of any kind (LM, MTP head, prompt lookup), loaded for each verifier: a head is bound to its own."""
        from relaxspec.drafters import load_drafter
        return {(v, d): load_drafter(d, self.models[v]) for v in self.models for d in dict.fromkeys(self.config.drafters)}

    def pair(self, spec: CellSpec) -> tuple:
        """(verifier, drafter or None for AR) of a cell."""
        return self.models[spec.verifier], self.drafters[(spec.verifier, spec.drafter)] if spec.drafter else None

    def task(self, name: str):
        from relaxspec.tasks import get_task
        if name not in self.tasks:  # every prompt a later look may add (bench.sampling)
            limit = self.config.limit and prompts_needed(self.config.limit, self.config.looks, self.config.heldout_band)
            self.tasks[name] = get_task(name, limit=limit)
        return self.tasks[name]

    def samples_at(self, name: str, look: int) -> list[tuple[int, int]]:
        """A cell's samples of task `name` after look `look` (bench.sampling)."""
        pool = len(self.task(name).examples)
        return samples_at(self.config.limit or pool, self.config.repeats, look, pool, self.config.heldout_band)

    def run(self, request: CellRequest, on_call=None) -> CellResult:
        """The request's samples, generated and scored (an error raises); `on_call`: run_samples'. Its batch-1
        timing is not measured here (the driver's: bench.workbench)."""
        import torch
        spec = request.spec
        task = self.task(spec.task)
        verifier, drafter = self.pair(spec)
        pivot_fn = self.pivot_fn if needs_classifier(spec.method) else None
        with torch.inference_mode():
            start, wall0 = time.time(), time.perf_counter()
            rows, parts = run_samples(spec, task, request.samples, verifier, drafter, self.config, pivot_fn,
                                      request.batch_size, on_call)
            sample_wall = time.perf_counter() - wall0
        return CellResult(request, rows, parts, sample_wall, (start, time.time()))

    def time_batch1(self, specs: list[CellSpec]) -> dict:
        """{spec.identity: batch-1 timing} of speculative cells (`time_batch1_cells`, AR shared per verifier,
        task and seed), in this process and its torch threads."""
        import torch
        groups: dict = {}
        for spec in specs:
            if spec.method != AR:
                groups.setdefault((spec.verifier, spec.task, spec.seed), []).append(spec)
        out = {}
        with torch.inference_mode():
            for group in groups.values():
                timed = time_batch1_cells(group, self.task(group[0].task), self.pair, self.config, self.pivot_fn)
                out.update((spec.identity, t) for spec, t in zip(group, timed))
        return out


_PROCESS: dict = {}  # this process's runner, across the cells it runs (a pool or Ray worker keeps its models)


def check_versions(versions: dict, config: BenchConfig) -> None:
    found = {"code": code_version(), **{m: model_version(m) for m in dict.fromkeys([*config.verifiers,
                                                                                   *config.drafters])}}
    for name, version in found.items():
        if version != versions.get(name):
            what = "relaxspec code" if name == "code" else f"model {name}"
            raise ValueError(f"{what} on this worker has version {version}, the driver's has {versions.get(name)} "
                             "(install the same relaxspec and model files on every node)")


def runner_key(config: BenchConfig, with_pad: bool | None = None) -> str:
    """What makes a process's CellRunner reusable for the next cell (`cell_runner`'s default key); `with_pad`
    None: whether a method of the config needs the PAD classifier."""
    if with_pad is None:
        with_pad = any(needs_classifier(m) for m, _ in config.method_specs())
    return repr((config, with_pad))


def cell_runner(config: BenchConfig, cache: dict | None = None, versions: dict | None = None,
                with_pad: bool | None = None) -> CellRunner:
    """This process's CellRunner for `config` (models, tasks, PAD classifier), made on first use and kept in
    `cache` (default: this process's own) as {"runner": ..., "runner_key": key} for the cells that follow.
    `versions`: the driver's code and model versions, checked before anything loads (a node with other code
    or weights fails its cells instead of storing them under the wrong key). `with_pad`: load the PAD
    classifier (default: when a method of the config needs it). The runner is reused while `runner_key` (the
    whole config) stays the same."""
    cache = _PROCESS if cache is None else cache
    if with_pad is None:
        with_pad = any(needs_classifier(m) for m, _ in config.method_specs())
    key = runner_key(config, with_pad)
    if cache.get("runner_key") != key:
        if versions is not None:
            check_versions(versions, config)
        cache["runner"] = CellRunner(config, pad_classifier(config)[0] if with_pad else None)
        cache["runner_key"] = key
    return cache["runner"]


def run_cell(request: CellRequest, config: BenchConfig, cache: dict | None = None, versions: dict | None = None,
             with_pad: bool | None = None) -> CellResult:
    """The request's samples, run by this process's runner for `config` (`cell_runner`, with `cache`, `versions`
    and `with_pad`): how the driver, a local pool worker and a Ray worker all run cells. A cell that raises for a
    reason of its own (e.g. a parameter out of range) gives its one-line error in the result instead, so the rest
    of the grid goes on (a runner that cannot start, e.g. other versions on this worker, raises)."""
    runner = cell_runner(config, cache, versions, with_pad)
    try:
        return runner.run(request)
    except Exception as e:  # noqa: BLE001 - reported per cell, never stored
        return CellResult(request, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


# Interleaved measurement rounds of the speed constants: up to SPEED_ROUNDS, or as many as SPEED_SECONDS of wall time
# allow (at least SPEED_MIN_ROUNDS), after SPEED_WARMUP rounds. On the built-in pair 200 rounds take 0.4 s and hold
# c_rel and c_block within about 1% from run to run (40 rounds: 3%), so the modelled S_blk beside `x b1` moves less.
SPEED_ROUNDS, SPEED_MIN_ROUNDS, SPEED_WARMUP, SPEED_SECONDS = 200, 40, 10, 20.0


def block_widths(n, dynamic: bool = False) -> list[int]:
    """The verifier block widths whose c_block a cell of draft length n needs: N + 1, and for a cell whose drafts
    per round vary ("auto", or any N with a confidence stop) the widths of 1, 3, 5, 7 and 10 drafts up to it, between
    which metrics.c_block_at interpolates at the cell's mean block width."""
    from relaxspec.engine.generate import AUTO_MAX

    top = AUTO_MAX + 1 if n == AUTO else n + 1
    if n != AUTO and not dynamic:
        return [top]
    return sorted({w for w in (2, 4, 6, 8) if w < top} | {top})


def speed_constants(models: dict, cells: list[CellSpec], rounds: int = SPEED_ROUNDS,
                    drafters: dict | None = None, dynamic: bool = False, pivot_fn=None) -> dict:
    """c_rel (drafter / verifier one-token step) and c_block (verifier (N+1)-token block / one-token step) per
    speculative cell's (verifier, drafter, N), measured once before any cell runs (N "auto", or `dynamic`: a
    confidence stop, also c_block_widths, [[width, c_block], ...] at `block_widths`): every forward they need
    (each verifier's step and blocks, each drafter's step) runs once per round, interleaved, and each
    constant is the median over rounds of the ratio within a round, so a load that comes and goes cancels out
    (`rounds` rounds, fewer where SPEED_SECONDS of them pass first: large models).
    `drafters` maps (verifier, drafter) to a loaded Drafter (CellRunner.drafters); without it every drafter is
    an LM in `models`. An LM drafter's step is its one-token forward; a drafter of another kind (MTP head,
    prompt lookup) is timed per drafted token through the drafter protocol (`draft_timer`, as `relaxspec
    models list` does), in the same rounds. With `pivot_fn`, a (verifier, drafter, N) of a cell whose rule reads a
    pivot classifier also gets c_pivot_measured: one pivot_fn call on an N-draft block (`pivot.pivot_timer`;
    N "auto": its most drafts) / one-token step, interleaved with the verifier's step in rounds of their own
    (bench.metrics counts it for those rules only)."""
    from relaxspec.models import measure_step_latencies, relative_costs
    from relaxspec.drafters import draft_timer
    keys = list(dict.fromkeys((c.verifier, c.drafter, c.draft_length) for c in cells if c.method != AR))
    if not keys:
        return {}
    classified = set() if pivot_fn is None else \
        {(c.verifier, c.drafter, c.draft_length) for c in cells if needs_classifier(c.method)}
    if classified:
        from relaxspec.pivot import pivot_timer
    labels, steps = [], []
    pivots: dict = {}  # verifier -> ([labels], [its one-token step, then the classifier's timers])

    def add(label, step, into=(labels, steps)):
        if label not in into[0]:
            into[0].append(label)
            into[1].append(step() if callable(step) else step)

    def measure(steps):
        return measure_step_latencies(steps, rounds=rounds, warmup=SPEED_WARMUP, max_seconds=SPEED_SECONDS,
                                      min_rounds=min(rounds, SPEED_MIN_ROUNDS))

    for v, d, n in keys:
        add((v, 1), (models[v], 1))
        for width in block_widths(n, dynamic):
            add((v, width), (models[v], width))
        lm = models[d] if drafters is None else getattr(drafters[(v, d)], "lm", None)
        add((v, d), (lm, 1) if lm is not None else lambda v=v, d=d: draft_timer(drafters[(v, d)], models[v]))
        if (v, d, n) in classified:
            # In rounds of their own beside the verifier's step: among the forwards, a classifier call evicts their
            # weights and slows the next one (the one-token step most, c_block 1.24 -> 1.19 on the built-in pair).
            mine = pivots.setdefault(v, ([(v, 1)], [(models[v], 1)]))
            add((v, "pivot", n), lambda v=v, n=n: pivot_timer(pivot_fn, models[v], block_widths(n)[-1] - 1), mine)
    times = measure(steps)
    pivot_costs = {v: dict(zip(names, relative_costs(measure(timed)))) for v, (names, timed) in pivots.items()}
    out = {}
    for v, d, n in keys:
        widths = block_widths(n, dynamic)
        iv, ib, i_d = labels.index((v, 1)), labels.index((v, widths[-1])), labels.index((v, d))
        costs = relative_costs(times, reference=iv)
        out[(v, d, n)] = {"c_rel_measured": costs[i_d], "c_block_measured": costs[ib],
                          "latency_verifier_s": statistics.median(t[iv] for t in times),
                          "latency_drafter_s": statistics.median(t[i_d] for t in times)}
        if (v, d, n) in classified:
            out[(v, d, n)]["c_pivot_measured"] = pivot_costs[v][(v, "pivot", n)]
        if len(widths) > 1:
            out[(v, d, n)]["c_block_widths"] = [[w, costs[labels.index((v, w))]] for w in widths]
    return out


__all__ = ["CellSpec", "CellRequest", "CellResult", "CellRunner", "cell_config", "generate_samples", "run_samples", "time_batch1_cells", "BATCH1_CELLS_PER_AR", "pad_classifier",
           "pad_applies", "generation_options", "model_options", "check_versions", "runner_key", "cell_runner",
           "run_cell", "SPEED_ROUNDS", "block_widths", "speed_constants"]

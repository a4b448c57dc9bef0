"""Tune against an exhaustive grid: generated tokens of each, tune's choice against the grid's best
configuration under the same rule, with one set of speed constants for both (benchmarks/tune_vs_grid.py).

The rule (tune's): among configurations whose 95% paired difference interval of utility vs strict at the same
N lies within the budget (upper bound of the drop <= max_drop; strict always), the highest objective point
estimate. The objective is tune's length-adjusted block-aware modelled speed-up (tune.objective), paired with
AR's samples by (prompt, repeat), at one c_rel and one c_block per N for both stores, so that the two numbers
differ only by the samples. Tokens: every sample stored in each directory (a tune store reused by several tune
runs holds them all; tune's own report gives what its race read, i.e. what a fresh run generates).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from relaxspec.bench import Store, methods, stats
from relaxspec.names import AR, STRICT, draft_length_order
from relaxspec.tune.objective import priced_round, speed_interval
from relaxspec.tune.report import TOML_NAME
from relaxspec.tune.space import Config, make_config

CONFIDENCE = 0.95
SETTINGS = ("verifier", "drafter", "task", "seed", "temperature", "top_k", "top_p", "max_new_tokens", "phase",
            "draft_confidence")


@dataclass
class StoreCell:
    config: Config | None  # None: AR
    settings: dict  # the cell's SETTINGS (AR: drafter None)
    heldout: bool  # a tune confirmation cell (prompts disjoint from the search prompts)
    rows: dict  # {(prompt, repeat): Row}
    metrics: dict


@dataclass
class Scored:
    config: Config
    speed: stats.Interval
    diff: stats.Interval

    @property
    def feasible_at(self) -> float:
        """The upper 95% bound of the drop vs strict (0 for strict)."""
        return 0.0 if self.config.is_strict else -self.diff.low


def read_cells(out: str | Path) -> list[StoreCell]:
    cells = []
    with Store.open_existing(out) as store:
        for cell in store.cells():
            c = cell.config
            config = None if c["method"] == AR else make_config(c["method"], c.get("params") or {},
                                                                c["draft_length"])
            rows = {(r.prompt_index, r.repeat): r for r in store.rows(cell.key)}
            cells.append(StoreCell(config, {k: c.get(k) for k in SETTINGS}, "prompts" in c, rows, cell.metrics))
    return cells


def tokens(cells: list[StoreCell]) -> int:
    """Generated tokens over every stored sample of the cells."""
    return sum(r.tokens for cell in cells for r in cell.rows.values())


def same_settings(cells: list[StoreCell], settings: dict) -> list[StoreCell]:
    """The cells run with these settings (AR: whatever its drafter)."""
    keys = [k for k in SETTINGS if k != "drafter"]
    return [c for c in cells if all(c.settings[k] == settings[k] for k in keys)
            and (c.config is None or c.settings["drafter"] == settings["drafter"])]


def _medians_per_n(cells: list[StoreCell], values) -> dict[int, tuple]:
    """{N: the medians, value by value, over the speculative cells at N of `values(cell)` (a tuple of numbers; None
    skips the cell)}."""
    per_n: dict[int, list] = {}
    for cell in cells:
        found = None if cell.config is None else values(cell)
        if found is not None:
            per_n.setdefault(cell.config.draft_length, []).append(found)
    return {n: tuple(map(statistics.median, zip(*v))) for n, v in per_n.items()}


def stored_constants(cells: list[StoreCell]) -> dict[int, tuple[float, float]]:
    """{N: (c_rel, c_block)} the store measured: at each N, the median over its speculative cells."""
    return _medians_per_n(cells, lambda cell: (cell.metrics["c_rel_measured"], cell.metrics["c_block_measured"])
                          if cell.metrics.get("c_rel_measured") and cell.metrics.get("c_block_measured") else None)


def stored_pivot(cells: list[StoreCell]) -> dict[int, float]:
    """{N: c_pivot} the store measured for the rules that read a pivot classifier: at each N, the median over
    their cells (bench.cell.speed_constants; absent in stores written before it was measured)."""
    found = _medians_per_n(cells, lambda cell: (cell.metrics["c_pivot_measured"],)
                           if methods.needs_classifier(cell.config.method) and cell.metrics.get("c_pivot_measured")
                           else None)
    return {n: v[0] for n, v in found.items()}


def score(cells: list[StoreCell], constants: dict[int, tuple[float, float]],
          pivot: dict[int, float] | None = None) -> dict[Config, Scored]:
    """Every configuration of the cells (one part: search or held-out) with its objective and its paired
    difference vs strict at the same N (those with a strict reference and speed constants at their N); a rule
    that reads a pivot classifier also pays `pivot`'s c_pivot at its N per round (0 where none was measured)."""
    ar = [c for c in cells if c.config is None]
    if not ar:
        raise ValueError("tune vs grid: no AR cell (the length-adjusted objective needs AR's samples)")
    ar_rows = ar[0].rows
    by_config = {c.config: c for c in cells if c.config is not None}
    out = {}
    for config, cell in by_config.items():
        n = config.draft_length
        strict = by_config.get(config.strict)
        if strict is None or n not in constants:
            continue  # no reference or no speed constants: cannot be judged
        c_rel, c_block = constants[n]
        c_pivot = methods.classifier_cost(config.method, (pivot or {}).get(n))
        n, c_block = priced_round(n, cell.metrics, c_block, cell.settings.get("draft_confidence") is not None)
        speed = speed_interval("length-adjusted", cell.rows, ar_rows, n, methods.extra_draft_passes(config.method),
                               c_rel, c_block, CONFIDENCE, c_pivot=c_pivot)
        if config.is_strict:
            diff = stats.Interval(0.0, 0.0, 0.0, len(cell.rows), CONFIDENCE)
        else:
            diff = stats.paired_diff_interval({k: r.utility for k, r in cell.rows.items()},
                                              {k: r.utility for k, r in strict.rows.items()}, CONFIDENCE)
        out[config] = Scored(config, speed, diff)
    return out


def best_feasible(scored: dict[Config, Scored], max_drop: float) -> Scored | None:
    feasible = [s for s in scored.values() if s.feasible_at <= max_drop and not math.isnan(s.speed.mean)]
    return max(feasible, key=lambda s: s.speed.mean) if feasible else None


def tune_choice(tune_dir: str | Path) -> Config:
    """The configuration tune chose (its TOML)."""
    from relaxspec.bench import settings
    path = Path(tune_dir) / TOML_NAME
    if not path.is_file():
        raise ValueError(f"tune vs grid: {path} does not exist (no choice: run relaxspec tune first)")
    data = settings.load_toml(path, "tune choice")
    [(method, params)] = methods.parse_method(data["method"])
    return make_config(method, params, data.get("draft_length", 0) if method != AR else 0)


@dataclass
class Comparison:
    max_drop: float
    constants: dict  # {N: (c_rel, c_block)} used for both
    constants_source: str
    grid_tokens: int
    grid_samples: int
    search_tokens: int
    confirm_tokens: int
    choice: Scored  # on tune's search samples
    choice_heldout: Scored | None  # on tune's held-out samples
    grid_best: Scored | None
    choice_on_grid: Scored | None  # tune's choice on the grid's samples, when the grid has it
    grid_best_on_tune: Scored | None  # the grid's best on tune's search samples, when tune sampled it
    pivot: dict = field(default_factory=dict)  # {N: c_pivot} used for both (rules that read a pivot classifier)

    @property
    def token_ratio(self) -> float:
        return (self.search_tokens + self.confirm_tokens) / self.grid_tokens if self.grid_tokens else math.nan

    @property
    def as_fast(self) -> bool:
        """Tune's choice at least as fast as the grid's best within its CI: the grid's best objective is not
        above the upper bound of the choice's 95% interval."""
        return self.grid_best is None or self.choice.speed.high >= self.grid_best.speed.mean


def measure_constants(settings: dict, lengths) -> dict[int, tuple[float, float]]:
    """{N: (c_rel, c_block)} of the pair measured now (a workbench's speed constants: interleaved rounds)."""
    import torch

    from relaxspec.bench import BenchConfig, CellSpec, Workbench
    torch.set_num_threads(1)
    v, d = settings["verifier"], settings["drafter"]
    config = BenchConfig(verifiers=[v], drafters=[d], tasks=[settings["task"]],  # any drafter kind, as the bench's
                         draft_confidence=settings.get("draft_confidence"))
    workbench = Workbench(config)  # it measures only: no store opens
    specs = [CellSpec(v, d, settings["task"], STRICT, {}, n, 0) for n in sorted(lengths, key=draft_length_order)]
    workbench.measure_speed(specs)
    return {n: (m["c_rel_measured"], m["c_block_measured"]) for (_, _, n), m in workbench.speed.items()}


CONSTANTS = ("tune", "grid", "measured")


def compare(grid_dir: str | Path, tune_dir: str | Path, max_drop: float = 0.02, constants: str = "tune",
            c_rel: float | None = None, c_block: float | None = None) -> Comparison:
    """`constants`: the speed constants both objectives use: those tune's or the grid's store measured, or
    measured now for the pair ("measured"); `c_rel` / `c_block` override them (one value for every N)."""
    if constants not in CONSTANTS:
        raise ValueError(f"tune vs grid: constants must be one of {', '.join(CONSTANTS)}, got {constants!r}")
    tune_cells = read_cells(tune_dir)
    choice = tune_choice(tune_dir)
    search = [c for c in tune_cells if not c.heldout]
    heldout = [c for c in tune_cells if c.heldout]
    mine = [c for c in search if c.config == choice]
    if not mine:
        raise ValueError(f"tune vs grid: tune's store has no search cell of its choice {choice.label}")
    grid_all = read_cells(grid_dir)
    grid = same_settings(grid_all, mine[0].settings)
    if not grid:
        raise ValueError(f"tune vs grid: the grid has no cells with tune's settings {mine[0].settings}")
    lengths = {c.config.draft_length for c in tune_cells + grid if c.config is not None}
    if constants == "measured":
        measured = measure_constants(mine[0].settings, lengths)
    else:
        measured = stored_constants(search if constants == "tune" else grid)
    table = {}
    for n in sorted(lengths, key=draft_length_order):
        got = measured.get(n)
        rel = c_rel if c_rel is not None else (got[0] if got else None)
        block = c_block if c_block is not None else (got[1] if got else None)
        if rel is not None and block is not None:
            table[n] = (rel, block)
    source = ("measured now" if constants == "measured" else constants + " store's measured")
    source += "" if c_rel is None else f", c_rel {c_rel:g} given"
    source += "" if c_block is None else f", c_block {c_block:g} given"
    # c_pivot: the store's whose constants are used (the tune store's with constants measured now)
    pivot = stored_pivot(grid if constants == "grid" else search)
    source += f"; c_pivot: the {'grid' if constants == 'grid' else 'tune'} store's, for rules that read a pivot " \
              "classifier" if pivot else ""
    tune_scored = score(search, table, pivot)
    grid_scored = score(grid, table, pivot)
    heldout_scored = score(heldout, table, pivot) if heldout else {}
    if choice not in tune_scored:
        raise ValueError(f"tune vs grid: no speed constants for N={choice.draft_length} (tune's choice)")
    best = best_feasible(grid_scored, max_drop)
    return Comparison(max_drop, table, source, tokens(grid), sum(len(c.rows) for c in grid), tokens(search),
                      tokens(heldout), tune_scored[choice], heldout_scored.get(choice), best,
                      grid_scored.get(choice), tune_scored.get(best.config) if best else None, pivot)


def _ci(iv: stats.Interval) -> str:
    text = stats.format_interval(iv)
    return text if text == stats.MISSING else f"{text} (n={iv.n})"


def _line(name: str, s: Scored | None) -> str:
    if s is None:
        return f"  {name}: not sampled"
    return (f"  {name}: {s.config.label}: speed-up {_ci(s.speed)}, utility diff vs strict {_ci(s.diff)}, "
            f"upper drop bound {s.feasible_at:.4f}")


def format_comparison(c: Comparison) -> str:
    consts = ", ".join(f"N={n}: {a:.3f}/{b:.3f}" for n, (a, b) in c.constants.items())
    total = c.search_tokens + c.confirm_tokens
    lines = [f"tune vs grid, max drop {c.max_drop:g} (upper 95% bound vs strict at the same N), objective "
             f"length-adjusted block-aware modelled speed-up vs AR (95% CI)",
             f"speed constants ({c.constants_source}) c_rel/c_block: {consts}"
             + "".join(f"; c_pivot N={n}: {v:.3f}" for n, v in c.pivot.items()),
             f"generated tokens: grid {c.grid_tokens} ({c.grid_samples} samples, every look); tune {total} "
             f"(search {c.search_tokens} + confirmation {c.confirm_tokens}); ratio {c.token_ratio:.3f} "
             f"(search alone {c.search_tokens / c.grid_tokens:.3f}); budget 1/3: "
             f"{'met' if c.token_ratio <= 1 / 3 else 'NOT met'}",
             _line("tune's choice (search samples)", c.choice),
             _line("tune's choice (held-out samples)", c.choice_heldout),
             _line("grid's best under the same rule", c.grid_best),
             _line("tune's choice on the grid's samples", c.choice_on_grid),
             _line("grid's best on tune's search samples", c.grid_best_on_tune)]
    if c.grid_best is None:
        lines.append("verdict: the grid has no configuration within the budget")
    else:
        lines.append(f"verdict: tune's choice is {'at least as fast as' if c.as_fast else 'SLOWER than'} the grid's "
                     f"best (grid best {c.grid_best.speed.mean:.3f} "
                     f"{'<=' if c.as_fast else '>'} the upper bound {c.choice.speed.high:.3f} of tune's choice); "
                     f"tokens {'within' if c.token_ratio <= 1 / 3 else 'BEYOND'} one third of the grid's")
    return "\n".join(lines)

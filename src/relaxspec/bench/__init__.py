"""Bench: grid runner, speed-up model, result store, report and plots.

The public API (`__all__`), which the layers above (tune, study, the CLI) use and nothing else of the bench:
* a workbench and the grid: `Workbench` (a store, the settings of its cells, an executor: it owns the versions in the
  keys, the PAD classifier, the models, the speed constants and batch-1 timing, and ensures the samples a cell
  lacks, `Wanted`), `BenchConfig`, `CellSpec` (what a cell is), `Store` (the results), `run_grid`;
* executors: `Executor` (local, process pool and Ray, one interface), `ExecutorOptions`, `make_executor`;
* the report's rows: `build_rows`, `with_decisions`;
* prices: `Costs` (what a sample costs on this project's 2-core machine, per drafter: the preset's and tune's
  protocols' prices);
* four modules, used by their names (`from relaxspec.bench import stats`, then `stats.Interval`), each with the
  names it offers in its own `__all__`:
  - `methods`: the method grammar and the rules' declared costs (`parse_method`, `needs_classifier`,
    `classifier_cost`, `extra_draft_passes`);
  - `settings`: checks of the settings tune shares, made before any work (`check_settings_types`, `check_out_dir`,
    `check_sampling_setting`, `check_draft_confidence_setting`, `check_phase_setting`), `phase_for`, `load_toml`;
  - `stats`: `Interval` and the interval functions (`paired_diff_interval`, `ratio`, `ratio_interval`), `decision`
    and its states (`WITHIN`, `BEYOND`, `NO_STRICT`);
  - `speedup`: the speed model's `rounds` and `round_cost`, `C_REL_GRID`.
Names shared by every layer (`AR`, `AUTO`, `STRICT`, `method_label`, `draft_length_order`) are relaxspec.names';
everything else is internal, imported from its module.
"""

from relaxspec.bench import methods, settings, speedup, stats
from relaxspec.bench.cell import CellSpec
from relaxspec.bench.config import BenchConfig
from relaxspec.bench.executors import Executor, ExecutorOptions, make_executor
from relaxspec.bench.presets import Costs
from relaxspec.bench.report import build_rows, with_decisions
from relaxspec.bench.runner import run_grid
from relaxspec.bench.workbench import Workbench, Wanted
from relaxspec.bench.store import Store

__all__ = [
    # a workbench and the grid
    "Workbench", "Wanted", "BenchConfig", "CellSpec", "Store", "run_grid",
    # executors
    "Executor", "ExecutorOptions", "make_executor",
    # the report's rows
    "build_rows", "with_decisions",
    # prices
    "Costs",
    # modules: the method grammar and the rules' costs, the settings' checks, statistics, the speed model
    "methods", "settings", "stats", "speedup",
]

"""Bench: grid runner, speed-up model, result store, report and plots.

The public API (`__all__`), which the layers above (tune, study, the CLI) use and nothing else of the bench:
* a workbench and the grid: `Workbench` (a store, the settings of its cells, an executor: it owns the versions in the
  keys, the PAD classifier, the models, the speed constants and batch-1 timing, and ensures the samples a cell
  lacks, `Wanted`), `BenchConfig`, `CellSpec` (what a cell is), `Store` (the results), `run_grid`;
* executors: `Executor` (local, process pool and Ray, one interface), `ExecutorOptions`, `make_executor`;
* settings: the method grammar, the rules' declared costs, checks of the settings tune shares, `phase_for`;
* statistics and speed models: `Interval` and the interval functions, `decision` and its states, `rounds` /
  `round_cost`, `C_REL_GRID`; the report's rows (`build_rows`, `with_decisions`);
* prices: `Costs` (what a sample costs on this project's 2-core machine, per drafter: the preset's and tune's
  protocols' prices).
Names shared by every layer (`AR`, `AUTO`, `STRICT`, `method_label`, `draft_length_order`) are relaxspec.names';
everything else is internal, imported from its module.
"""

from relaxspec.bench.cell import CellSpec
from relaxspec.bench.config import (BenchConfig, check_draft_confidence_setting, check_out_dir, check_sampling_setting,
                                    check_settings_types, classifier_cost, extra_draft_passes, load_toml,
                                    needs_classifier, parse_method)
from relaxspec.bench.executors import Executor, ExecutorOptions, make_executor
from relaxspec.bench.metrics import BEYOND, NO_STRICT, WITHIN, decision
from relaxspec.bench.phase import check_phase_setting, phase_for
from relaxspec.bench.presets import Costs
from relaxspec.bench.report import build_rows, with_decisions
from relaxspec.bench.runner import run_grid
from relaxspec.bench.workbench import Workbench, Wanted
from relaxspec.bench.speedup import C_REL_GRID, round_cost, rounds
from relaxspec.bench.stats import Interval, paired_diff_interval, ratio, ratio_interval
from relaxspec.bench.store import Store

__all__ = [
    # a workbench and the grid
    "Workbench", "Wanted", "BenchConfig", "CellSpec", "Store", "run_grid",
    # executors
    "Executor", "ExecutorOptions", "make_executor",
    # settings: the method grammar, the rules' declared costs, checks of the settings tune shares
    "parse_method", "load_toml", "needs_classifier", "classifier_cost", "extra_draft_passes",
    "check_settings_types", "check_out_dir", "check_sampling_setting", "check_draft_confidence_setting",
    "check_phase_setting", "phase_for",
    # statistics, speed models, the report's rows
    "Interval", "paired_diff_interval", "ratio", "ratio_interval", "decision", "WITHIN", "BEYOND", "NO_STRICT",
    "rounds", "round_cost", "C_REL_GRID", "build_rows", "with_decisions",
    # prices
    "Costs",
]

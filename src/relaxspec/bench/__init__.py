"""Bench: grid runner, speed-up model, result store, report and plots.

The public API (`__all__`), which the layers above (tune, study) use and nothing else of the bench:
* cells: `CellSpec` (what a cell is), `cell_config` and `cell_key` (what decides its samples, its key),
  `CellRequest` (samples to add to a cell) and `CellResult` (its scored rows), `run_cell` (one process runs a
  request), `CellRunner` (a process's models, tasks and PAD classifier), `CellJob` (a request as an executor job),
  `pad_classifier` / `pad_applies`, `speed_constants`, `time_batch1`;
* executors: `Executor` (local, process pool and Ray, one interface), `make_executor`, `ExecutorOptions`,
  `Finished`, and the CLI flags that set them;
* the grid: `plan`, `run_grid`, `RunSummary`, `store_result` (a result's rows and metrics into the `Store`);
* settings: `BenchConfig`, the method grammar, the rules' declared costs, checks of shared settings;
* the long-running commands' shared options and stop (`csv_list`, `check_threads`, `on_sigterm`,
  `interrupted`, `Terminated`);
* statistics and speed models: `Interval` and the interval functions, `compare` / `decision` and their states,
  `rounds` / `round_cost`, `C_REL_GRID`; the report's rows (`build_rows`, `with_decisions`).
"""

from relaxspec.bench.cell import (CellRequest, CellResult, CellRunner, CellSpec, cell_config, pad_applies,
                                  pad_classifier, run_cell, speed_constants, time_batch1)
from relaxspec.bench.cell_job import CellJob
from relaxspec.bench.cli_args import Terminated, check_threads, csv_list, interrupted, on_sigterm
from relaxspec.bench.config import (BenchConfig, check_draft_confidence_setting, check_out_dir, check_sampling_setting,
                                    check_settings_types, classifier_cost, extra_draft_passes, load_toml,
                                    needs_classifier, parse_method)
from relaxspec.bench.executors import (Executor, ExecutorOptions, Finished, add_executor_arguments, executor_options,
                                       make_executor)
from relaxspec.bench.metrics import BEYOND, NO_STRICT, WITHIN, compare, decision
from relaxspec.bench.names import AR, AUTO, STRICT, draft_length_order, method_label
from relaxspec.bench.phase import check_phase_setting, phase_for
from relaxspec.bench.report import build_rows, with_decisions
from relaxspec.bench.runner import RunSummary, plan, run_grid, store_result
from relaxspec.bench.speedup import C_REL_GRID, round_cost, rounds
from relaxspec.bench.stats import Interval, cluster_of, paired_diff_interval, ratio, ratio_interval
from relaxspec.bench.store import Row, Store, cell_key
from relaxspec.bench.versions import code_version, model_version

__all__ = [
    # what the long-running commands share
    "csv_list", "check_threads", "on_sigterm", "interrupted", "Terminated",
    # cells
    "CellSpec", "CellRequest", "CellResult", "CellRunner", "CellJob", "cell_config", "cell_key", "run_cell",
    "pad_classifier", "pad_applies", "speed_constants", "time_batch1",
    # executors
    "Executor", "ExecutorOptions", "Finished", "make_executor", "add_executor_arguments", "executor_options",
    # the grid and its store
    "plan", "run_grid", "RunSummary", "store_result", "Store", "Row", "code_version", "model_version",
    # settings and names
    "BenchConfig", "parse_method", "load_toml", "needs_classifier", "classifier_cost", "extra_draft_passes",
    "check_settings_types", "check_out_dir", "check_draft_confidence_setting", "check_phase_setting", "phase_for",
    "check_sampling_setting",
    "AR", "AUTO", "STRICT", "method_label", "draft_length_order",
    # statistics, speed models, report rows
    "Interval", "paired_diff_interval", "ratio", "ratio_interval", "cluster_of", "compare", "decision",
    "WITHIN", "BEYOND", "NO_STRICT", "rounds", "round_cost", "C_REL_GRID", "build_rows", "with_decisions",
]

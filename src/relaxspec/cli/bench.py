"""`relaxspec bench` and `relaxspec report` subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from relaxspec.cli.options import (add_compile_arg, add_device_args, add_executor_arguments, add_prompt_args,
                                   check_threads, csv_list, draft_length_arg, executor_options, interrupted, on_sigterm)
from relaxspec.study.findings import DEFAULT_MAX_DROP as FINDINGS_MAX_DROP
from relaxspec.bench.config import (DEFAULT_BATCH_SIZE, DEFAULT_LIMIT, DEFAULT_LOOKS, DEFAULT_MAX_DROP,
                                    DEFAULT_MAX_NEW_TOKENS, DEFAULT_OUT, DEFAULT_REPEATS, DEFAULT_SPEED_PROMPTS,
                                    DEFAULT_TIME_BUDGET_S, DEFAULT_WORKERS, RUN_PRESETS, SAMPLING_PRESETS, BenchConfig,
                                    SLOW_MACHINE, estimate_minutes, estimate_text, sampling_preset)
from relaxspec.bench.settings import load_toml

BENCH_EPILOG = f"""\
Default grid (no --methods / config): ar; strict; every training-free rule at each value of its paper
grid (cactus delta 0.1/0.25/1/10; mentored alpha 0.3/0.7/0.95; fuzzy and r-fuzzy threshold 0.05/0.2/0.3;
spec-casc-opt alpha -0.1/0/0.05; spec-casc-tok alpha 0/0.35/0.8; ensemble weight 0/0.8/0.9/0.95
(0: the always-accept baseline); spec-cont-dec beta 0.1/0.5/1; typical epsilon=0.09, delta=0.3); pad at
thresholds 0.3/0.5/0.7 when a PAD classifier ships; N in {{3, 5}}; task arithmetic; {DEFAULT_LIMIT} prompts; temperature 0.7, top_p 0.95, max {DEFAULT_MAX_NEW_TOKENS} new tokens (--sampling paper:
temperature 0.6, top_k 20, top_p 0.95). About 15 minutes on 2 CPU cores.

Samples are coupled: sample (prompt i, repeat r) uses the same per-sequence seed in every cell, so each
relaxed rule is compared with strict at the same N sample by sample. Sampling is adaptive, with at most
--looks looks: look 1 runs --repeats repeats ({DEFAULT_REPEATS}) of every prompt in every cell; each later look
doubles the samples of the relaxed cells (and of strict at their N) whose interval of the difference vs
strict still straddles the budget --max-drop with a half-width above it, while the --time-budget allows,
with new prompts while the task has them (after the band tune holds out), then with more repeats.
Intervals treat a prompt's samples as one cluster.
Intervals vs strict are at 1 - 0.05/looks (Bonferroni over the looks). Each speculative cell also times
--speed-prompts prompts one at a time (batch 1), AR and the method taking turns.

--preset paper: the investigation's findings checked on the built-in family (`relaxspec report DIR
--findings`): drafters drafter-mtp, drafter-strong, drafter-weak x the default grid above (PAD only with the
drafter its classifier was trained for) x N in {{3, 5, 10}} x tasks arithmetic and sorting, --sampling paper,
80 prompts, 1 repeat in the first look, at most 2 looks (the second for cells undecided at the findings'
budget, --max-drop 0.1), no batch-1 timing (the findings use the modelled speed-ups at the measured c_rel), a
60-minute time budget: 704 cells, about 20-40 min on 2 CPU cores (524 took 21 min before the engines' three rules
joined the grid; the first look's estimate is printed). Explicit flags
(and a --config's keys) override the preset's settings, --sampling its sampling.

--methods takes a comma-separated list of NAME (its paper grid) or NAME:PARAM=V1/V2[;PARAM=V]
(e.g. --methods ar,strict,'cactus:delta=0.5/2','typical:epsilon=0.1;delta=0.2').
A TOML --config takes the same settings as keys (verifiers, drafters, tasks, methods, draft_lengths (e.g.
[3, 5, "auto"]), seeds, limit, repeats, looks, max_drop, time_budget_s, speed_prompts, temperature, top_k, top_p,
max_new_tokens, batch_size, device, dtype, chat_template, system, pad_thresholds, pad_classifier, phase,
draft_confidence, out, and sampling = "paper"); flags override it. Results go to OUT/results.sqlite; every look of a cell is stored as
it finishes and a re-run continues where the last one stopped.
"""


def register(subparsers) -> None:
    from relaxspec.tasks.sandbox import UNSAFE_EXEC_HELP

    b = subparsers.add_parser("bench", help="run a grid of methods x parameters x draft lengths and store results",
                              description="Run the bench grid; every finished cell is stored at once.",
                              epilog=BENCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--config", type=Path, help="TOML file with bench settings")
    b.add_argument("--verifier", type=csv_list(str), help="verifier model(s), comma-separated")
    b.add_argument("--drafter", type=csv_list(str), help="drafter model(s), comma-separated")
    b.add_argument("--tasks", type=csv_list(str), help="arithmetic, sorting, humaneval, jsonl:PATH[:metric]")
    b.add_argument("--methods", type=csv_list(str), help="methods, see below")
    b.add_argument("--unsafe-exec", action="store_true", help=UNSAFE_EXEC_HELP)
    b.add_argument("--draft-lengths", type=csv_list(draft_length_arg),
                   help="e.g. 3,5 ('auto': the engine's per-sequence +2/-1 schedule, an extra value of the grid)")
    b.add_argument("--draft-confidence", type=float, metavar="T",
                   help="every speculative cell: a sequence stops drafting after a draft its drafter gave "
                        "probability < T (generate --draft-confidence); enters the cells' keys only when set")
    b.add_argument("--seed", type=csv_list(int), help="seed(s), comma-separated")
    b.add_argument("--limit", type=int, help=f"prompts per task (default {DEFAULT_LIMIT})")
    b.add_argument("--repeats", type=int, help=f"samples per prompt in the first look (default {DEFAULT_REPEATS})")
    b.add_argument("--looks", type=int, help=f"maximum number of looks (default {DEFAULT_LOOKS})")
    b.add_argument("--time-budget", type=float, dest="time_budget_s",
                   help=f"seconds after which no later look starts (default {DEFAULT_TIME_BUDGET_S:g})")
    b.add_argument("--speed-prompts", type=int,
                   help=f"prompts timed at batch 1 per speculative cell (default {DEFAULT_SPEED_PROMPTS}; 0: none)")
    b.add_argument("--workers", type=int,
                   help=f"processes running cells (default {DEFAULT_WORKERS}; the store is written by the driver)")
    b.add_argument("--preset", choices=sorted([*RUN_PRESETS, "qwen-coder"]),
                   help="run preset (paper: the findings' grid, see below; qwen-coder: the Qwen2.5-Coder pair on "
                        "humaneval-instruct in 3 hours, bench.presets and docs/real-answer.md); explicit flags "
                        "override it (qwen-coder refuses those its stages fix: sampling, methods, N, tasks)")
    b.add_argument("--sampling", choices=sorted(SAMPLING_PRESETS),
                   help="sampling preset (paper: temperature 0.6, top_k 20, top_p 0.95); explicit flags override it")
    b.add_argument("--temperature", type=float, help="default 0.7")
    b.add_argument("--top-p", type=float, help="default 0.95")
    b.add_argument("--top-k", type=int)
    b.add_argument("--max-new-tokens", type=int, help=f"default {DEFAULT_MAX_NEW_TOKENS}")
    b.add_argument("--batch-size", type=int, help=f"sequences per generate call (default {DEFAULT_BATCH_SIZE})")
    add_device_args(b)
    add_compile_arg(b)
    add_prompt_args(b)
    b.add_argument("--pad-thresholds", type=csv_list(float), help="default 0.3,0.5,0.7")
    b.add_argument("--pad-classifier", help="PAD classifier path (default: the built-in one)")
    b.add_argument("--out", type=Path, help=f"output directory (default ./{DEFAULT_OUT})")
    b.add_argument("--threads", type=int,
                   help="torch CPU threads (default 1: tiny models gain little from more, and shared CPUs lose; "
                        "with --preset, every core: the preset's time is priced at 2 threads on 2 cores)")
    b.add_argument("--max-drop", type=float, help=f"utility drop vs strict allowed (default {DEFAULT_MAX_DROP:g})")
    b.add_argument("--phase", help="relax only inside a span of each response, strict outside: 'task' (the task's "
                                   "span: the worked steps before the final answer), 'think' or 'BEGIN..END'")
    b.add_argument("--no-plots", action="store_true")
    b.add_argument("--no-progress", action="store_true")
    add_executor_arguments(b)
    b.set_defaults(func=cmd_bench)

    r = subparsers.add_parser("report", help="table, CSV and plots from a bench output directory")
    r.add_argument("dir", type=Path, nargs="?", default=Path(DEFAULT_OUT))
    r.add_argument("--csv", type=Path, help="write the CSV here (default DIR/results.csv)")
    r.add_argument("--max-drop", type=float,
                   help=f"utility drop vs strict allowed for decisions and 'best rule' (default {DEFAULT_MAX_DROP:g}; "
                        f"with --findings {FINDINGS_MAX_DROP:g})")
    r.add_argument("--all", action="store_true", help="every settings group, not only the latest run's")
    r.add_argument("--no-plots", action="store_true")
    r.add_argument("--findings", action="store_true",
                   help="instead of the table: each finding of the investigation with this run's evidence and a "
                        "verdict (for a `bench --preset paper` run; the tests are printed with the verdicts)")
    r.add_argument("--c-rel", type=float,
                   help="with --findings: the speed-up at this c_rel of the bench's grid (default: the pair's "
                        "measured c_rel)")
    r.set_defaults(func=cmd_report)


_FLAG_TO_FIELD = {"verifier": "verifiers", "drafter": "drafters", "tasks": "tasks", "methods": "methods",
                  "draft_lengths": "draft_lengths", "seed": "seeds", "limit": "limit", "repeats": "repeats",
                  "looks": "looks", "time_budget_s": "time_budget_s", "speed_prompts": "speed_prompts", "workers": "workers",
                  "max_drop": "max_drop", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                  "max_new_tokens": "max_new_tokens", "batch_size": "batch_size", "device": "device", "dtype": "dtype",
                  "compile": "compile",
                  "chat_template": "chat_template", "system": "system", "pad_thresholds": "pad_thresholds",
                  "pad_classifier": "pad_classifier", "out": "out", "phase": "phase",
                  "draft_confidence": "draft_confidence"}


def config_from_args(args) -> BenchConfig:
    data = load_toml(args.config) if getattr(args, "config", None) else {}
    if getattr(args, "preset", None):
        data["preset"] = args.preset
    config = BenchConfig.from_dict(data)
    if getattr(args, "sampling", None):
        for name, value in sampling_preset(args.sampling).items():
            setattr(config, name, value)
    for flag, name in _FLAG_TO_FIELD.items():
        value = getattr(args, flag, None)
        if value is not None:
            setattr(config, name, str(value) if name == "out" else value)
    config.validate()
    return config


def cmd_bench(args) -> int:
    import torch

    from relaxspec.bench.runner import plan, run_grid
    from relaxspec.tasks import check_tasks, runs_code
    from relaxspec.tasks.sandbox import require_isolation

    import warnings
    warnings.formatwarning = lambda message, category, *rest, **kw: f"warning: {message}\n"
    if getattr(args, "preset", None) == "qwen-coder":  # four bench runs (stages) into one store: bench.presets
        if args.config:
            raise ValueError("--preset qwen-coder takes flags, not --config")
        explicit = {name: str(value) if name == "out" else value for flag, name in _FLAG_TO_FIELD.items()
                    if (value := getattr(args, flag, None)) is not None}
        return _run_preset(args, {**explicit, **({"sampling": args.sampling} if args.sampling else {})})
    config = config_from_args(args)
    check_tasks(config.tasks, config.limit)
    check_fetched([*config.verifiers, *config.drafters])
    if any(runs_code(t) for t in config.tasks):  # refused here, before any model loads, if unisolated
        require_isolation(args.unsafe_exec)
    args.threads = 1 if args.threads is None else args.threads
    check_threads(args.threads)
    torch.set_num_threads(args.threads)
    cells = len(plan(config))
    minutes = estimate_minutes(config, cells)
    print(f"bench: {cells} cells; the first look takes {estimate_text(minutes)} on a fast 2-core machine with the "
          f"built-in family (up to {estimate_text(SLOW_MACHINE * minutes).removeprefix('about ')} on a slower one of "
          f"the same kind: they differ up to {SLOW_MACHINE:g}x), batch-1 timing included; later looks only within the "
          f"time budget ({config.time_budget_s / 60:g} min)")
    on_sigterm()
    try:
        summary = run_grid(config, progress=not args.no_progress, executor=executor_options(args))
    except KeyboardInterrupt as e:
        return interrupted("bench", "finished cells are", Path(config.out), e)
    print(f"bench: ran {len(summary.ran)} cells, skipped {len(summary.skipped)} finished ones, "
          f"in {summary.wall_s:.1f} s")
    if summary.unavailable:
        print(f"bench: {len(summary.unavailable)} pad cells not run (no PAD classifier for their pair; see the warning above)")
    print(f"bench: {summary.looks_run} of {config.looks} looks run")
    print_failed(summary.failed)
    if summary.out_of_time:
        print(f"bench: the time budget ({config.time_budget_s:g} s) stopped later looks for {len(summary.out_of_time)} "
              f"cells: {', '.join(summary.out_of_time)}")
    code = _report(Path(config.out), None, config.max_drop, not args.no_plots, everything=False)
    return 1 if summary.failed else code


def cmd_report(args) -> int:
    if args.findings:
        return _findings(args.dir, FINDINGS_MAX_DROP if args.max_drop is None else args.max_drop, args.c_rel)
    if args.c_rel is not None:
        raise ValueError("--c-rel is an option of --findings")
    return _report(args.dir, args.csv, DEFAULT_MAX_DROP if args.max_drop is None else args.max_drop,
                   not args.no_plots, everything=args.all)


def _findings(out_dir: Path, max_drop: float, c_rel: float | None) -> int:
    from relaxspec.study.findings import check_findings, format_findings, speed_column
    from relaxspec.bench.report import build_rows
    from relaxspec.bench.store import Store

    speed_column(c_rel)  # an invalid --c-rel fails before the store is read
    with Store.open_existing(out_dir) as store:
        store.check_consistent()
        rows = build_rows(store, "latest")
        if not rows:
            print("no finished cells")
            return 0
        findings = check_findings(store, rows, max_drop, c_rel)
    print(format_findings(findings, rows, max_drop, c_rel))
    return 0


def _run_preset(args, explicit: dict) -> int:
    """`relaxspec bench --preset qwen-coder`: every stage in turn, then the report of all of them."""
    from relaxspec.bench.runner import run_grid

    import torch

    from relaxspec.tasks import check_tasks
    from relaxspec.tasks.sandbox import require_isolation

    from relaxspec.bench.presets import describe, stage_configs

    configs = stage_configs(explicit)
    for _, config in configs:
        config.validate()
    check_tasks(configs[0][1].tasks, configs[0][1].limit)
    check_fetched([*configs[0][1].verifiers, *configs[0][1].drafters])
    require_isolation(args.unsafe_exec)  # humaneval-instruct runs code: refused now if unisolated, before any model
    threads = (os.cpu_count() or 1) if args.threads is None else args.threads  # the big pair gains from every core
    check_threads(threads)
    torch.set_num_threads(threads)
    print(describe(configs))
    on_sigterm()
    failed = []
    for i, (name, config) in enumerate(configs, 1):
        print(f"bench: stage {i}/{len(configs)} ({name}, T={config.temperature:g}, {threads} threads)", file=sys.stderr)
        try:
            summary = run_grid(config, progress=not args.no_progress, executor=executor_options(args))
        except KeyboardInterrupt as e:
            return interrupted("bench", "finished cells are", Path(config.out), e)
        print(f"bench: {name}: ran {len(summary.ran)} cells, skipped {len(summary.skipped)} finished ones, "
              f"in {summary.wall_s:.1f} s")
        failed += summary.failed
    print_failed(failed)
    code = _report(Path(configs[0][1].out), None, configs[0][1].max_drop, not args.no_plots, everything=True)
    return 1 if failed else code


def check_fetched(models) -> None:
    """ValueError naming every registry model among `models` that is not in the cache, with the one command that
    fetches them all (rather than the first one missing when it loads, and the next one on the next run)."""
    from relaxspec.models import registry
    missing = [name for name in dict.fromkeys(models)  # (a file there but not the pinned one: refused at its load)
               if registry.is_registered(name) and not (registry.cache_dir() / registry.REGISTRY[name].file).is_file()]
    if missing:
        sizes = ", ".join(f"{name} ({registry.human_size(registry.REGISTRY[name].download)})" for name in missing)
        raise ValueError(f"not in the model cache ({registry.cache_dir()}): {sizes}; run `relaxspec models fetch "
                         f"{' '.join(missing)}`")


def print_failed(failed: list[str]) -> None:
    """The cells (jobs) that raised, one line each, on stderr; whether a re-run can help: not for a cell that failed
    on its inputs (a ValueError, or samples stored under another plan), which fails again until they change."""
    if failed:
        again = [line for line in failed if ": ValueError: " in line or line.endswith("use another --out")]
        note = ("re-run to retry them" if not again else "each fails again until what it says is fixed"
                if len(again) == len(failed) else
                f"a re-run retries {len(failed) - len(again)}; the {len(again)} that failed on their inputs fail again")
        print(f"{len(failed)} cells failed (not stored; {note}):", file=sys.stderr)
        for line in failed:
            print(f"  {line}", file=sys.stderr)


def _report(out_dir: Path, csv_path, max_drop: float, plots: bool, everything: bool) -> int:
    from relaxspec.bench.report import build_rows, format_report, settings_groups, write_csv
    from relaxspec.bench.store import Store

    with Store.open_existing(out_dir) as store:
        store.check_consistent()
        rows = build_rows(store, "all" if everything else "latest")
        total = len(settings_groups(store))
    print(format_report(rows, max_drop, groups_total=total))
    if not rows:
        return 0
    csv_file = write_csv(rows, csv_path or out_dir / "results.csv")
    print(f"\nCSV: {csv_file}")
    if plots:
        from relaxspec.bench.plots import all_plots
        paths = all_plots(rows, out_dir / "plots")
        print("plots:")
        for p in paths:
            print(f"  {p}")
    return 0

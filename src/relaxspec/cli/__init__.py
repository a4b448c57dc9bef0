"""relaxspec command line: generate / methods / models / bench / report / pivot."""

from __future__ import annotations

import argparse
import json
import sys


# ------------------------------------------------------------------ methods


def cmd_methods(args) -> int:
    from relaxspec.acceptance import RULES

    if args.json:
        print(json.dumps({name: _rule_info(rule) for name, rule in RULES.items()}, indent=2))
        return 0
    print("ar: autoregressive baseline (no drafter, no parameters)")
    print(_GREEDY_NOTE)
    for name, rule in RULES.items():
        strict = rule.strict_params()
        strict_text = "no strict setting" if strict is None else (
            "is strict" if not strict else "strict at " + ", ".join(f"{k}={v}" for k, v in strict.items()))
        print(f"\n{name}: {rule.description} [{strict_text}]")
        for p in rule.params.values():
            grid = ", ".join(map(str, p.grid)) if p.grid else "-"
            print(f"  --param {p.name}=<{p.default}>  range {p.range_str()}  paper grid: {grid}")
        for t in rule.inputs.values():
            print(f"  input {t.name}: {t.doc}")
        print(f"  needs: {rule.needs_text()}")
        print(f"  at temperature 0: {rule.at_greedy}")
        verdict = "ok" if rule.valid_with_one_hot_q else "refused"
        print(f"  one-hot q (drafter without distributions): {verdict}: {rule.one_hot_q}")
    return 0


_GREEDY_NOTE = ("At temperature 0 (or below 1e-5) every rule is applied to one-hot p and q (greedy='rule', "
                "the default);\ngreedy='strict' makes every rule strict argmax matching, as the reference "
                "implementation does.")


def _rule_info(rule) -> dict:
    return {"description": rule.description, "strict": rule.strict_params(),
            "params": {p.name: {"default": p.default, "range": p.range_str(), "grid": list(p.grid or []),
                                "doc": p.doc}
                       for p in rule.params.values()},
            "needs": {"extra_draft_passes": rule.extra_draft_passes, "reads_q": rule.reads_q,
                      "inputs": {t.name: t.doc for t in rule.inputs.values()},
                      "state": {t.name: t.doc for t in rule.state.values()}, "reads_uniforms": rule.reads_uniforms,
                      "greedy_closed_form": rule.greedy_closed_form},
            "at_temperature_0": rule.at_greedy,
            "one_hot_q": {"valid": rule.valid_with_one_hot_q, "behaviour": rule.one_hot_q}}


# ------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    from relaxspec import __version__
    from relaxspec.cli import bench, drafter, generate, models, pivot, tasks, tune

    ap = argparse.ArgumentParser(prog="relaxspec", description=__doc__)
    ap.add_argument("--version", action="version", version=f"relaxspec {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    m = sub.add_parser("methods", help="list every acceptance rule with its parameters")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_methods)

    for commands in (generate, models, bench, pivot, tasks, drafter, tune):
        commands.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except KeyboardInterrupt as e:  # Ctrl-C (or SIGTERM once bench or tune set it up) where a command does not say
        print("\nrelaxspec: interrupted", file=sys.stderr)  # what it kept (bench and tune do): one line
        from relaxspec.cli.options import Terminated
        return 143 if isinstance(e, Terminated) else 130
    except BrokenPipeError:  # the reader of our output went away (`relaxspec generate --json | head`): quietly
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 141
    except (ValueError, OSError) as e:  # user-facing errors (bad input, missing or unreadable files): one line
        print(f"relaxspec: error: {e}", file=sys.stderr)
        return 2

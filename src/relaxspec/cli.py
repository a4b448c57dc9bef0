"""relaxspec command line: generate / methods / models / bench / report / pivot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parse_value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def parse_params(pairs: list[str] | None) -> dict:
    params = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--param expects KEY=VALUE, got {pair!r}")
        params[key.strip().replace("-", "_")] = _parse_value(value.strip())
    return params


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
                      "greedy_closed_form": rule.greedy_closed_form},
            "at_temperature_0": rule.at_greedy,
            "one_hot_q": {"valid": rule.valid_with_one_hot_q, "behaviour": rule.one_hot_q}}


# ------------------------------------------------------------------ generate


def _read_prompts(args) -> list[str]:
    from relaxspec.tasks.base import jsonl_records

    if args.prompt is not None:
        return [args.prompt]
    name = "<stdin>" if args.prompts == "-" else args.prompts
    if args.prompts == "-":
        data = sys.stdin.buffer.read()
    else:
        if Path(name).is_dir():
            raise ValueError(f"--prompts {name}: is a directory, not a JSONL file")
        data = Path(name).read_bytes()
    prompts = []
    for line_no, record in jsonl_records(name, data):
        if not isinstance(record.get("prompt"), str):
            raise ValueError(f"{name}:{line_no}: expected an object with a string 'prompt'")
        prompts.append(record["prompt"])
    if not prompts:
        raise ValueError(f"{name}: no prompts")
    return prompts


# TOML keys `generate --config` reads (the bench's keys it has no use for are accepted and ignored)
GENERATE_KEYS = ("verifier", "drafter", "method", "draft_length", "max_new_tokens", "temperature", "top_k", "top_p",
                 "seed", "phase")


def apply_generate_config(args, defaults: dict) -> dict:
    """Fill the generate options left at their defaults from args.config; the method's parameters, given in the
    bench's grammar 'NAME:PARAM=V;PARAM=V', come back as a dict (explicit --param wins)."""
    from relaxspec.bench.config import BenchConfig, load_toml, parse_method

    data = load_toml(args.config)
    known = set(BenchConfig.__dataclass_fields__) | {"verifier", "drafter", "task", "method", "draft_length", "seed",
                                                     "sampling"}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ValueError(f"generate config {args.config}: unknown setting {key!r}")
        if name not in GENERATE_KEYS:
            continue
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError(f"generate config: {key!r} must be one value, got {value!r}")
            value = value[0]
        if getattr(args, name) == defaults[name]:
            setattr(args, name, value)
    params = {}
    if isinstance(args.method, str) and ":" in args.method:
        specs = parse_method(args.method)
        if len(specs) != 1:
            raise ValueError(f"generate: method {args.method!r} names {len(specs)} settings; give one")
        args.method, params = specs[0]
    return params


def cmd_generate(args) -> int:
    from relaxspec.engine import generate
    from relaxspec.engine.phase import parse_phase
    from relaxspec.models import load_model
    from relaxspec.models.drafters import load_drafter
    from relaxspec.models.options import device_kwargs, prompt_kwargs

    params = {}
    if args.config is not None:
        params = apply_generate_config(args, {k: args.parser_defaults[k] for k in GENERATE_KEYS})
    params.update(parse_params(args.param))
    prompts = _read_prompts(args)
    parse_phase(args.phase)  # a malformed spec is an error before any model loads
    verifier = load_model(args.verifier, **device_kwargs(args))
    drafter = None if args.method == "ar" else load_drafter(args.drafter, verifier)
    pivot_fn = None
    if args.method == "pad":
        from relaxspec.pivot import builtin_classifier_path, load_classifier

        path = params.pop("classifier", None) or builtin_classifier_path()
        pivot_fn = load_classifier(path).pivot_fn(verifier, getattr(drafter, "lm", None), force=args.force)
    out = generate(verifier, drafter, prompts, method=args.method, draft_length=args.draft_length,
                   max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, pivot_fn=pivot_fn, phase=args.phase, **prompt_kwargs(args), **params)
    if args.json:
        print(json.dumps({"results": [{"prompt": r.prompt, "text": r.text, "token_ids": r.token_ids,
                                       "seed": r.seed, "stats": _public_stats(r.stats)} for r in out.results],
                          "stats": _public_stats(out.stats)}))
        return 0
    for r in out.results:
        if len(out.results) > 1:
            print(f"--- {r.prompt}")
        # AR has no drafts to mark: --show prints its text.
        print(render_trace(r, verifier.tokenizer, color=sys.stdout.isatty()) if args.show and r.trace else r.text)
    s = out.stats
    print(f"[{args.method}] {s.generated_tokens} tokens in {s.time_total_s:.2f}s; "
          f"acceptance rate {s.acceptance_rate:.2f}; mean acceptance length (with bonus) "
          f"{s.mean_acceptance_length:.2f}; verifier forwards {s.verifier_forwards}", file=sys.stderr)
    if args.show and args.method != "ar":
        print(SHOW_LEGEND_COLOR if sys.stdout.isatty() else SHOW_LEGEND_PLAIN, file=sys.stderr)
    return 0


def _public_stats(stats) -> dict:
    return stats.as_dict()


SHOW_LEGEND_PLAIN = "legend: token = accepted draft; {token} = accepted only because the rule is relaxed " \
                    "(strict would have rejected it); [-draft-]>token = rejected draft, then the verifier's token; " \
                    "<token> = bonus token"
SHOW_LEGEND_COLOR = "legend: green = accepted draft; yellow = accepted only because the rule is relaxed; " \
                    "red struck-through = rejected draft, followed by the verifier's token in bold; blue = bonus"


def render_trace(result, tokenizer, color: bool = False) -> str:
    """The response with every drafted token marked (see the legends above)."""
    def piece(t):
        return tokenizer.decode([t])

    def style(text, code):
        return f"\x1b[{code}m{text}\x1b[0m" if color else text

    eos = tokenizer.eos_token_id
    parts, budget = [], len(result.token_ids)
    for rnd in result.trace:
        for i in range(rnd.num_accepted):
            if budget <= 0:
                break
            t = rnd.drafts[i]
            budget -= 1
            if rnd.relaxed_only[i]:
                parts.append(style(piece(t), "33") if color else "{" + piece(t) + "}")
            else:
                parts.append(style(piece(t), "32") if color else piece(t))
        if budget <= 0 or rnd.emitted == eos:
            break
        budget -= 1
        if rnd.num_accepted < len(rnd.drafts):
            rejected = piece(rnd.drafts[rnd.num_accepted])
            parts.append(style(rejected, "9;31") + style(piece(rnd.emitted), "1") if color
                         else f"[-{rejected}-]>{piece(rnd.emitted)}")
        else:
            parts.append(style(piece(rnd.emitted), "34") if color else f"<{piece(rnd.emitted)}>")
    return "".join(parts)


# ------------------------------------------------------------------ models


def cmd_models(args) -> int:
    from relaxspec.models import family

    if args.models_cmd == "path":
        print(family.builtin_path(args.name))
        return 0
    from relaxspec.bench.family import family_table
    from relaxspec.models.options import device_kwargs

    if args.models_cmd == "train":
        from relaxspec.models.train import train_family

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


# ------------------------------------------------------------------ main


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default in --help, unless it is None / False or its help already says it."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from relaxspec import __version__
    from relaxspec.bench import commands as bench_commands
    from relaxspec.models.family import BUILTIN_DIR, DEFAULT_DRAFTER, DEFAULT_VERIFIER
    from relaxspec.models.options import add_device_args, add_prompt_args
    from relaxspec.pivot import commands as pivot_commands
    from relaxspec.models import drafter_commands
    from relaxspec.tasks import commands as tasks_commands
    from relaxspec.tune import commands as tune_commands

    defaults = DefaultsHelpFormatter
    ap = argparse.ArgumentParser(prog="relaxspec", description=__doc__)
    ap.add_argument("--version", action="version", version=f"relaxspec {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    m = sub.add_parser("methods", help="list every acceptance rule with its parameters")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_methods)

    g = sub.add_parser("generate", help="speculative (or autoregressive) generation", formatter_class=defaults)
    g.add_argument("--config", type=Path, help="TOML settings (e.g. the tune.toml `relaxspec tune` writes); flags "
                                               "override it")
    g.add_argument("--verifier", default=DEFAULT_VERIFIER,
                   help="built-in model name, HF model directory, FILE.gguf, DIR::FILE.gguf or smollm2")
    g.add_argument("--drafter", default=DEFAULT_DRAFTER, help="LM (same forms as --verifier), MTP head "
                   "(drafter-mtp, smollm2-drafter or a `drafter train` directory) or ngram[:n=3][,min=1] (prompt lookup)")
    g.add_argument("--method", default="strict", help="'ar' (no drafter) or an acceptance rule (see `relaxspec methods`)")
    g.add_argument("--param", action="append", metavar="KEY=VALUE", help="rule parameter (repeatable)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--prompts", help="JSONL file with a 'prompt' per line ('-': standard input)")
    g.add_argument("--draft-length", type=int, default=5, help="tokens the drafter proposes per round (N)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="generated tokens per prompt, at most")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    g.add_argument("--top-k", type=int, help="keep the k most likely tokens (default: all)")
    g.add_argument("--top-p", type=float, help="keep the smallest set of tokens with this mass (default: all)")
    g.add_argument("--seed", type=int, default=0, help="sequence i samples with a seed derived from (SEED, i)")
    g.add_argument("--phase", help="relax only inside a span of the response, strict outside: 'think' (<think> .. "
                                   "</think>) or 'BEGIN..END' (token strings, #ID for a token id; a side may be empty)")
    add_prompt_args(g)
    add_device_args(g)
    g.add_argument("--force", action="store_true",
                   help="pad: use the pivot classifier even with models other than the ones it was trained with")
    g.add_argument("--json", action="store_true", help="print exactly one JSON object")
    g.add_argument("--show", action="store_true", help="mark accepted / rejected / relaxed-only drafts")
    g.set_defaults(func=cmd_generate)
    g.set_defaults(parser_defaults={k: g.get_default(k) for k in GENERATE_KEYS})

    md = sub.add_parser("models", help="the built-in model family")
    msub = md.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list", help="sizes, latency, c_rel and task accuracy", formatter_class=defaults)
    mp = msub.add_parser("path", help="directory of a built-in model")
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
        add_device_args(p)
    ml.add_argument("--dir", type=Path, default=BUILTIN_DIR, help="a family directory (default: the shipped one)")
    ml.add_argument("--threads", type=int, default=1, help="torch CPU threads for the latency column (as the bench)")
    md.set_defaults(func=cmd_models)

    for commands in (bench_commands, pivot_commands, tasks_commands, drafter_commands, tune_commands):
        commands.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:  # user-facing errors (bad input, missing or unreadable files): one line
        print(f"relaxspec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

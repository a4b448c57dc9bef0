"""`relaxspec generate`: speculative (or autoregressive) generation from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from relaxspec.names import AR, AUTO


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
        name = key.strip().replace("-", "_")
        if name in params:
            raise ValueError(f"--param {name} given twice ({params[name]!r} and {_parse_value(value.strip())!r}); give it once")
        params[name] = _parse_value(value.strip())
    return params


def _read_prompts(args) -> list[str]:
    from relaxspec.models.prompts import check_text
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
        if not record["prompt"].strip():
            raise ValueError(f"{name}:{line_no}: the prompt is empty or whitespace only")
        check_text(record["prompt"], f"{name}:{line_no}: the prompt")
        prompts.append(record["prompt"])
    if not prompts:
        raise ValueError(f"{name}: no prompts")
    return prompts


# TOML keys `generate --config` reads (the bench's keys it has no use for are accepted and ignored)
GENERATE_KEYS = ("verifier", "drafter", "method", "draft_length", "max_new_tokens", "temperature", "top_k", "top_p",
                 "seed", "phase", "draft_confidence")


GENERATE_KEY_KINDS = {"verifier": (str,), "drafter": (str,), "method": (str,), "phase": (str,),
                      "draft_length": (int, str), "temperature": (int, float), "top_p": (int, float),
                      "draft_confidence": (int, float)}  # other keys: integers
KIND_NAMES = {(str,): "a string", (int,): "an integer", (int, float): "a number", (int, str): "an integer or 'auto'"}


def apply_generate_config(args, defaults: dict) -> dict:
    """Fill the generate options left at their defaults from args.config; the method's parameters, given in the
    bench's grammar 'NAME:PARAM=V;PARAM=V', come back as a dict (explicit --param wins)."""
    from relaxspec.bench.config import BenchConfig
    from relaxspec.bench.methods import parse_method
    from relaxspec.bench.settings import load_toml

    data = load_toml(args.config, "generate config")
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
        kind = GENERATE_KEY_KINDS.get(name, (int,))
        if isinstance(value, bool) or not isinstance(value, kind) or (isinstance(value, str) and kind == (int, str)
                                                                       and value != AUTO):
            raise ValueError(f"generate config {args.config}: {key!r} must be {KIND_NAMES[kind]}, got {value!r}")
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
    from relaxspec.acceptance import check_sampling_args
    from relaxspec.acceptance.random import check_seed
    from relaxspec.engine import generate
    from relaxspec.engine.generate import check_draft_confidence
    from relaxspec.engine.phase import parse_phase
    from relaxspec.models import load_model
    from relaxspec.drafters import load_drafter
    from relaxspec.cli.options import check_positive, device_kwargs, prompt_kwargs

    params = {}
    if args.config is not None:
        params = apply_generate_config(args, {k: args.parser_defaults[k] for k in GENERATE_KEYS})
    if args.json and args.show:
        raise ValueError("--show marks drafts in the text output; --json prints no text to mark (use one of them)")
    check_seed(args.seed, "--seed")
    check_positive(args, "max_new_tokens", *(() if args.draft_length == AUTO else ("draft_length",)))
    check_sampling_args(args.temperature, args.top_k, args.top_p)
    params.update(parse_params(args.param))
    prompts = _read_prompts(args)
    parse_phase(args.phase)  # a malformed spec is an error before any model loads
    check_draft_confidence(args.draft_confidence)
    if args.draft_confidence is not None and args.method == AR:
        raise ValueError("--draft-confidence: method 'ar' drafts nothing")
    if args.phase is not None and args.method == AR:
        raise ValueError("--phase: method 'ar' verifies no drafts (a phase chooses where a rule relaxes)")
    verifier = load_model(args.verifier, **device_kwargs(args), compile=bool(args.compile))
    drafter = None if args.method == AR else load_drafter(args.drafter, verifier)
    pivot_fn = None
    from relaxspec.bench.methods import needs_classifier

    if needs_classifier(args.method):
        from relaxspec.pivot import classifier_for_pair, load_classifier

        # none given: the one shipped for this pair (pivot/builtin/, found by the pair's fingerprints)
        path = params.pop("classifier", None) or classifier_for_pair(verifier, getattr(drafter, "lm", None),
                                                                     force=args.force)
        pivot_fn = load_classifier(path).pivot_fn(verifier, getattr(drafter, "lm", None), force=args.force)
    out = generate(verifier, drafter, prompts, method=args.method, draft_length=args.draft_length,
                   max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, pivot_fn=pivot_fn, phase=args.phase,
                   draft_confidence=args.draft_confidence, **prompt_kwargs(args),
                   **params)
    if args.json:
        print(json.dumps({"results": [{"prompt": r.prompt, "text": r.text, "token_ids": r.token_ids,
                                       "seed": r.seed, "stats": r.stats.as_dict(per_result=True)}
                                      for r in out.results],
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
          f"{s.mean_acceptance_length:.2f}; verifier forwards {s.verifier_forwards}"
          + (f"; {s.phase_relaxed_positions} of {s.drafts_proposed} drafts inside the phase" if args.phase else ""),
          file=sys.stderr)
    if args.show and args.method != AR:
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


def register(subparsers) -> None:
    from relaxspec.models.family import DEFAULT_DRAFTER, DEFAULT_VERIFIER
    from relaxspec.cli.options import (DefaultsHelpFormatter, add_compile_arg, add_device_args, add_prompt_args,
                                       draft_length_arg)

    sub, defaults = subparsers, DefaultsHelpFormatter
    g = sub.add_parser("generate", help="speculative (or autoregressive) generation", formatter_class=defaults)
    g.add_argument("--config", type=Path, help="TOML settings (e.g. the tune.toml `relaxspec tune` writes); flags "
                                               "override it")
    g.add_argument("--verifier", default=DEFAULT_VERIFIER,
                   help="built-in model name, HF model directory, FILE.gguf, DIR::FILE.gguf or smollm2")
    g.add_argument("--drafter", default=DEFAULT_DRAFTER, help="LM (same forms as --verifier), MTP head "
                   "(drafter-mtp, smollm2-drafter, qwen2.5-coder-1.5b-head or a `drafter train` directory) or ngram[:n=3][,min=1] (prompt lookup)")
    g.add_argument("--method", default="strict", help="'ar' (no drafter) or an acceptance rule (see `relaxspec methods`)")
    g.add_argument("--param", action="append", metavar="KEY=VALUE", help="rule parameter (repeatable)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--prompts", help="JSONL file with a 'prompt' per line ('-': standard input)")
    g.add_argument("--draft-length", type=draft_length_arg, default=5,
                   help="tokens the drafter proposes per round (N), or 'auto': 5, +2 after a fully accepted round, "
                        "-1 after any other, within [1, 10], per sequence")
    g.add_argument("--draft-confidence", type=float, metavar="T",
                   help="a sequence stops drafting after a draft its drafter gave probability < T (the draft is "
                        "still proposed; transformers' assistant_confidence_threshold); never fires for ngram")
    g.add_argument("--max-new-tokens", type=int, default=128, help="generated tokens per prompt, at most")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    g.add_argument("--top-k", type=int, help="keep the k most likely tokens (default: all)")
    g.add_argument("--top-p", type=float, help="keep the smallest set of tokens with this mass (default: all)")
    g.add_argument("--seed", type=int, default=0, help="sequence i samples with a seed derived from (SEED, i)")
    g.add_argument("--phase", help="relax only inside a span of the response, strict outside: 'think' (<think> .. "
                                   "</think>) or 'BEGIN..END' (token strings, #ID for a token id; a side may be empty)")
    add_prompt_args(g)
    add_device_args(g)
    add_compile_arg(g)
    g.add_argument("--force", action="store_true",
                   help="pad: use the pivot classifier even with models other than the ones it was trained with")
    g.add_argument("--json", action="store_true", help="print exactly one JSON object")
    g.add_argument("--show", action="store_true", help="mark accepted / rejected / relaxed-only drafts")
    g.set_defaults(func=cmd_generate)
    g.set_defaults(parser_defaults={k: g.get_default(k) for k in GENERATE_KEYS})

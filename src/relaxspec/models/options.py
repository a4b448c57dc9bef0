"""Command-line options every command that loads models shares (generate, bench, pivot, models)."""

from __future__ import annotations

import argparse

from relaxspec.models.device import DTYPE_CHOICES
from relaxspec.models.prompts import CHAT_TEMPLATE_MODES


def add_device_args(parser) -> None:
    """--device and --dtype; pass `device_kwargs(args)` to `load_model`."""
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:N or mps (default: cuda when available, else cpu; "
                             "$RELAXSPEC_DEVICE overrides the default)")
    parser.add_argument("--dtype", default=None, choices=DTYPE_CHOICES,
                        help="the weights' format (default: bfloat16 on CUDA, float32 elsewhere; $RELAXSPEC_DTYPE "
                             "overrides the default). On a CPU: float32, bfloat16 or int4 (weight-only, groups of "
                             "32), stored once; auto: a GGUF file in the precision it was shipped in (Q4 -> int4), "
                             "anything else float32; file: a qwen2 GGUF file's matrices in their own types (Q4_K, "
                             "Q6_K, Q5_0, Q8_0, ...), the head included. Norms, attention and logits stay float32 "
                             "before any rule")


def device_kwargs(args) -> dict:
    return {"device": args.device, "dtype": args.dtype}


def add_compile_arg(parser) -> None:
    """--compile (generate, bench, tune); pass `compile=args.compile` to `load_model`."""
    parser.add_argument("--compile", action="store_true", default=None,
                        help="run the models' steps through torch.compile with a static KV cache (Llama "
                             "architectures; CUDA graphs on CUDA; compiles for a minute or more first; off by "
                             "default: slower on the CPU measured, see README)")


def add_prompt_args(parser) -> None:
    """--chat-template and --system; pass `prompt_kwargs(args)` to `generate` / `encode_prompts`."""
    parser.add_argument("--chat-template", default="auto", choices=CHAT_TEMPLATE_MODES,
                        help="wrap each prompt in the tokenizer's chat template (auto: when it has one, except a "
                        "prompt that already holds its markers, e.g. <|im_start|>, which is left as it is)")
    parser.add_argument("--system", default=None, metavar="TEXT", help="system turn before each prompt "
                        "(needs a chat template)")


def check_positive(args, *names: str) -> None:
    """ValueError naming the flag unless each of `names` (argparse dests) is > 0 (None: not given, fine).
    Commands call it first, before loading models or doing any work."""
    for name in names:
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")


def prompt_kwargs(args) -> dict:
    return {"chat_template": args.chat_template, "system": args.system}


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default in --help, unless it is None / False or its help already says it."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)

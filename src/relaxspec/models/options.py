"""Command-line options every command that loads models shares (generate, bench, pivot, models)."""

from __future__ import annotations

import argparse

from relaxspec.models.device import DTYPES
from relaxspec.models.prompts import CHAT_TEMPLATE_MODES


def add_device_args(parser) -> None:
    """--device and --dtype; pass `device_kwargs(args)` to `load_model`."""
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:N or mps (default: cuda when available, else cpu; "
                             "$RELAXSPEC_DEVICE overrides the default)")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                        help="the weights' precision (default: bfloat16 on CUDA, float32 elsewhere; "
                             "$RELAXSPEC_DTYPE overrides the default); on a CPU "
                             "the fast Llama path computes in float32; logits are float32 before any rule sees them")


def device_kwargs(args) -> dict:
    return {"device": args.device, "dtype": args.dtype}


def add_prompt_args(parser) -> None:
    """--chat-template and --system; pass `prompt_kwargs(args)` to `generate` / `encode_prompts`."""
    parser.add_argument("--chat-template", default="auto", choices=CHAT_TEMPLATE_MODES,
                        help="wrap each prompt in the tokenizer's chat template (auto: when it has one)")
    parser.add_argument("--system", default=None, metavar="TEXT", help="system turn before each prompt "
                        "(needs a chat template)")


def prompt_kwargs(args) -> dict:
    return {"chat_template": args.chat_template, "system": args.system}


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default in --help, unless it is None / False or its help already says it."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)

"""Command-line options the scripts share, and their checks (a bad value: the parser's one-line error, exit 2)."""

from __future__ import annotations

import argparse


def parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser, its docstring as the description, laid out as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add(ap: argparse.ArgumentParser, **options) -> None:
    """Options from keywords, in order: `max_new_tokens=64` adds --max-new-tokens, of the default's type (an int,
    float or str; False: a flag); a tuple gives (default, help)."""
    for name, default in options.items():
        default, help = default if isinstance(default, tuple) else (default, None)
        flag = "--" + name.replace("_", "-")
        if default is False:
            ap.add_argument(flag, action="store_true", help=help)
        elif isinstance(default, str):
            ap.add_argument(flag, default=default, help=help)
        else:
            ap.add_argument(flag, type=type(default), default=default, help=help)


def chat_prompts(ap: argparse.ArgumentParser, default: int, flag: str = "--prompts", help: str | None = None) -> None:
    """How many of the held-out chat prompts (relaxspec.tasks.chat.HELDOUT) to run; check it with `within_chat`."""
    from relaxspec.tasks import chat

    help = help or f"held-out chat prompts (at most {len(chat.HELDOUT)})"
    ap.add_argument(flag, type=int, default=default, help=help)


def within_chat(ap: argparse.ArgumentParser, count: int, flag: str = "--prompts", low: int = 1) -> None:
    """The parser's error unless `low` <= count <= the held-out chat prompts."""
    from relaxspec.tasks import chat

    if not low <= count <= len(chat.HELDOUT):
        ap.error(f"{flag} must be between {low} and {len(chat.HELDOUT)}")


def positive(ap: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """The parser's error where one of the options `names` (dests) is given and below 1."""
    for name in names:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer")


def progress(ap: argparse.ArgumentParser) -> None:
    """--no-progress: no progress bars."""
    ap.add_argument("--no-progress", action="store_true")


def csv_file(ap: argparse.ArgumentParser, name: str) -> None:
    """--csv FILE, by default relaxspec-results/<name>.csv."""
    from pathlib import Path

    ap.add_argument("--csv", type=Path, default=Path(f"relaxspec-results/{name}.csv"))

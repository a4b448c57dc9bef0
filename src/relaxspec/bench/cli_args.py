"""What the long-running commands share (bench, tune, models): list options, the thread count, and how a run
stops on Ctrl-C or SIGTERM with what it stored kept."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def csv_list(cast):
    """An argparse type: a comma-separated list of `cast` values (bench's and tune's list options)."""
    def parse(text: str):
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        try:
            return [cast(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid list {text!r}") from None
    return parse



def check_threads(threads: int) -> None:
    """--threads: ValueError (one line) unless a positive number of torch CPU threads."""
    if threads < 1:
        raise ValueError(f"--threads must be a positive integer, got {threads}")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread (on_sigterm): a long run stops as on Ctrl-C, its worker processes ended
    and what is stored kept, rather than dying with its workers still writing to it."""


def on_sigterm() -> None:
    """From now on SIGTERM raises Terminated in this process (bench and tune call it before any work)."""
    import signal

    def raise_terminated(signum, frame):
        raise Terminated()
    signal.signal(signal.SIGTERM, raise_terminated)


def interrupted(command: str, what: str, out: Path, reason: KeyboardInterrupt | None = None) -> int:
    """Ctrl-C (or SIGTERM: Terminated) in a long run: say what is kept and how to resume; the shell's exit status
    for the signal (130 for SIGINT, 143 for SIGTERM)."""
    print(f"\n{command}: interrupted; {what} stored in {out / 'results.sqlite'}; re-run the same command to resume",
          file=sys.stderr)
    return 143 if isinstance(reason, Terminated) else 130


def fetch_each(names, fetch) -> int:
    """`models fetch` and `tasks fetch`: fetch(name) for each name, printing what it returns (a path); Ctrl-C or
    SIGTERM stops it with one line (exit 130 / 143), the fetch in flight having removed its files and its pip."""
    on_sigterm()
    for name in names:
        try:
            result = fetch(name)
        except KeyboardInterrupt as e:
            print(f"relaxspec: error: fetching {name!r} interrupted; nothing of it was kept", file=sys.stderr)
            return 143 if isinstance(e, Terminated) else 130
        print(result, flush=True)
    return 0

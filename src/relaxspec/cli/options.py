"""What the commands share: the draft length (generate, bench, tune), list options, the thread count, where cells run
(bench, tune), and how a long run stops on Ctrl-C or SIGTERM with what it stored kept."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relaxspec.bench import ExecutorOptions
from relaxspec.bench.executors import EXECUTORS


def draft_length_arg(text: str):
    """--draft-length: an integer, or 'auto'."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


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


def add_executor_arguments(parser) -> None:
    """--executor, --ray-address, --cells-per-worker, --gpus-per-cell (bench and tune)."""
    g = parser.add_argument_group("where cells run")
    g.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: in this process; ray: on Ray workers (pip install 'relaxspec[ray]')")
    g.add_argument("--ray-address", help="join this Ray cluster (auto or HOST:PORT; default: start a local instance "
                                         "with this machine's CPUs)")
    g.add_argument("--cells-per-worker", type=int, default=1,
                   help="cells each Ray worker holds at a time, running + queued (default 1)")
    g.add_argument("--gpus-per-cell", type=float, default=0.0, help="GPUs each Ray worker reserves (default 0)")


def executor_options(args) -> ExecutorOptions:
    """ExecutorOptions from the flags of add_executor_arguments; each Ray worker reserves --threads CPUs."""
    options = ExecutorOptions(kind=args.executor, ray_address=args.ray_address,
                              cells_per_worker=args.cells_per_worker, gpus_per_cell=args.gpus_per_cell,
                              cpus_per_cell=float(getattr(args, "threads", None) or 1))
    options.validate()
    return options


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

"""What the commands share: the options of every command that loads models (generate, bench, pivot, models), the
draft length, list options, the thread count, where cells run (bench, tune), and how a long run stops on Ctrl-C or
SIGTERM with what it stored kept."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relaxspec.bench import ExecutorOptions
from relaxspec.bench.executors import EXECUTORS
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

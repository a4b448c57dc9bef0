"""Seconds from process start to generating and to the first generated token, and peak resident memory, of
`relaxspec generate` with a pair of models, call after call: the first call of a GGUF pair in a format converts it
and writes the converted-weight cache (models/weight_cache.py), the calls after it map that.

    python benchmarks/start_time.py [--verifier qwen2.5-coder-1.5b] [--drafter qwen2.5-coder-0.5b] [--dtype int4]
        [--max-new-tokens 16] [--prompt "def fib(n):"] [--calls 2]

Each call is a fresh process running `relaxspec generate --verifier V --drafter D --dtype F --max-new-tokens N
--prompt P --json` (the CLI's own `main`, as the `relaxspec` script runs it), timed from just before it starts:
"to generating" is when the decoding starts (imports, both loads and tokenizers done, the prompt encoded), "to first
token" when its start (the prefills) gave the first token, "wall" the whole call; each in wall seconds and, in
brackets, the process's CPU seconds (all its threads). The peak RSS is the process's own (`os.wait4`, as
`/usr/bin/time -v` reports it). "cache" says what the call's stderr said of the cache: "written" (a conversion),
"rebuilt" (a stale or damaged entry), "-" (every entry read, or the cache off). The 1-minute load average at each
call's start stands beside it: on a machine busy with other work the wall times are pessimistic; the CPU seconds of
the imports and loads (one thread) move less, those of the prefills (two threads, which wait for each other
spinning while one is descheduled) grow with the load. Any `--verifier`/`--drafter` names work (`verifier` and
`drafter-weak`: the built-in pair, no GGUF file, no cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from harness.options import add, parser, positive
from harness.output import header, num, row

CHILD = """
import sys, time
from relaxspec.engine import round as rounds


def mark(what):
    print(f"start_time: {what} {time.time()!r} {time.process_time()!r}", file=sys.stderr, flush=True)


def timed(start):
    def wrapped(self):
        mark("generating")
        last = start(self)
        mark("first token")
        return last
    return wrapped


for decoding in (rounds.Autoregressive, rounds.Speculative):
    decoding.start = timed(decoding.start)
from relaxspec.cli import main

sys.exit(main(sys.argv[1:]))
"""


WHEN = ("generating", "first token", "wall")  # the times of a call, in the table's order


def call(args) -> dict:
    """One `generate` call in a fresh process: its figures."""
    command = [sys.executable, "-c", CHILD, "generate", "--verifier", args.verifier, "--drafter", args.drafter,
               "--dtype", args.dtype, "--max-new-tokens", str(args.max_new_tokens), "--prompt", args.prompt, "--json"]
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        began = time.time()
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        ended = time.time()
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        return {"error": (stderr.strip().splitlines() or [f"exit {process.returncode}"])[-1], "load": load}
    times = {"wall": (ended - began, usage.ru_utime + usage.ru_stime)}  # (seconds, CPU seconds) from the start
    for line in stderr.splitlines():
        if line.startswith("start_time: "):
            what, at, cpu = line.removeprefix("start_time: ").rsplit(maxsplit=2)
            times[what] = (float(at) - began, float(cpu))
    said = [line for line in stderr.splitlines() if line.startswith("relaxspec:") and "cache" in line]
    cache = ("written" if any("cached in" in line for line in said)
             else "rebuilt" if any("rebuilding it" in line for line in said) else "-")
    return {"times": times, "peak": usage.ru_maxrss * 1024, "cache": cache, "load": load,
            "tokens": len(json.loads(stdout)["results"][0]["token_ids"])}


def main() -> None:
    ap = parser(__doc__)
    add(ap, verifier="qwen2.5-coder-1.5b", drafter="qwen2.5-coder-0.5b", dtype="int4", max_new_tokens=16,
        prompt="def fib(n):", calls=2)
    args = ap.parse_args()
    positive(ap, args, "max_new_tokens", "calls")
    print(f"relaxspec generate --verifier {args.verifier} --drafter {args.drafter} --dtype {args.dtype} "
          f"--max-new-tokens {args.max_new_tokens} --prompt {args.prompt!r}\n")
    lines = header("call", *(f"{what}, s (CPU s)" for what in ("to generating", "to first token", "wall")),
                   "peak RSS, GB", "tokens", "cache", "load average")
    for k in range(1, args.calls + 1):
        r = call(args)
        if "error" in r:
            lines.append(row(k, f"failed: {r['error']}", *[""] * 5, num(r["load"])))
        else:
            times = [f"{num(seconds)} ({num(cpu)})" for seconds, cpu in (r["times"][what] for what in WHEN)]
            lines.append(row(k, *times, num(r["peak"] / 1e9), r["tokens"], r["cache"], num(r["load"])))
        print(lines[-1] if k > 1 else "\n".join(lines), flush=True)
    print(f"\n- {os.cpu_count()} CPUs; the load average: the 1-minute one at each call's start")


if __name__ == "__main__":
    main()

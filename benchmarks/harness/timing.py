"""Timing that a change in the machine's load hits alike: the configurations take turns prompt by prompt, in an order
rotated from prompt to prompt, and a figure is a median over prompts."""

from __future__ import annotations

import time


def rotated(items: list, shift: int) -> list:
    """`items` starting at `shift` (modulo their count): one prompt's order of turns."""
    shift %= len(items)
    return items[shift:] + items[:shift]


def interleaved(configs: list, prompts: int, run, *, desc: str = "", progress: bool = False,
                repeats: int = 1) -> tuple[dict, dict]:
    """Every configuration once on each of `prompts` prompts, in an order rotated from prompt to prompt (a change in
    the machine's load hits all alike), at its thread count (a configuration's `threads`, where it has one, set
    before the clock starts). run(cfg, i) -> (tokens: a list or their count, anything else, seconds: the call's own
    time, or None for its wall time here). `repeats` R: R rounds per prompt, each rotated one further, and each
    prompt's fastest call kept (a loaded machine's spikes left out); the tokens and the rest are the first round's.
    Returns ({config: [ms/token per prompt]}, {config: [(tokens, anything else) per prompt]})."""
    import torch
    from tqdm import tqdm

    ms = {c: [] for c in configs}
    outs = {c: [] for c in configs}
    bar = tqdm(total=prompts * repeats * len(configs), desc=desc, disable=not progress)
    for i in range(prompts):
        best = {}
        for r in range(repeats):
            for cfg in rotated(configs, i + r):
                threads = getattr(cfg, "threads", None)
                if threads is not None:
                    torch.set_num_threads(threads)
                start = time.perf_counter()
                tokens, other, seconds = run(cfg, i)
                seconds = time.perf_counter() - start if seconds is None else seconds
                per_token = seconds * 1e3 / max(tokens if isinstance(tokens, int) else len(tokens), 1)
                best[cfg] = min(best.get(cfg, float("inf")), per_token)
                if r == 0:
                    outs[cfg].append((tokens, other))
                bar.update()
        for cfg in configs:
            ms[cfg].append(best[cfg])
    bar.close()
    return ms, outs


def clocked(call, total: list, clock=time.thread_time):
    """`call` that adds the time of each of its calls (on `clock`) to total[0]; set as a class's attribute it
    wraps a method (the instance comes first among the arguments)."""
    def wrapper(*args, **kwargs):
        start = clock()
        try:
            return call(*args, **kwargs)
        finally:
            total[0] += clock() - start
    return wrapper


def strict_constants(name: str, verifier, drafters: dict, cells, rounds: int | None = None) -> dict:
    """`relaxspec bench`'s speed constants (bench.cell.speed_constants: interleaved rounds, medians of the ratios
    within a round) of one verifier, keyed `name`, and its drafters ({drafter name: Drafter}), at the (drafter name,
    N) of `cells`, strict: {(name, drafter name, N): speed_constants' entry}."""
    from relaxspec.bench.cell import CellSpec, speed_constants

    specs = [CellSpec(name, d, "", "strict", {}, n, 0) for d, n in cells]
    return speed_constants({name: verifier}, specs, **({} if rounds is None else {"rounds": rounds}),
                           drafters={(name, d): drafter for d, drafter in drafters.items()})


def builtin_pair(prompts: int, verifier: str = "verifier", drafter: str = "drafter-weak") -> tuple:
    """(the verifier, the drafter (LMs, load_model names), the arithmetic task's first `prompts` test prompts), after
    one short strict call on the first prompt (untimed: kernels built, first buffers allocated)."""
    from relaxspec.engine import generate
    from relaxspec.models import load_model
    from relaxspec.tasks.synthetic import synthetic_task

    lms = load_model(verifier), load_model(drafter)
    texts = synthetic_task("arithmetic", "test", prompts).prompts
    generate(*lms, texts[:1], method="strict", draft_length=3, max_new_tokens=8)
    return (*lms, texts)

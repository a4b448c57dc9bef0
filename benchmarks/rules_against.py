"""The acceptance rules in this source tree against another (e.g. the commit before a rewrite of their math): the same
token ids end to end, the verify step's time and its tensor ops per call, per rule.

    python benchmarks/rules_against.py --against OTHER/src [--rules cactus typical ...] [--drafts 3]
        [--prompts 6] [--seeds 0 1] [--repeats 1000] [--passes 2] [--skip-tokens] [--skip-time]

OTHER/src is a tree exported with `git archive COMMIT src | tar -x -C /tmp/base`. Each tree runs in its own worker
process (one torch thread).
* tokens: `generate` on the built-in pair (verifier, drafter-weak), T=0.7 top-p 0.95, N drafts, each arithmetic prompt
  one at a time with each seed, in both trees: the token ids must be identical (exit status 1 otherwise); the thread
  CPU time of those runs per round is printed beside (a few hundred rounds: indicative only).
* ops and time: `VerifyStep` alone on the blocks `verify_step.py` times (B=1, V=714, T=0.7, top-p 0.95, drafts from a
  noisy copy of the verifier, their processed distributions passed, a fresh round of counter draws per call made
  before the timing): aten ops per call (a TorchDispatchMode) and the median thread CPU time per call, the two trees
  taking turns in chunks of 50 calls. Times are the worker thread's CPU time, which other processes' load inflates
  less than wall time; on a shared machine compare the ratios, not the absolute figures. Against a copy of the same
  tree the worker started first measured 2-3% slower, whichever tree it held: each of the --passes starts a fresh
  pair in the other order, and the figures pool the passes (their ratio then reads about 1.00 for the same code).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from harness.options import add, parser

DEFAULT_RULES = ["strict", "cactus", "mentored", "typical", "topk-delta", "topk-ratio", "spec-casc-tok",
                 "spec-cont-dec", "r-fuzzy", "spec-casc-opt", "fuzzy", "threshold", "ensemble"]

WORKER = r"""
import collections, json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
from torch.utils._python_dispatch import TorchDispatchMode
from relaxspec.acceptance import RULES, process_logits
from relaxspec.acceptance.random import SequenceSeeds
from relaxspec.acceptance.verify import VerifyStep
SAMPLING = dict(temperature=0.7, top_p=0.95)
models, prompts, cases = None, None, {}

def case(rule, N, V=714):
    # verify_step.py's blocks, the same in both trees (the generator's stream alone decides them)
    if (rule, N) not in cases:
        g = torch.Generator().manual_seed(0)
        blocks = []
        for _ in range(16):
            target = 3.0 * torch.randn(1, N + 1, V, generator=g)
            draft = target + 1.5 * torch.randn(1, N + 1, V, generator=g)
            q = process_logits(draft[:, :N], **SAMPLING)
            x = torch.multinomial(q[0], 1, generator=g).reshape(1, N)
            inputs = {"pivot_prob": torch.rand(1, N, generator=g)} if "pivot_prob" in RULES[rule].inputs else {}
            blocks.append((target, draft, x, dict(draft_probs=q, **inputs)))
        cases[rule, N] = (VerifyStep(rule, **SAMPLING), blocks, SequenceSeeds([7], "cpu"), [0])
    return cases[rule, N]

def calls(rule, N, count):
    step, blocks, seeds, k = case(rule, N)
    for _ in range(count):
        target, draft, x, inputs = blocks[k[0] % len(blocks)]
        draws = seeds.at(None, N, host_start=np.array([k[0]], dtype=np.int64))
        k[0] += 1
        yield step, target, draft, x, draws, inputs

class Count(TorchDispatchMode):
    n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Count.n += 1
        return func(*args, **(kwargs or {}))

print("ready", flush=True)
for line in sys.stdin:
    kind, rule, N, a, b = json.loads(line)
    if kind == "tokens":
        if models is None:
            from relaxspec.engine import generate
            from relaxspec.models import load_model
            from relaxspec.tasks.synthetic import synthetic_task
            models = load_model("verifier"), load_model("drafter-weak")
            prompts = synthetic_task("arithmetic", "test", 64).prompts
            generate(*models, prompts[-1:], method="strict", draft_length=3, max_new_tokens=8)  # warm-up
        prompt, seed, max_new = a, b, 48
        t = time.thread_time()
        o = generate(*models, [prompts[prompt]], method=rule, draft_length=N, max_new_tokens=max_new, seed=seed,
                     **SAMPLING)
        t = time.thread_time() - t
        print(json.dumps([o.results[0].token_ids, o.stats.verifier_forwards, t]), flush=True)
    elif kind == "ops":
        for step, target, draft, x, draws, inputs in calls(rule, N, 4):  # warm: lazy imports, caches
            step(target, draft, x, random=draws, **inputs)
        Count.n = 0
        work = list(calls(rule, N, a))
        with Count():
            for step, target, draft, x, draws, inputs in work:
                step(target, draft, x, random=draws, **inputs)
        print(json.dumps(Count.n / a), flush=True)
    else:  # time
        times = []
        for step, target, draft, x, draws, inputs in calls(rule, N, a):
            t = time.thread_time()
            step(target, draft, x, random=draws, **inputs)
            times.append(time.thread_time() - t)
        print(json.dumps(times), flush=True)
"""


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--against", required=True, metavar="SRC", help="the other source tree (its src directory)")
    ap.add_argument("--rules", nargs="+", default=DEFAULT_RULES)
    ap.add_argument("--drafts", nargs="+", type=int, default=[3])
    ap.add_argument("--prompts", type=int, default=6, help="arithmetic prompts per rule (tokens)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    add(ap, repeats=(1000, "timed calls per tree and pass (the step alone)"),
        passes=(2, "fresh worker pairs, started in turn order (default 2)"), skip_tokens=False, skip_time=False)
    args = ap.parse_args()

    import relaxspec
    here = os.path.dirname(os.path.dirname(os.path.abspath(relaxspec.__file__)))
    trees = {"this": here, "other": os.path.abspath(args.against)}
    cases = [(rule, N) for rule in args.rules for N in args.drafts]
    same = {c: 0 for c in cases}
    counts = {c: [0, 0] for c in cases}  # tokens, rounds (over the passes)
    seconds = {c: {n: 0.0 for n in trees} for c in cases}
    times = {c: {n: [] for n in trees} for c in cases}
    ops = {}
    differ = []
    for done in range(args.passes):
        # (The worker started first measured 2-3% slower in a run against a copy of the same tree, whichever tree it
        # held: each pass starts them in the other order, and the figures pool the passes.)
        order = tuple(trees) if done % 2 == 0 else tuple(reversed(trees))
        workers = {name: subprocess.Popen([sys.executable, "-c", WORKER], text=True, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=trees[name]))
                   for name in order}

        def ask(name, *request):
            workers[name].stdin.write(json.dumps(list(request)) + "\n")
            workers[name].stdin.flush()
            return json.loads(workers[name].stdout.readline())

        try:
            for w in workers.values():
                assert w.stdout.readline().strip() == "ready"
            for rule, N in cases if not args.skip_tokens else ():
                for prompt in range(args.prompts):
                    for seed in args.seeds:
                        got = {}
                        for n in (order if (prompt + seed) % 2 == 0 else order[::-1]):
                            got[n] = ask(n, "tokens", rule, N, prompt, seed)
                            seconds[rule, N][n] += got[n][2]
                        (ids, r, _), (other_ids, _, _) = got["this"], got["other"]
                        same[rule, N] += ids == other_ids
                        counts[rule, N][0] += len(ids)
                        counts[rule, N][1] += r
                        if ids != other_ids:
                            differ.append((rule, N, prompt, seed))
            for rule, N in cases if not args.skip_time else ():
                ops[rule, N] = {n: ask(n, "ops", rule, N, 32, 0) for n in workers}
                ask("this", "time", rule, N, 50, 0), ask("other", "time", rule, N, 50, 0)  # warm-up
                for k in range(0, args.repeats, 50):
                    for n in (order if k % 100 == 0 else order[::-1]):
                        times[rule, N][n] += ask(n, "time", rule, N, min(50, args.repeats - k), 0)
        finally:
            for w in workers.values():
                w.stdin.close()
                w.wait()

    print(f"this tree: {trees['this']}; other: {trees['other']}; {args.passes} passes")
    if not args.skip_tokens:
        print(f"token ids: built-in pair, T=0.7 top-p 0.95, {args.prompts} arithmetic prompts x seeds {args.seeds}, "
              f"max_new_tokens 48, each pass; thread CPU time of generate per round (the trees taking turns sequence "
              f"by sequence; indicative)")
        print(f"{'rule':<14}{'N':>3}{'identical':>12}{'tokens':>8}{'rounds':>8}{'ms/round':>10}{'other':>8}"
              f"{'ratio':>8}")
        for rule, N in cases:
            a, b = (1e3 * seconds[rule, N][n] / counts[rule, N][1] for n in ("this", "other"))
            total = args.passes * args.prompts * len(args.seeds)
            print(f"{rule:<14}{N:>3}{f'{same[rule, N]}/{total}':>12}{counts[rule, N][0]:>8}{counts[rule, N][1]:>8}"
                  f"{a:>10.3f}{b:>8.3f}{a / b:>8.3f}")
    if not args.skip_time:
        print(f"the step alone: B=1 V=714 T=0.7 top-p 0.95; aten ops per call; median us per call over "
              f"{args.repeats} calls per tree and pass (thread CPU time, the trees taking turns 50 calls at a time)")
        print(f"{'rule':<14}{'N':>3}{'ops':>6}{'other':>7}{'us':>9}{'other':>9}{'ratio':>8}")
        for rule, N in cases:
            a, b = (1e6 * statistics.median(times[rule, N][n]) for n in ("this", "other"))
            print(f"{rule:<14}{N:>3}{ops[rule, N]['this']:>6.0f}{ops[rule, N]['other']:>7.0f}{a:>9.1f}{b:>9.1f}"
                  f"{a / b:>8.3f}")
    if differ:
        print(f"token ids differ: {differ}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""Engine bookkeeping per round: tensor ops outside the models' forwards, and time against another source tree.

    python benchmarks/round_ops.py [--settings 0.7:3 0.0:3 0.7:0 0.0:0] [--prompts 4] [--top 25] [--batch 1]
    python benchmarks/round_ops.py --against OTHER/src [--prompts 16] [--repeats 3] [--drafter drafter-mtp]

Built-in pair, strict, batch 1 (one prompt at a time), one thread; a setting is TEMPERATURE:N (top-p 0.95 when
sampling; N = 0 is AR, a round is one token). Default: per setting, the tensor ops per round dispatched outside
FastLlama.forward (a TorchDispatchMode; the sampler's and the verify step's ops included), the top source lines
(--batch B: the prompts B at a time, a round then serves B rows).
--against: the same runs timed, this tree (`relaxspec` as imported here) against OTHER/src (e.g. an older commit
exported with `git archive COMMIT src | tar -x -C /tmp/base`), each in its own worker process, taking turns
prompt by prompt; prints ms per round of each, in all and outside the models' forwards (FastLlama.forward timed),
and their ratios (totals over the prompts, medians over repeats). Times are the worker thread's CPU time (one
torch thread), which other processes' load inflates less than wall time (cache and memory contention still do). Same outputs are checked on the way (identical
token ids). Also per tree: the drafter's time per draft step (its propose and rollback calls over its forward passes,
the round's bookkeeping for it included) and the engine's tokens per second (CPU time). --drafter: any drafter name
(`load_drafter`: an LM, an MTP head such as drafter-mtp, ngram) instead of drafter-weak.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import traceback

import torch

from harness.options import add, parser
from harness.timing import builtin_pair

HARNESS = os.path.dirname(os.path.abspath(__file__))  # benchmarks/, where the harness package is
WORKER = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from relaxspec.drafters import load_drafter
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.models import fast_llama
from relaxspec.tasks.synthetic import synthetic_task
from harness.timing import clocked
inside = [0.0]
fast_llama.FastLlama.forward = clocked(fast_llama.FastLlama.forward, inside)
v = load_model("verifier")
d = load_drafter(sys.argv[2], v)
drafting = [0.0]
d.propose, d.rollback = clocked(d.propose, drafting), clocked(d.rollback, drafting)
prompts = synthetic_task("arithmetic", "test", int(sys.argv[1])).prompts
generate(v, d, prompts[:1], method="strict", draft_length=3, max_new_tokens=8)
print("ready", flush=True)
for line in sys.stdin:
    T, n, i, m = json.loads(line)
    inside[0] = drafting[0] = 0.0
    t = time.thread_time()
    o = generate(v, d if n else None, [prompts[i]], method="strict" if n else "ar", draft_length=max(n, 1),
                 max_new_tokens=m, temperature=T, top_p=0.95 if T else None, seed=i)
    s = time.thread_time() - t
    print(json.dumps([s, s - inside[0], o.stats.verifier_forwards, o.results[0].token_ids, drafting[0],
                      o.stats.drafter_forwards]), flush=True)
"""


def parse_settings(values):
    return [(float(t), int(n)) for t, n in (v.split(":") for v in values)]


def count_ops(settings, prompt_count, max_new_tokens, top, batch=1):
    from torch.utils._python_dispatch import TorchDispatchMode

    from relaxspec.engine import generate
    from relaxspec.models import fast_llama

    inside = [False]
    forward = fast_llama.FastLlama.forward

    def counted_forward(self, *args, **kwargs):
        inside[0] = True
        try:
            return forward(self, *args, **kwargs)
        finally:
            inside[0] = False

    where = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not inside[0]:
                frames = [f for f in traceback.extract_stack(limit=6) if "relaxspec" in f.filename]
                site = frames[-1] if frames else None
                where[f"{site.filename.split('relaxspec/')[-1]}:{site.lineno}:{site.name}" if site else "?"] += 1
            return func(*args, **(kwargs or {}))

    verifier, drafter, prompts = builtin_pair(prompt_count)
    fast_llama.FastLlama.forward = counted_forward
    try:
        for temperature, n in settings:
            where.clear()
            rounds = 0
            with Count():
                for i in range(0, len(prompts), batch):
                    out = generate(verifier, drafter if n else None, prompts[i:i + batch],
                                   method="strict" if n else "ar", draft_length=max(n, 1), max_new_tokens=max_new_tokens, temperature=temperature,
                                   top_p=0.95 if temperature else None, seed=i)
                    rounds += out.stats.verifier_forwards
            print(f"T={temperature} N={n} ({'AR' if not n else 'strict'}): {rounds} rounds, "
                  f"{sum(where.values()) / rounds:.1f} ops per round outside the forwards")
            for site, count in where.most_common(top):
                print(f"  {count / rounds:6.2f} {site}")
    finally:
        fast_llama.FastLlama.forward = forward


def against(settings, other_src, n_prompts, max_new_tokens, repeats, drafter="drafter-weak"):
    import relaxspec

    here = os.path.dirname(os.path.dirname(os.path.abspath(relaxspec.__file__)))
    workers = {}
    for name, src in (("this", here), ("other", os.path.abspath(other_src))):
        env = dict(os.environ, PYTHONPATH=src + os.pathsep + HARNESS)  # (the worker's clock: harness.timing)
        workers[name] = subprocess.Popen([sys.executable, "-c", WORKER, str(n_prompts), drafter], env=env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    for w in workers.values():
        assert w.stdout.readline().strip() == "ready"
    print(f"this tree: {here}; other: {other_src}; drafter {drafter}; {n_prompts} prompts, batch 1, 1 thread, "
          f"medians of {repeats} repeats (the trees take turns prompt by prompt)")
    print(f"{'':9} {'ms per round':>33} {'outside the forwards':>35} {'ms per draft step':>35} "
          f"{'tokens/s':>35}")
    print(f"{'temp':>5} {'N':>3}" + f" {'this':>10} {'other':>10} {'this/other':>11}" * 4 + f" {'same ids':>9}")
    try:
        for temperature, n in settings:
            per_round = {"this": [], "other": []}
            outside = {"this": [], "other": []}
            step = {"this": [], "other": []}
            speed = {"this": [], "other": []}
            same = True
            for _ in range(repeats):
                times = {"this": [], "other": []}
                for i in range(n_prompts):
                    ids = {}
                    order = ("this", "other") if i % 2 == 0 else ("other", "this")
                    for name in order:
                        workers[name].stdin.write(json.dumps([temperature, n, i, max_new_tokens]) + "\n")
                        workers[name].stdin.flush()
                        seconds, bookkeeping, rounds, ids[name], drafting, forwards = json.loads(
                            workers[name].stdout.readline())
                        times[name].append((seconds, bookkeeping, rounds, drafting, forwards, len(ids[name])))
                    same &= ids["this"] == ids["other"]
                for name, runs in times.items():
                    rounds = sum(r[2] for r in runs)
                    per_round[name].append(sum(r[0] for r in runs) / rounds)
                    outside[name].append(sum(r[1] for r in runs) / rounds)
                    step[name].append(sum(r[3] for r in runs) / max(1, sum(r[4] for r in runs)))
                    speed[name].append(sum(r[5] for r in runs) / sum(r[0] for r in runs))
            line = f"{temperature:5.1f} {n:3d}"
            for values, scale in ((per_round, 1e3), (outside, 1e3), (step, 1e3), (speed, 1)):
                a, b = statistics.median(values["this"]), statistics.median(values["other"])
                line += f" {scale * a:10.3f} {scale * b:10.3f} {a / b if b else float('nan'):11.3f}"
            print(f"{line} {str(same):>9}", flush=True)
    finally:
        for w in workers.values():
            w.stdin.close()
            w.wait()


def main():
    ap = parser(__doc__)
    ap.add_argument("--settings", nargs="*", default=["0.7:3", "0.0:3", "0.7:0", "0.0:0"],
                    help="TEMPERATURE:N pairs (N = 0: AR)")
    add(ap, prompts=4, max_new_tokens=128, top=(25, "source lines shown per setting (op counts)"))
    ap.add_argument("--against", metavar="SRC", help="time this tree against another source tree instead")
    add(ap, repeats=3, batch=(1, "op counts: prompts per generate call"),
        drafter=("drafter-weak", "--against: the drafter (a name load_drafter takes)"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    settings = parse_settings(args.settings)
    if args.against:
        against(settings, args.against, args.prompts, args.max_new_tokens, args.repeats, args.drafter)
        return
    count_ops(settings, args.prompts, args.max_new_tokens, args.top, args.batch)


if __name__ == "__main__":
    main()

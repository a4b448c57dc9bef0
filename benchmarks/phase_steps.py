"""Does relaxing only the worked steps keep utility closer to strict than relaxing everything, at the same
acceptance length? (issue 28; the built-in pair.)

    PYTHONPATH=src python benchmarks/phase_steps.py [--prompts 80] [--repeats 2] [--drafter drafter-weak]
        [--method ensemble --param weight --values 0.99,0.97,0.95,0.93,0.9] [--tasks arithmetic sorting]

Per task, on the same prompts and per-sample seeds as the bench (derive_seed(0, prompt, repeat), so every cell is
coupled to strict): strict, then the rule at each value relaxing everywhere ("all") and relaxing only the task's
span, the worked steps before "The answer is" ("steps", phase "task" = "..The answer is"). Each row: mean
acceptance length tau (with bonus), utility [95% Wilson], utility minus strict's [95% Tango, paired].

Matched rows: each "steps" point against "all" at the same tau, by linear interpolation between the two "all"
points whose tau bracket it (per sample: u_all = (1-l) u_lo + l u_hi with l from the taus, so the difference stays
paired); interval: mean +- 1.96 sd / sqrt(n) of the per-sample differences (tau's own noise not included).
Sampling T=0.7, top-p 0.95, N=5, 160 new tokens (the bench's defaults).
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from harness.options import add
from relaxspec.bench.stats import paired_diff_interval, utility_interval
from relaxspec.engine import derive_seed, generate
from relaxspec.models import load_model
from relaxspec.drafters import load_drafter
from relaxspec.tasks import get_task, relax_span
from relaxspec.engine.phase import Phase


def run(verifier, drafter, task, method, params, phase, args):
    jobs = [(i, r) for r in range(args.repeats) for i in range(len(task.examples))]
    out = generate(verifier, drafter, [task.examples[i].prompt for i, _ in jobs], method=method,
                   draft_length=args.draft_length, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                   top_p=args.top_p, seed=[derive_seed(0, i, r) for i, r in jobs], phase=phase, **params)
    utilities = {job: task.score(res.text, task.examples[job[0]].reference) for job, res in zip(jobs, out.results)}
    return out.stats.mean_acceptance_length, utilities


def fmt(iv, spec="{:+.3f}") -> str:
    return f"{spec.format(iv.mean)} [{spec.format(iv.low)}, {spec.format(iv.high)}]"


def matched(steps: dict, alls: list[tuple[float, dict]]) -> tuple[float, float, float] | None:
    """(mean, low, high) of u_steps - u_all interpolated at steps' tau, or None outside the 'all' taus."""
    tau = steps["tau"]
    ordered = sorted(alls, key=lambda t: t[0])
    for (t0, u0), (t1, u1) in zip(ordered, ordered[1:]):
        if t0 <= tau <= t1 and t1 > t0:
            lam = (tau - t0) / (t1 - t0)
            d = [steps["u"][k] - ((1 - lam) * u0[k] + lam * u1[k]) for k in steps["u"]]
            m = sum(d) / len(d)
            sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))
            half = 1.96 * sd / math.sqrt(len(d))
            return m, m - half, m + half
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    add(ap, prompts=80, repeats=2, drafter="drafter-weak")
    ap.add_argument("--tasks", nargs="*", default=["arithmetic", "sorting"])
    add(ap, method="ensemble", param="weight", values="0.99,0.97,0.95,0.93,0.9", draft_length=5, max_new_tokens=160,
        temperature=0.7, top_p=0.95)
    args = ap.parse_args()
    torch.set_num_threads(1)
    verifier = load_model("verifier")
    drafter = load_drafter(args.drafter, verifier)
    values = [float(v) for v in args.values.split(",")]
    t0 = time.perf_counter()
    print(f"verifier + {args.drafter}, {args.method} {args.param} in {values}, N={args.draft_length}, "
          f"T={args.temperature}, top-p {args.top_p}, {args.prompts} prompts x {args.repeats} repeats per cell")
    for name in args.tasks:
        task = get_task(name, limit=args.prompts)
        phase = str(Phase(*relax_span(name)))
        tau_s, strict = run(verifier, drafter, task, "strict", {}, None, args)
        print(f"\n== {name} (steps = phase {phase!r}) ==")
        print(f"{'mode':6s} {args.param:>7s} {'tau':>6s}  {'utility [95%]':24s} {'vs strict [95%, paired]':26s}")
        print(f"{'strict':6s} {'-':>7s} {tau_s:6.3f}  {fmt(utility_interval(list(strict.values())), '{:.3f}'):24s} -")
        points = {"all": [], "steps": []}
        for v in values:
            for mode, ph in (("all", None), ("steps", phase)):
                tau, u = run(verifier, drafter, task, args.method, {args.param: v}, ph, args)
                points[mode].append({"value": v, "tau": tau, "u": u})
                print(f"{mode:6s} {v:7g} {tau:6.3f}  {fmt(utility_interval(list(u.values())), '{:.3f}'):24s} "
                      f"{fmt(paired_diff_interval(u, strict))}")
        print(f"matched acceptance length: utility of 'steps' minus 'all' interpolated at the same tau [95%]")
        alls = [(p["tau"], p["u"]) for p in points["all"]] + [(tau_s, strict)]
        for p in points["steps"]:
            m = matched(p, alls)
            text = "outside the 'all' taus" if m is None else f"{m[0]:+.3f} [{m[1]:+.3f}, {m[2]:+.3f}]"
            print(f"  steps {args.param}={p['value']:g} (tau {p['tau']:.3f}): {text}")
    print(f"\n{time.perf_counter() - t0:.0f} s (machine shared with other work; timings not the point here)")


if __name__ == "__main__":
    main()

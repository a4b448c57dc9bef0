"""Coverage of the 95% intervals (bench/stats.py) on clustered data with a known truth: prompts with their own
difficulty, several samples (repeats) per prompt, paired differences mostly exactly zero.

    PYTHONPATH=$PWD/src python benchmarks/interval_coverage.py [--sims 2000]

prints, per setting (scenario, prompts G, repeats m), the share of simulated runs whose interval covers the
truth: the clustered intervals the bench uses ("clustered") and the same intervals treating every sample as
independent (what the report used before, "independent"). tests/bench/test_bench_stats.py asserts the clustered
column >= 0.93 in every setting.

Scenarios (prompt g, repeat r):
* diff-rare: 5% of prompts are fragile (discordance probability pi_g ~ U(0.2, 1)), the rest differ with
  probability 0.002; a discordant pair is a loss with probability s_g ~ U(0.5, 1), else a win.
  truth = E[pi] (1 - 2 E[s]).
* diff-spread: 20% fragile, pi_g ~ U(0.05, 0.5), others 0.01; s_g ~ U(0.3, 1).
* utility: the mean of 0/1 utilities, p_g = 1 (60% of prompts), 0 (20%), U(0, 1) (20%): truth 0.7.
"""

from __future__ import annotations

import argparse

import numpy as np

from relaxspec.bench.stats import diff_interval, utility_interval

PROMPTS = (30, 80)
REPEATS = (1, 2, 4, 8)
SIMS = 2000
SCENARIOS = {
    # name: (fragile share, (pi low, pi high), pi of the others, (s low, s high))
    "diff-rare": (0.05, (0.2, 1.0), 0.002, (0.5, 1.0)),
    "diff-spread": (0.2, (0.05, 0.5), 0.01, (0.3, 1.0)),
}


def diff_truth(name: str) -> float:
    rho, (a, b), pi0, (s0, s1) = SCENARIOS[name]
    return (rho * (a + b) / 2 + (1 - rho) * pi0) * (1 - (s0 + s1))


def draw_diffs(name: str, prompts: int, repeats: int, rng: np.random.Generator) -> np.ndarray:
    """One run's differences, shape (prompts, repeats), values in {-1, 0, 1}."""
    rho, (a, b), pi0, (s0, s1) = SCENARIOS[name]
    fragile = rng.random(prompts) < rho
    pi = np.where(fragile, rng.uniform(a, b, prompts), pi0)
    s = rng.uniform(s0, s1, prompts)
    u, v = rng.random((prompts, repeats)), rng.random((prompts, repeats))
    return np.where(u < pi[:, None], np.where(v < s[:, None], -1.0, 1.0), 0.0)


def draw_utilities(prompts: int, repeats: int, rng: np.random.Generator) -> np.ndarray:
    kind = rng.random(prompts)
    p = np.where(kind < 0.6, 1.0, np.where(kind < 0.8, 0.0, rng.random(prompts)))
    return (rng.random((prompts, repeats)) < p[:, None]).astype(np.float64)


def coverage(scenario: str, prompts: int, repeats: int, sims: int = SIMS, seed: int = 0) -> tuple:
    """(clustered, independent) share of `sims` runs whose 95% interval covers the truth, then their mean
    half-widths."""
    rng = np.random.default_rng([seed, prompts, repeats, len(scenario)])
    clusters = np.repeat(np.arange(prompts), repeats)
    hit, width = np.zeros(2), np.zeros(2)
    for _ in range(sims):
        if scenario == "utility":
            truth, x = 0.7, draw_utilities(prompts, repeats, rng).ravel()
            found = [utility_interval(x, clusters=clusters), utility_interval(x)]
        else:
            truth, x = diff_truth(scenario), draw_diffs(scenario, prompts, repeats, rng).ravel()
            found = [diff_interval(x, clusters), diff_interval(x)]
        hit += [i.low <= truth <= i.high for i in found]
        width += [i.half_width for i in found]
    return hit[0] / sims, hit[1] / sims, width[0] / sims, width[1] / sims


def table(sims: int = SIMS) -> list[tuple[str, int, int, float, float]]:
    return [(s, g, m, *coverage(s, g, m, sims)) for s in (*SCENARIOS, "utility") for g in PROMPTS for m in REPEATS]


def format_table(rows, sims: int) -> str:
    se = (0.95 * 0.05 / sims) ** 0.5
    out = [f"coverage of 95% intervals, {sims} runs per setting (Monte Carlo s.e. {se:.4f} at 0.95)",
           f"{'scenario':<12} {'prompts':>7} {'repeats':>7} {'clustered':>9} {'independent':>11} "
           f"{'half-width clustered':>20} {'independent':>11}"]
    out += [f"{s:<12} {g:>7} {m:>7} {c:>9.3f} {i:>11.3f} {wc:>20.4f} {wi:>11.4f}" for s, g, m, c, i, wc, wi in rows]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=SIMS)
    sims = parser.parse_args().sims
    print(format_table(table(sims), sims))


if __name__ == "__main__":
    main()

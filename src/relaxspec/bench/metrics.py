"""A cell's metrics from its samples and engine stats, and the comparisons between cells.

Intervals treat a prompt's samples as one cluster (bench.stats: Rao-Scott effective sample size).
Comparisons (computed by the report and by the runner's adaptive allocation, never stored):
* every relaxed cell vs strict at the same N (coupled: paired by (prompt, repeat)), at the decision
  confidence 1 - ALPHA / looks (Bonferroni over the maximum number of looks: the interval at whichever
  look sampling stopped covers with probability >= 1 - ALPHA);
* every speculative cell vs AR (paired), at 1 - ALPHA; strict vs AR is the run's sanity check.
"""

from __future__ import annotations

import math
import statistics

from relaxspec.bench.methods import classifier_cost
from relaxspec.bench.names import AR, AUTO
from relaxspec.bench.speedup import C_REL_GRID, block_aware_speedup, modelled_speedup
from relaxspec.bench.stats import Interval, paired_diff_interval, utility_interval

ALPHA = 0.05


def decision_confidence(looks: int) -> float:
    return 1.0 - ALPHA / looks


def merge_engine_stats(parts: list[dict]):
    """The engine's GenerationStats of several generate() calls (stored with as_dict) as one."""
    from relaxspec.engine import GenerationStats
    return GenerationStats.merge([GenerationStats.from_dict(p) for p in parts])


def c_block_at(widths: list, width: float) -> float:
    """c_block at a (mean) block width, linear between the measured [[width, c_block], ...] (clamped to them)."""
    points = sorted(widths)
    for (w0, c0), (w1, c1) in zip(points, points[1:]):
        if width <= w1:
            return c0 if width <= w0 else c0 + (c1 - c0) * (width - w0) / (w1 - w0)
    return points[-1][1]


def cell_metrics(method: str, draft_length, extra_passes: int, rows: list, stats, speed: dict,
                 dynamic: bool = False) -> dict:
    """Metrics of a cell from all its rows and its merged engine stats (tau read from the engine).
    `speed`: c_rel_measured, c_block_measured, c_pivot_measured, latencies, batch-1 timing (see runner); the
    classifier's c_pivot counts only for a rule that reads a pivot classifier (`needs_classifier`; 0 for the others).
    A cell whose drafts per round vary (N "auto", or `dynamic`: a confidence stop) is modelled at its measured
    mean drafts per round (`model_draft_length`): the drafter's cost, and c_block interpolated at that mean + 1
    between the block widths measured for it (speed's c_block_widths); a fixed N is modelled at N."""
    ci = utility_interval([r.utility for r in rows], clusters=[r.prompt_index for r in rows])
    lengths = [r.tokens for r in rows]
    tau = stats.mean_acceptance_length
    n = draft_length
    c_rel, c_block = speed.get("c_rel_measured"), speed.get("c_block_measured")
    c_pivot = classifier_cost(method, speed.get("c_pivot_measured"))
    if method != AR and (n == AUTO or dynamic):
        n = stats.drafts_proposed / stats.sequence_rounds if stats.sequence_rounds else 0.0
        if c_block and speed.get("c_block_widths"):
            c_block = c_block_at(speed["c_block_widths"], n + 1)
    metrics = {
        "n_prompts": len({r.prompt_index for r in rows}), "n_samples": len(rows),
        "utility": ci.mean, "utility_ci_low": ci.low, "utility_ci_high": ci.high,
        "mean_response_length": statistics.fmean(lengths) if lengths else math.nan,
        "truncated_fraction": sum(r.stats.get("truncated", False) for r in rows) / len(rows) if rows else 0.0,
        "acceptance_rate": stats.acceptance_rate if method != AR else math.nan,
        "acceptance_rate_per_position": list(stats.acceptance_rate_per_position) if method != AR else [],
        "mean_acceptance_length": tau,
        "extra_draft_passes": extra_passes,
        "model_draft_length": n, "model_c_block": c_block,
        "tokens_per_s": stats.generated_tokens / stats.time_total_s if stats.time_total_s else math.nan,
        **speed, **({"c_pivot_measured": c_pivot} if method != AR else {}),
        "modelled_speedup_measured_c_rel": 1.0 if method == AR else
        (modelled_speedup(tau, n, c_rel, extra_passes) if c_rel is not None else math.nan),
        "block_aware_speedup_measured": 1.0 if method == AR else
        (block_aware_speedup(tau, n, c_rel, c_block, extra_passes, c_pivot) if c_rel is not None and c_block
         else math.nan),
        **{f"modelled_speedup_c{c:g}": modelled_speedup(tau, n, c, extra_passes) for c in C_REL_GRID},
    }
    return metrics


def compare(method_utils: dict, base_utils: dict, confidence: float) -> Interval:
    return paired_diff_interval(method_utils, base_utils, confidence)


def identical_fraction(method_hashes: dict, base_hashes: dict) -> float:
    """Fraction of paired samples whose output token ids are the same (compared by hash)."""
    keys = set(method_hashes) & set(base_hashes)
    usable = [k for k in keys if method_hashes[k] and base_hashes[k]]
    if not usable:
        return math.nan
    return sum(method_hashes[k] == base_hashes[k] for k in usable) / len(usable)

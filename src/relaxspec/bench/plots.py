"""PNG plots of a result store (matplotlib, Agg backend): capability vs speed-up, acceptance by position.

Like the report, a plot never mixes settings groups: one figure per group (the file name says which group
when the rows hold several)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from relaxspec.bench.names import AR, STRICT, draft_length_order
from relaxspec.bench.speedup import C_REL_GRID

_PANELS = [*[(f"c_rel = {c:g}", f"length_adjusted_speedup_c{c:g}") for c in C_REL_GRID],
           ("measured c_rel", "length_adjusted_speedup_measured_c_rel")]


def _plt():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _slug(*parts) -> str:
    return "_".join("".join(ch if ch.isalnum() or ch in "-." else "-" for ch in str(p)) for p in parts)


def _param_value(r: dict):
    params = json.loads(r["params"])
    return tuple(params.values())


def _colors(names):
    plt = _plt()
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {n: cmap(i % cmap.N) for i, n in enumerate(names)}


def capability_plots(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """One figure per (verifier, drafter, task, N): four panels (c_rel 0.05, 0.2, 0.5, measured), utility
    with its 95% CI against the length-adjusted modelled speed-up (log x), one line per rule through
    its parameter values; AR and strict marked."""
    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    groups = {}
    for r in rows:
        if r["method"] != AR:
            groups.setdefault((r["settings_group"], r["verifier"], r["drafter"], r["task"], r["draft_length"],
                               r["seed"]), []).append(r)
    several_seeds = len({k[5] for k in groups}) > 1
    for (group, verifier, drafter, task, n, seed), cells in sorted(groups.items(), key=lambda item: (
            *item[0][:4], draft_length_order(item[0][4]), item[0][5])):
        ar = next((r for r in rows if r["method"] == AR and r["verifier"] == verifier and r["task"] == task
                   and r["seed"] == seed and r["settings_group"] == group), None)
        rules = sorted({r["method"] for r in cells if r["method"] != STRICT})
        colors = _colors(rules)
        fig, axes = plt.subplots(2, 2, figsize=(12.5, 9.0), sharey=True)
        axes = axes.ravel()
        for ax, (title, col) in zip(axes, _PANELS):
            if ar is not None:
                ax.axhline(ar["utility"], color="0.5", ls="--", lw=1, zorder=0)
                ax.axhspan(ar["utility_ci_low"], ar["utility_ci_high"], color="0.85", zorder=0) \
                    if _ok(ar["utility_ci_low"]) else None
                ax.errorbar([1.0], [ar["utility"]], yerr=_yerr([ar]), fmt="*", ms=14, color="black", capsize=3,
                            label="AR (1x)", zorder=5)
            for rule in rules:
                pts = sorted((r for r in cells if r["method"] == rule and _ok(r[col])), key=_param_value)
                if not pts:
                    continue
                xs, ys = [r[col] for r in pts], [r["utility"] for r in pts]
                ax.errorbar(xs, ys, yerr=_yerr(pts), fmt="o-", ms=4, lw=1.3, capsize=2, color=colors[rule],
                            label=rule, alpha=0.9)
            strict = [r for r in cells if r["method"] == STRICT and _ok(r[col])]
            for r in strict:
                ax.errorbar([r[col]], [r["utility"]], yerr=_yerr([r]), fmt="D", ms=9, color="black", mfc="white",
                            mew=2, capsize=3, label="strict (lossless)", zorder=6)
            c_meas = cells[0]["c_rel_measured"]
            ax.set_title(title if "measured" not in title or not _ok(c_meas) else f"measured c_rel = {c_meas:.3f}")
            _speedup_axis(ax)
            ax.set_xlabel("length-adjusted modelled speed-up vs AR (log scale)")
            ax.set_ylabel(f"utility on {task} (mean, 95% CI)")
        title = (f"Capability vs speed-up: {task}, verifier {verifier}, drafter {drafter}, N = {n}"
                 f" (settings group {group}, {min(r['n_samples'] for r in cells)}+ samples/cell)")
        name = (f"capability_{_slug(task, verifier, drafter)}_N{n}{f'_seed{seed}' if several_seeds else ''}"
                f"{_group_suffix(rows, group)}.png")
        paths.append(_finish(plt, fig, axes, title, out_dir / name, right=0.85, top=0.96, fontsize=12))
    return paths


def _group_suffix(rows: list[dict], group: int) -> str:
    return f"_settings{group}" if len({r["settings_group"] for r in rows}) > 1 else ""


def _finish(plt, fig, axes, title: str, path: Path, right: float, top: float, fontsize: int) -> Path:
    """One legend for all panels (each label once) at the right, a title, then save and close."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="center right", fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout(rect=(0, 0, right, top))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_NICE_TICKS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.4, 1.5, 1.6, 1.8, 2.0, 2.25,
               2.5, 2.75, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 15.0, 20.0)


def _speedup_axis(ax) -> None:
    """Log x axis labelled with plain multiples (0.8x, 1x, 1.5x ...), several per panel whatever the range."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    inside = [t for t in _NICE_TICKS if lo <= t <= hi]
    min_ratio = (hi / lo) ** (1 / 7)  # at most ~7 labels, evenly spread on the log axis
    ticks = [1.0] if 1.0 in inside else inside[:1]
    for t in inside:  # grow outwards from 1x (or the first tick), keeping labels apart
        if t > ticks[-1] and t / ticks[-1] >= min_ratio:
            ticks.append(t)
    for t in reversed(inside):
        if t < ticks[0] and ticks[0] / t >= min_ratio:
            ticks.insert(0, t)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.grid(True, which="major", alpha=0.35)


def _yerr(rs):
    if not all(_ok(r["utility_ci_low"]) for r in rs):
        return None
    return [[r["utility"] - r["utility_ci_low"] for r in rs], [r["utility_ci_high"] - r["utility"] for r in rs]]


def acceptance_plots(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """Acceptance rate per draft position, one panel per N, one colour per rule (darker = stronger
    parameter value; strict in black)."""
    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    groups = {}
    for r in rows:
        if r["method"] != AR:
            groups.setdefault((r["settings_group"], r["verifier"], r["drafter"], r["task"], r["seed"]), []).append(r)
    several_seeds = len({k[4] for k in groups}) > 1
    for (group, verifier, drafter, task, seed), cells in sorted(groups.items()):
        ns = sorted({r["draft_length"] for r in cells}, key=draft_length_order)
        rules = sorted({r["method"] for r in cells if r["method"] != STRICT})
        colors = _colors(rules)
        fig, axes = plt.subplots(1, len(ns), figsize=(max(9.0, 6.0 * len(ns)), 4.8), squeeze=False, sharey=True)
        for ax, n in zip(axes[0], ns):
            for rule in [STRICT, *rules]:
                pts = sorted((r for r in cells if r["method"] == rule and r["draft_length"] == n), key=_param_value)
                for j, r in enumerate(pts):
                    rates = json.loads(r["acceptance_rate_per_position"])
                    if not rates:
                        continue
                    shade = 0.35 + 0.65 * (j + 1) / len(pts)
                    ax.plot(range(1, len(rates) + 1), rates, "o-", ms=3, lw=2.2 if rule == STRICT else 1.2,
                            color="black" if rule == STRICT else colors[rule], alpha=shade,
                            label=rule if j == len(pts) - 1 else None)
            ax.set_title(f"N = {n}")
            ax.set_xlabel("draft position")
            ax.set_xticks(range(1, max((len(json.loads(r["acceptance_rate_per_position"])) for r in cells
                                        if r["draft_length"] == n), default=1) + 1))
            ax.set_ylim(0, 1.02)
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("P(draft position accepted) per verifier call")
        title = (f"Acceptance by draft position: {task}, verifier {verifier}, drafter {drafter}\n"
                 f"(one colour per rule, one line per parameter value; darker = later in its grid)")
        name = (f"acceptance_{_slug(task, verifier, drafter)}{f'_seed{seed}' if several_seeds else ''}"
                f"{_group_suffix(rows, group)}.png")
        paths.append(_finish(plt, fig, axes[0], title, out_dir / name, right=0.86, top=0.93, fontsize=11))
    return paths


def all_plots(rows: list[dict], out_dir: str | Path) -> list[Path]:
    return capability_plots(rows, out_dir) + acceptance_plots(rows, out_dir)

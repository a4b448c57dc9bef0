"""What `relaxspec tune` prints and writes: the frontier, the choice, the confirmation, the TOML, the plot."""

from __future__ import annotations

import math
from pathlib import Path

from relaxspec.bench import settings, stats
from relaxspec.tune.racing import ALPHA

TOML_NAME = "tune.toml"
PLOT_NAME = "tune.png"


def frontier(result) -> list:
    """Records of the last rung reached that no other one beats on both speed and upper drop bound."""
    records = [result.race.records[c] for c in result.race.finalists]
    records += [r for r in result.race.records.values() if r.rung == result.race.rungs_run - 1 and r not in records]

    def worse(a, b):  # b dominates a
        return (b.speed.mean >= a.speed.mean and -b.diff.low <= -a.diff.low
                and (b.speed.mean > a.speed.mean or -b.diff.low < -a.diff.low))
    front = [r for r in records if not any(worse(r, o) for o in records if o is not r)]
    return sorted(front, key=lambda r: -r.speed.mean)


def format_report(result) -> str:
    cfg, race = result.config, result.race
    lines = [f"tune: {cfg.task}, objective {cfg.objective}, max drop {cfg.max_drop:g} vs strict at the same N "
             f"(upper 95% bound); {len(result.space)} configurations, rungs of {list(cfg.sizes)} samples, "
             f"{race.rungs_run} run ({race.stopped}); drop decisions at {race.bonferroni:.5f} (Bonferroni)"]
    counts = {}
    for r in race.records.values():
        counts[r.dropped or "alive"] = counts.get(r.dropped or "alive", 0) + 1
    lines.append("  " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    (ss, st), (cs, ct) = result.search_used, result.confirm_used
    lines.append(f"search: {ss} samples, {st} generated tokens ({result.search_samples} samples generated now, the "
                 f"rest found stored); confirmation: {cs} samples, {ct} tokens ({result.confirm_samples} now); "
                 f"{result.wall_s:.0f} s")
    lines.append("")
    lines.append(f"frontier (last rung reached; speed = {cfg.objective} speed-up, 95% CI; drop = strict - config):")
    head = ("configuration", "samples", "speed-up", "utility diff vs strict", "within budget")
    rows = [(r.config.label, str(r.samples), stats.format_interval(r.speed), stats.format_interval(r.diff), "yes" if r.feasible else "no")
            for r in frontier(result)]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for row in [head, *rows]:
        lines.append("  " + "  ".join(x.ljust(w) for x, w in zip(row, widths)))
    lines.append("")
    if race.choice is None:
        lines.append("choice: none (nothing evaluated)")
        return "\n".join(lines)
    rec = race.records[race.choice]
    lines.append(f"choice: {race.choice.label}: speed-up {stats.format_interval(rec.speed)}, utility diff vs strict {stats.format_interval(rec.diff)} "
                 f"on {rec.samples} search samples")
    conf = result.confirmation
    if conf is not None:
        arm = conf.choice
        lines.append(f"confirmation on {conf.samples} held-out samples ({cfg.heldout_prompts} prompts disjoint "
                     f"from the {cfg.search_prompts} search prompts x {cfg.heldout_repeats} repeats):")
        lines.append(f"  speed constants at N={race.choice.draft_length}: c_rel {arm.c_rel:.3f}, c_block {arm.c_block:.3f} "
                     f"({'given' if cfg.c_rel else 'measured'} / {'given' if cfg.c_block else 'measured'} now)"
                     + (f", c_pivot {arm.c_pivot:.3f} (the pivot classifier, measured now)" if arm.c_pivot else ""))
        lines.append(f"  {race.choice.label}: speed-up {stats.format_interval(arm.speed(1 - ALPHA))}, utility diff vs strict "
                     f"{stats.format_interval(arm.diff(1 - ALPHA))}, outputs identical to strict "
                     f"{'-' if math.isnan(arm.identical()) else format(arm.identical(), '.0%')}")
        if conf.strict_best is not None:
            lines.append(f"  {conf.strict_best.config.label} (best strict in the search): speed-up "
                         f"{stats.format_interval(conf.strict_best.speed(1 - ALPHA))}")
        lines.append(f"  drop {'held' if conf.drop_held else 'did NOT hold'} (upper 95% bound "
                     f"{'within' if conf.drop_held else 'beyond'} {cfg.max_drop:g}); speed-up "
                     f"{'held' if conf.speed_held else 'did NOT hold (significantly below the search estimate)'}"
                     + ("" if conf.beats_strict is None else
                        f"; {'faster' if conf.beats_strict else 'NOT faster'} than the best strict"))
    return "\n".join(lines)


def toml_text(result) -> str:
    """Settings that `relaxspec generate --config` and `relaxspec bench --config` both read."""
    cfg, choice = result.config, result.race.choice
    bench = cfg.bench_config(cfg.search_prompts)
    rec = result.race.records[choice]
    out = [f"# relaxspec tune: {cfg.task}, max drop {cfg.max_drop:g}, objective {cfg.objective}",
           f"# search speed-up {stats.format_interval(rec.speed)}, utility diff vs strict {stats.format_interval(rec.diff)}"]
    if result.confirmation is not None:
        c = result.confirmation
        out.append(f"# held-out: speed-up {stats.format_interval(c.choice.speed(1 - ALPHA))}, diff {stats.format_interval(c.choice.diff(1 - ALPHA))}; "
                   f"drop {'held' if c.drop_held else 'did not hold'}")
    values = {"verifier": bench.verifiers[0], "drafter": bench.drafters[0], "task": cfg.task,
              "method": choice.method_spec,
              "draft_length": choice.draft_length, "temperature": cfg.temperature, "top_k": cfg.top_k,
              "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed,
              "phase": settings.phase_for(cfg.phase, cfg.task), "draft_confidence": cfg.draft_confidence}
    for k, v in values.items():
        if v is not None:
            out.append(f"{k} = {_toml_value(v)}")
    return "\n".join(out) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def write_outputs(result, plots: bool = True, stem: str | None = None) -> None:
    """The choice's TOML and the search plot in the run's out directory (`stem`: their name without suffix, default
    tune.toml / tune.png)."""
    out = Path(result.config.out)
    out.mkdir(parents=True, exist_ok=True)
    toml_name, plot_name = (TOML_NAME, PLOT_NAME) if stem is None else (f"{stem}.toml", f"{stem}.png")
    if result.race.choice is not None:
        path = out / toml_name
        path.write_text(toml_text(result), encoding="utf-8")
        result.toml_path = str(path)
    if plots:
        result.plot_path = str(plot_search(result, out / plot_name))


def plot_search(result, path: Path) -> Path:
    """Every configuration at its last rung: speed-up vs drop with 95% CIs, the budget line, the choice and
    its held-out confirmation (search_figure), saved to `path`."""
    import matplotlib.pyplot as plt

    fig = search_figure(result)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def search_figure(result):
    """plot_search's figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, race = result.config, result.race
    fig, ax = plt.subplots(figsize=(8, 5.5))
    groups = {}
    for r in race.records.values():
        if r.speed is None or math.isnan(r.speed.mean):
            continue
        groups.setdefault("strict" if r.config.is_strict else (r.dropped or "finalist"), []).append(r)
    styles = {"strict": ("tab:blue", "s"), "finalist": ("tab:green", "o"), "clearly lossy": ("tab:red", "x"),
              "clearly slower": ("tab:gray", "v"), "halving": ("tab:orange", ".")}
    for name, recs in groups.items():
        color, marker = styles.get(name, ("k", "."))
        ax.plot([-r.diff.mean for r in recs], [r.speed.mean for r in recs], marker, color=color, markersize=4,
                alpha=0.35 if name == "halving" else 0.8, linestyle="none", label=f"{name} ({len(recs)})")
        later = [r for r in recs if r.rung > 0]  # first-rung intervals are too wide to read: shown from rung 2 on
        if later:
            ax.errorbar([-r.diff.mean for r in later], [r.speed.mean for r in later],
                        xerr=[[_below(-r.diff.mean, -r.diff.high) for r in later],
                              [_below(-r.diff.low, -r.diff.mean) for r in later]],
                        yerr=[[_below(r.speed.mean, r.speed.low) for r in later],
                              [_below(r.speed.high, r.speed.mean) for r in later]],
                        fmt="none", ecolor=color, elinewidth=0.7, alpha=0.7)
    ax.axvline(cfg.max_drop, color="tab:red", linestyle="--", linewidth=1, label=f"budget (drop {cfg.max_drop:g})")
    if race.choice is not None:
        rec = race.records[race.choice]
        ax.plot([-rec.diff.mean], [rec.speed.mean], marker="*", markersize=16, color="gold", markeredgecolor="k",
                linestyle="none", label=f"choice: {race.choice.label}")
        if result.confirmation is not None:
            arm = result.confirmation.choice
            d, s = arm.diff(1 - ALPHA), arm.speed(1 - ALPHA)
            ax.errorbar([-d.mean], [s.mean], xerr=[[_below(-d.mean, -d.high)], [_below(-d.low, -d.mean)]],
                        yerr=[[_below(s.mean, s.low)], [_below(s.high, s.mean)]], fmt="D", color="purple",
                        markersize=7, label="choice on held-out prompts")
    ax.set_xlabel("utility drop vs strict at the same N (95% CI)")
    ax.set_ylabel(f"{cfg.objective} speed-up vs AR (95% CI)")
    ax.set_title(f"relaxspec tune: {cfg.task}\neach configuration at its last rung (95% CIs from rung 2 on)",
                 fontsize=10)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _below(high: float, low: float) -> float:
    """An error bar's length (0 where a bound is missing or infinite)."""
    d = high - low
    return d if math.isfinite(d) and d > 0 else 0.0

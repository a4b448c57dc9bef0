import csv
import json
import math

import pytest
import torch

from relaxspec.bench.config import BenchConfig
from relaxspec.bench.plots import all_plots
from relaxspec.bench.report import CSV_COLUMNS, best_rules, build_rows, format_report, write_csv
from relaxspec.bench.runner import run_grid
from relaxspec.bench.stats import paired_diff_interval
from relaxspec.bench.store import Row, Store

REQUIRED = ("verifier, drafter, task, method, params, draft_length, seed, n_prompts, utility, utility_ci_low, "
            "utility_ci_high, utility_diff_vs_ar, utility_diff_ci_low, utility_diff_ci_high, utility_diff_vs_strict, "
            "utility_diff_vs_strict_ci_low, utility_diff_vs_strict_ci_high, outputs_identical_to_strict, "
            "acceptance_rate, mean_acceptance_length, mean_response_length, c_rel_measured, c_block_measured, "
            "measured_speedup_batch1, measured_speedup_batched, modelled_speedup_measured_c_rel, "
            "modelled_speedup_c0.05, modelled_speedup_c0.2, modelled_speedup_c0.5, block_aware_speedup_measured, "
            "length_adjusted_speedup_c0.05, length_adjusted_speedup_c0.2, length_adjusted_speedup_c0.5").split(", ")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("bench")
    config = BenchConfig(verifiers=["verifier"], drafters=["drafter-strong"], tasks=["arithmetic"],
                         methods=["ar", "strict", "mentored:alpha=0/0.95", "spec-cont-dec:beta=0.5"],
                         draft_lengths=[2, 3], limit=3, repeats=2, looks=1, speed_prompts=2, max_new_tokens=12,
                         workers=1, out=str(out))
    run_grid(config, progress=False, log=lambda *a: None)
    with Store(out) as store:
        rows = build_rows(store)
    return out, rows


def test_rows_and_csv(stored, tmp_path):
    out, rows = stored
    assert len(rows) == 1 + 2 * 4
    ar = rows[0]
    assert ar["method"] == "ar" and ar["draft_length"] == 0 and ar["utility_diff_vs_ar"] == 0.0
    assert ar["measured_speedup_batched"] == 1.0 and ar["modelled_speedup_c0.2"] == 1.0
    for r in rows[1:]:
        assert r["measured_speedup_batched"] > 0 and r["c_rel_measured"] > 0 and r["c_block_measured"] > 0
        assert r["measured_speedup_batch1"] > 0 and r["batch1_prompts"] == 2
        n, tau, extra = r["draft_length"], r["mean_acceptance_length"], r["extra_draft_passes"]
        assert extra == (1 if r["method"] == "spec-cont-dec" else 0)  # declared by the rule
        assert 1.0 <= tau <= n + 1
        assert r["modelled_speedup_c0.2"] == pytest.approx(tau / (1 + 0.2 * (n + extra)))
        assert r["block_aware_speedup_measured"] == pytest.approx(
            tau / ((n + extra) * r["c_rel_measured"] + r["c_block_measured"]))
        assert r["length_adjusted_speedup_c0.2"] == pytest.approx(
            r["modelled_speedup_c0.2"] * ar["mean_response_length"] / r["mean_response_length"])
        assert r["utility_diff_ci_low"] <= r["utility_diff_vs_ar"] <= r["utility_diff_ci_high"]
        assert 0.0 <= r["utility_ci_low"] <= r["utility"] <= r["utility_ci_high"] <= 1.0
        if r["method"] == "mentored" and json.loads(r["params"]) == {"alpha": 0.0}:  # strict, coupled
            assert r["outputs_identical_to_strict"] == 1.0 and r["utility_diff_vs_strict"] == 0.0
    path = write_csv(rows, tmp_path / "r.csv")
    with path.open() as f:
        reader = csv.DictReader(f)
        data = list(reader)
    assert set(REQUIRED) <= set(reader.fieldnames) and reader.fieldnames == CSV_COLUMNS
    assert len(data) == len(rows) and data[0]["method"] == "ar" and data[0]["draft_length"] == "0"
    relaxed = [d for d in data if d["method"] == "mentored"]
    assert {json.loads(d["params"])["alpha"] for d in relaxed} == {0.0, 0.95}
    assert all(d["utility_diff_vs_strict_ci_low"] and d["outputs_identical_to_strict"] for d in relaxed)


def test_csv_to_a_directory_or_an_unwritable_path_is_one_error(stored, tmp_path):
    _, rows = stored
    with pytest.raises(ValueError, match="is a directory"):
        write_csv(rows, tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="cannot write the CSV"):
        write_csv(rows, tmp_path / "file" / "r.csv")


def test_report_text(stored):
    _, rows = stored
    text = format_report(rows, max_drop=0.03)
    assert "mentored(alpha=0.95)" in text and "== settings group 1: 3 prompts, first look 2 repeats" in text
    assert "Sanity check" in text and "strict - AR" in text and "Decisions vs strict (budget 0.03)" in text
    assert "Best rule" in text and "block-aware, measured" in text and "x b1" in text


def test_plots_are_written(stored, tmp_path):
    _, rows = stored
    paths = all_plots(rows, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["acceptance_arithmetic_verifier_drafter-strong.png",
                     "capability_arithmetic_verifier_drafter-strong_N2.png",
                     "capability_arithmetic_verifier_drafter-strong_N3.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


# ------------------------------------------------------------------ hand-made stores

SETTINGS = dict(limit=400, temperature=0.7, top_k=None, top_p=0.95, max_new_tokens=64, batch_size=200, device=None,
                dtype=None, chat_template="auto", system=None, code_version="test")


def put(store, key, method, utilities, params=None, n=3, speed=1.0, drafter="d", length=10.0, **settings):
    config = dict(SETTINGS, verifier="v", verifier_version="1", drafter=None if method == "ar" else drafter,
                  drafter_version=None if method == "ar" else "1", task="t", method=method, params=params or {},
                  draft_length=0 if method == "ar" else n, seed=0, **settings)
    metrics = {"n_prompts": len(utilities), "n_samples": len(utilities), "utility": sum(utilities) / len(utilities),
               "utility_ci_low": 0.0, "utility_ci_high": 1.0, "mean_response_length": length, "tokens_per_s": 100 * speed,
               "mean_acceptance_length": 1.0 + speed, "modelled_speedup_measured_c_rel": speed,
               "block_aware_speedup_measured": speed, "looks": 3, "first_repeats": 1,
               **{f"modelled_speedup_c{c:g}": speed for c in (0.05, 0.2, 0.5)}}
    store.put(key, config, metrics, [Row(i, 0, "p", "1", "r", u, 10, {}, token_hash=str(u))
                                     for i, u in enumerate(utilities)])


STRICT = [0.0] * 30 + [1.0] * 370
FAST = [1.0] * 5 + [0.0] * 40 + [1.0] * 355  # 5 wins, 15 losses vs strict: -0.025, lower bound below -0.03
SAFE = [0.0] * 32 + [1.0] * 368  # 2 losses: -0.005, lower bound above -0.03


def test_best_rule_uses_the_upper_bound_of_the_drop_not_the_point_estimate(tmp_path):
    fast, safe = paired_diff_interval(dict(enumerate(FAST)), dict(enumerate(STRICT)), 1 - 0.05 / 3), \
        paired_diff_interval(dict(enumerate(SAFE)), dict(enumerate(STRICT)), 1 - 0.05 / 3)
    assert fast.mean >= -0.03 > fast.low and safe.low >= -0.03  # the premise: estimate and bound disagree on fast
    with Store(tmp_path) as store:
        put(store, "ar", "ar", STRICT)
        put(store, "strict", "strict", STRICT, speed=1.5)
        put(store, "fast", "cactus", FAST, {"delta": 10.0}, speed=3.0)
        put(store, "safe", "cactus", SAFE, {"delta": 0.1}, speed=2.0)
        put(store, "open", "cactus", FAST[:40], {"delta": 1.0}, speed=2.5)  # 40 samples: wide, straddling
        rows = build_rows(store)
    best = best_rules(rows, max_drop=0.03)
    assert {b["best"]["key"] for b in best} == {"safe"}
    assert all(sorted(r["key"] for r in b["undecidable"]) == ["fast", "open"] for b in best)
    text = format_report(rows, max_drop=0.03)
    assert "cactus(delta=0.1) N=3  2.00x" in text and "2 cells undecidable at this budget" in text
    fast_line = next(line for line in text.splitlines() if "cactus(delta=10)" in line)
    assert "narrow ±0.02" in fast_line  # decided for power (half-width <= budget), yet not eligible
    assert "undecided: t / d cactus(delta=1) N=3" in text and "paired samples of new prompts would bring it to 0.03" in text
    assert "Decisions vs strict (budget 0.03): 2 of 3 relaxed cells decided" in text
    # a generous budget admits the fast one
    assert {b["best"]["key"] for b in best_rules(rows, max_drop=0.1)} == {"fast"}


def test_two_settings_are_two_groups(tmp_path):
    with Store(tmp_path) as store:
        put(store, "ar1", "ar", STRICT)
        put(store, "s1", "strict", STRICT)
        put(store, "c1", "cactus", SAFE, {"delta": 0.1})
        put(store, "ar2", "ar", STRICT, temperature=0.6)
        put(store, "s2", "strict", SAFE, temperature=0.6)
        put(store, "c2", "cactus", SAFE, {"delta": 0.1}, temperature=0.6)
        latest, everything = build_rows(store), build_rows(store, "all")
    assert {r["key"] for r in latest} == {"ar2", "s2", "c2"}
    assert [r["settings_group"] for r in everything] == [1, 1, 1, 2, 2, 2]
    # comparisons stay inside a group: c2 is identical to s2 (its strict), not to s1
    c2 = next(r for r in everything if r["key"] == "c2")
    assert c2["utility_diff_vs_strict"] == 0.0 and c2["outputs_identical_to_strict"] == 1.0
    text = format_report(everything, max_drop=0.03, groups_total=2)
    assert text.count("== settings group") == 2 and "temperature 0.7" in text and "temperature 0.6" in text
    short = format_report(latest, max_drop=0.03, groups_total=2)
    assert short.count("== settings group") == 1 and "--all shows every one" in short
    assert len({p.name for p in all_plots(everything, tmp_path / "plots")}) == 4  # per group, never mixed


def test_missing_ar_or_strict_is_said(tmp_path):
    with Store(tmp_path / "a") as store:
        put(store, "s", "strict", STRICT)
        put(store, "c", "cactus", SAFE, {"delta": 0.1})
        text = format_report(build_rows(store), max_drop=0.03)
    assert "no AR cell in this group" in text and "none within" not in text
    with Store(tmp_path / "b") as store:
        put(store, "ar", "ar", STRICT)
        put(store, "c", "cactus", SAFE, {"delta": 0.1})
        put(store, "c4", "cactus", SAFE, {"delta": 0.1}, n=4)
        text = format_report(build_rows(store), max_drop=0.03)
    assert "no strict cell in this group" in text and "no strict cell at N = 3, 4" in text
    assert "no strict cell: cannot choose" in text


@pytest.mark.parametrize("case", ["no-tokens", "one-example", "zero-variance"])
def test_degenerate_results_have_defined_values_everywhere(tmp_path, case):
    """An AR cell that emitted no tokens (it crashed the report with ZeroDivisionError), a task with one
    example, cells whose utilities are all equal: every ratio and interval is a number or NaN ("-" in the
    table, empty in the CSV), in the rows, the table, the CSV, the plots and the findings."""
    from relaxspec.study.findings import check_findings, format_findings

    utilities = {"no-tokens": [1.0, 0.0], "one-example": [1.0], "zero-variance": [1.0] * 6}[case]
    silent = case == "no-tokens"
    with Store(tmp_path) as store:
        put(store, "ar", "ar", utilities, speed=0.0 if silent else 1.0, length=0.0 if silent else 10.0)
        put(store, "strict", "strict", utilities, speed=0.0 if silent else 1.5, length=0.0 if silent else 10.0)
        put(store, "c1", "cactus", utilities, {"delta": 0.1}, speed=0.0 if silent else 2.0)
        put(store, "c2", "cactus", utilities, {"delta": 1.0}, speed=2.0)
        rows = build_rows(store)
        findings = check_findings(store, rows, 0.03, None)
    for r in rows:
        for column in CSV_COLUMNS:
            value = r.get(column)
            assert not isinstance(value, float) or math.isnan(value) or math.isfinite(value), (column, value)
    if silent:
        assert math.isnan(rows[1]["measured_speedup_batched"]) and math.isnan(rows[1]["length_adjusted_speedup_c0.2"])
    else:
        assert rows[1]["measured_speedup_batched"] == pytest.approx(1.5)
        assert rows[2]["utility_diff_vs_strict"] == 0.0
        ci = (rows[2]["utility_diff_vs_strict_ci_low"], rows[2]["utility_diff_vs_strict_ci_high"])
        assert all(math.isfinite(x) for x in ci) and ci[0] <= 0.0 <= ci[1]
    text = format_report(rows, max_drop=0.03)
    assert "nan" not in text and " -" in text
    with write_csv(rows, tmp_path / "r.csv").open() as f:
        data = list(csv.DictReader(f))
    assert len(data) == 4 and not any("inf" in v or "nan" in v.lower() for d in data for v in d.values() if v)
    assert all_plots(rows, tmp_path / "plots")
    assert "nan" not in format_findings(findings, rows, 0.03, None)


def test_findings_with_an_mtp_drafter_that_has_no_strict_cell(tmp_path):
    """Finding (3) averaged the MTP drafter's strict c_rel over no cell (StatisticsError): now '-'."""
    from relaxspec.study.findings import check_findings, format_findings

    with Store(tmp_path) as store:
        put(store, "ar", "ar", SAFE)
        for d, speed in (("weak", 1.2), ("strong", 1.8)):
            put(store, f"s-{d}", "strict", SAFE, drafter=d, speed=speed)
            put(store, f"c-{d}", "cactus", SAFE, {"delta": 0.1}, drafter=d, speed=speed + 0.1)
        put(store, "c-mtp", "cactus", SAFE, {"delta": 0.1}, drafter="drafter-mtp", speed=2.0)
        rows = build_rows(store)
        findings = check_findings(store, rows, 0.03, None)
    text = format_findings(findings, rows, 0.03, None)
    assert "drafter-mtp -" in text and "nan" not in text


def test_report_command_on_a_store_whose_ar_cell_emitted_no_tokens(tmp_path, capsys):
    """`relaxspec report` (and --findings) on the store of issue 26's tiny bench: it ended in ZeroDivisionError."""
    from relaxspec.cli import main

    with Store(tmp_path) as store:
        put(store, "ar", "ar", [0.0, 0.0], speed=0.0, length=0.0)
        put(store, "strict", "strict", [0.0, 0.0], speed=0.0, length=0.0)
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "strict" in out and "nan" not in out
    assert main(["report", str(tmp_path), "--findings"]) == 0
    assert "nan" not in capsys.readouterr().out


@pytest.mark.parametrize("statement, says", [
    ("UPDATE cells SET config = json_remove(config, '$.method') WHERE key = 'fast'",
     "damaged: cell fast (? N=3 t): its config lacks method"),  # a KeyError: 'method' before
    ("UPDATE cells SET metrics = '{}' WHERE key = 'fast'",
     "damaged: cell fast (fuzzy N=3 t): its metrics are empty"),  # the cell silently left the report before
    ("UPDATE rows SET utility = 'high' WHERE cell_key = 'fast' AND prompt_index = 4",
     "damaged: cell fast (fuzzy N=3 t): the utility of sample (4, 0) is 'high', not a number"),
])
def test_a_damaged_cell_is_named_by_report(tmp_path, capsys, statement, says):
    import sqlite3

    from relaxspec.cli import main
    with Store(tmp_path) as store:
        put(store, "ar", "ar", STRICT)
        put(store, "strict", "strict", STRICT)
        put(store, "fast", "fuzzy", FAST, {"threshold": 0.3})
    with sqlite3.connect(tmp_path / "results.sqlite") as db:
        db.execute(statement)
    code = main(["report", str(tmp_path), "--no-plots"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"relaxspec: error: results store {tmp_path / 'results.sqlite'} {says}\n", err


def test_report_header_gives_the_actual_prompt_count(tmp_path):
    with Store(tmp_path) as store:
        put(store, "ar", "ar", [1.0], limit=5)
        put(store, "strict", "strict", [1.0], limit=5)
        rows = build_rows(store)
    header = format_report(rows, max_drop=0.03).splitlines()[0]
    assert ": 1 prompts," in header and "5 prompts" not in header


import csv
import json

import pytest
import torch

from relaxspec.bench.grid import BenchConfig, run_grid
from relaxspec.bench.plots import all_plots
from relaxspec.bench.report import CSV_COLUMNS, best_rules, build_rows, format_table, write_csv
from relaxspec.bench.store import Store

REQUIRED = ("verifier, drafter, task, method, params, draft_length, seed, n_prompts, utility, utility_ci_low, "
            "utility_ci_high, utility_diff_vs_ar, utility_diff_ci_low, utility_diff_ci_high, acceptance_rate, "
            "mean_acceptance_length, mean_response_length, c_rel_measured, measured_speedup, "
            "modelled_speedup_measured_c_rel, modelled_speedup_c0.05, modelled_speedup_c0.2, modelled_speedup_c0.5, "
            "length_adjusted_speedup_c0.05, length_adjusted_speedup_c0.2, length_adjusted_speedup_c0.5").split(", ")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("bench")
    config = BenchConfig(verifiers=["verifier"], drafters=["drafter-strong"], tasks=["arithmetic"],
                         methods=["ar", "strict", "mentored:alpha=0.3/0.95", "typical"], draft_lengths=[2, 3],
                         limit=3, repeats=2, max_new_tokens=12, out=str(out))
    run_grid(config, progress=False, log=lambda *a: None)
    with Store(out) as store:
        rows = build_rows(store)
    return out, rows


def test_rows_and_csv(stored, tmp_path):
    out, rows = stored
    assert len(rows) == 1 + 2 * 4
    ar = rows[0]
    assert ar["method"] == "ar" and ar["draft_length"] == 0 and ar["utility_diff_vs_ar"] == 0.0
    assert ar["measured_speedup"] == 1.0 and ar["modelled_speedup_c0.2"] == 1.0
    for r in rows[1:]:
        assert r["measured_speedup"] > 0 and r["c_rel_measured"] > 0
        n, tau = r["draft_length"], r["mean_acceptance_length"]
        assert 1.0 <= tau <= n + 1
        assert r["modelled_speedup_c0.2"] == pytest.approx(tau / (1 + 0.2 * n))
        assert r["length_adjusted_speedup_c0.2"] == pytest.approx(
            r["modelled_speedup_c0.2"] * ar["mean_response_length"] / r["mean_response_length"])
        assert r["utility_diff_ci_low"] <= r["utility_diff_vs_ar"] <= r["utility_diff_ci_high"]
    with Store(out) as store:  # the comparison stored with each cell agrees with the report's
        for r in rows[1:]:
            vs_ar = store.get(r["key"]).metrics["vs_ar"]
            assert vs_ar["utility_diff_vs_ar"] == pytest.approx(r["utility_diff_vs_ar"])
            assert vs_ar["length_adjusted_speedup_c0.5"] == pytest.approx(r["length_adjusted_speedup_c0.5"])
    path = write_csv(rows, tmp_path / "r.csv")
    with path.open() as f:
        reader = csv.DictReader(f)
        data = list(reader)
    assert set(REQUIRED) <= set(reader.fieldnames) and reader.fieldnames == CSV_COLUMNS
    assert len(data) == len(rows)
    assert data[0]["method"] == "ar" and data[0]["draft_length"] == "0"
    mentored = [d for d in data if d["method"] == "mentored"]
    assert {json.loads(d["params"])["alpha"] for d in mentored} == {0.3, 0.95}


def test_table_and_best_rule(stored):
    _, rows = stored
    text = format_table(rows, max_drop=0.05)
    assert "mentored(alpha=0.95)" in text and "Best rule per c_rel" in text
    assert text.count("\n") > len(rows)
    best = best_rules(rows, max_drop=1.0)  # any drop allowed: the fastest cell wins
    fastest = max((r for r in rows if r["method"] != "ar"), key=lambda r: r["length_adjusted_speedup_c0.05"])
    assert next(b for b in best if b["c_rel"] == "0.05")["best"] is fastest
    strictest = best_rules(rows, max_drop=-2.0)  # impossible: nothing qualifies
    assert all(b["best"] is None for b in strictest)


def test_plots_are_written(stored, tmp_path):
    _, rows = stored
    paths = all_plots(rows, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["acceptance_arithmetic_verifier_drafter-strong.png",
                     "capability_arithmetic_verifier_drafter-strong_N2.png",
                     "capability_arithmetic_verifier_drafter-strong_N3.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000

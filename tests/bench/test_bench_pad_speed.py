"""The pivot classifier's cost in the block-aware speed model: S_blk = tau / ((N + extra) c_rel + c_block + c_pivot),
c_pivot measured by the speed constants for the cells whose rule reads a classifier, 0 for the others."""

import csv
import math

import pytest
import torch

from relaxspec.bench.config import BenchConfig
from relaxspec.bench.metrics import cell_metrics
from relaxspec.bench.report import CSV_COLUMNS, build_rows, format_report, write_csv
from relaxspec.bench.runner import run_grid
from relaxspec.bench.speedup import block_aware_speedup, round_cost
from relaxspec.bench.store import Row, Store
from relaxspec.engine import GenerationStats

torch.set_num_threads(1)


def test_block_aware_model_with_the_classifier_cost():
    assert block_aware_speedup(3.0, 3, 0.2, 1.4, c_pivot=0.4) == pytest.approx(3.0 / (3 * 0.2 + 1.4 + 0.4))
    assert block_aware_speedup(3.0, 3, 0.2, 1.4, extra=1, c_pivot=0.4) == pytest.approx(3.0 / (4 * 0.2 + 1.8))
    assert block_aware_speedup(3.0, 3, 0.2, 1.4) == block_aware_speedup(3.0, 3, 0.2, 1.4, c_pivot=0.0) \
        == pytest.approx(3.0 / 2.0)
    assert round_cost(3, 0.2, 1.4, 1, 0.4) == pytest.approx(2.6)
    with pytest.raises(ValueError, match="c_pivot must be >= 0"):
        block_aware_speedup(3.0, 3, 0.2, 1.4, c_pivot=-0.1)
    with pytest.raises(ValueError, match="c_block must be > 0"):
        round_cost(3, 0.2, 0.0)


def _stats(rounds: int, accepted: int, drafts: int) -> GenerationStats:
    return GenerationStats(draft_length=3 if drafts else 0, generated_tokens=rounds + accepted, sequence_rounds=rounds,
                           verifier_forwards=rounds, drafts_proposed=drafts, drafts_accepted=accepted,
                           time_total_s=1.0)


def test_cell_metrics_count_c_pivot_only_for_a_rule_that_reads_a_classifier():
    rows = [Row(0, 0, "p", "r", "x", 1.0, 8, {"mean_acceptance_length": 2.0})]
    stats = _stats(rounds=4, accepted=4, drafts=12)
    tau = stats.mean_acceptance_length
    speed = {"c_rel_measured": 0.25, "c_block_measured": 1.5, "c_pivot_measured": 0.3}
    pad = cell_metrics("pad", 3, 0, rows, stats, speed)
    strict = cell_metrics("strict", 3, 0, rows, stats, speed)  # the same (verifier, drafter, N) constants
    assert pad["c_pivot_measured"] == 0.3 and strict["c_pivot_measured"] == 0.0
    assert pad["block_aware_speedup_measured"] == pytest.approx(tau / (3 * 0.25 + 1.5 + 0.3))
    assert strict["block_aware_speedup_measured"] == pytest.approx(tau / (3 * 0.25 + 1.5))
    # constants measured without a classifier (an older run): c_pivot 0, the model as before
    without = cell_metrics("pad", 3, 0, rows, stats, {"c_rel_measured": 0.25, "c_block_measured": 1.5})
    assert without["c_pivot_measured"] == 0.0 and without["block_aware_speedup_measured"] == pytest.approx(tau / 2.25)
    assert "c_pivot_measured" not in cell_metrics("ar", 0, 0, rows, _stats(8, 0, 0), {})


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-pad")
    config = BenchConfig(verifiers=["verifier"], drafters=["drafter-weak"], tasks=["arithmetic"],
                         methods=["ar", "strict", "pad:threshold=0.5"], draft_lengths=[3], limit=2, repeats=1,
                         max_new_tokens=10, looks=1, speed_prompts=1, workers=1, out=str(out))
    summary = run_grid(config, progress=False, log=lambda *a: None)
    assert len(summary.ran) == 3 and not summary.unavailable
    with Store(out) as store:
        return out, build_rows(store)


def test_a_bench_run_measures_c_pivot_for_the_pad_cell_only(stored, tmp_path):
    out, rows = stored
    by_method = {r["method"]: r for r in rows}
    pad, strict, ar = by_method["pad"], by_method["strict"], by_method["ar"]
    assert pad["c_pivot_measured"] > 0 and strict["c_pivot_measured"] == 0.0 and math.isnan(ar["c_pivot_measured"])
    # one measurement per (verifier, drafter, N): both cells share c_rel and c_block
    assert pad["c_rel_measured"] == strict["c_rel_measured"] and pad["c_block_measured"] == strict["c_block_measured"]
    for r in (pad, strict):
        tau, n = r["mean_acceptance_length"], r["draft_length"]
        assert r["block_aware_speedup_measured"] == pytest.approx(
            tau / (n * r["c_rel_measured"] + r["c_block_measured"] + r["c_pivot_measured"]))
    with write_csv(rows, tmp_path / "r.csv").open() as f:
        reader = csv.DictReader(f)
        data = {d["method"]: d for d in reader}
    assert reader.fieldnames == CSV_COLUMNS
    assert CSV_COLUMNS.index("c_pivot_measured") == CSV_COLUMNS.index("c_block_measured") + 1
    assert float(data["pad"]["c_pivot_measured"]) == pytest.approx(pad["c_pivot_measured"], rel=1e-4)  # 6 digits
    assert float(data["strict"]["c_pivot_measured"]) == 0.0
    assert "c_block+c_pivot" in format_report(rows, max_drop=0.1)


def test_a_store_without_c_pivot_still_reads(stored):
    out, _ = stored
    with Store(out) as store:  # as a store written before c_pivot was measured
        for cell in list(store):
            cell.metrics.pop("c_pivot_measured", None)
            store.conn.execute("UPDATE cells SET metrics = ? WHERE key = ?", (__import__("json").dumps(cell.metrics),
                                                                              cell.key))
        store.conn.commit()
        rows = build_rows(store)
    assert all(math.isnan(r["c_pivot_measured"]) for r in rows)
    assert "nan" not in format_report(rows, max_drop=0.1)


def test_tune_prices_a_round_with_the_same_cost():
    from relaxspec.tune.objective import speed_interval

    rows = {(i, 0): Row(i, 0, "p", "r", "x", 1.0, 12, {"mean_acceptance_length": 3.0}) for i in range(4)}
    with_pivot = speed_interval("modelled", rows, None, 3, 0, 0.2, 1.4, 0.95, c_pivot=0.4)
    assert with_pivot.mean == pytest.approx(block_aware_speedup(3.0, 3, 0.2, 1.4, c_pivot=0.4))
    assert speed_interval("modelled", rows, None, 3, 1, 0.2, 1.4, 0.95).mean == pytest.approx(3.0 / (4 * 0.2 + 1.4))


def test_speed_constants_time_the_classifier_only_where_a_rule_reads_it(monkeypatch):
    from relaxspec.bench.cell import CellSpec, speed_constants
    import relaxspec.models as models_module
    from relaxspec.models import load_model
    from relaxspec.pivot import builtin_classifier_path, load_classifier, pivot_timer
    from relaxspec.models.hf import step_clock

    models = {"verifier": load_model("verifier"), "drafter-weak": load_model("drafter-weak")}
    fn = load_classifier(builtin_classifier_path()).pivot_fn()
    calls = []

    def counted(*inputs):
        calls.append(tuple(t.shape for t in inputs))
        return fn(*inputs)

    counted.hidden_layer = fn.hidden_layer
    timer = pivot_timer(counted, models["verifier"], 4)
    assert 0 < timer(step_clock(torch.device("cpu"))) < 0.1
    assert calls[-1] == ((1, 4, 128), (1, 4, 714), (1, 4, 714), (1, 4))  # an N-draft block of the verifier's
    cells = [CellSpec("verifier", "drafter-weak", "arithmetic", m, {}, n, 0) for m, n in (("strict", 2), ("pad", 3))]
    calls.clear()
    seen, real = [], models_module.measure_step_latencies

    def spy(steps, **kw):
        seen.append([step if callable(step) else (step[0].name, step[1]) for step in steps])
        return real(steps, **kw)

    monkeypatch.setattr(models_module, "measure_step_latencies", spy)
    got = speed_constants(models, cells, rounds=3, pivot_fn=counted)
    # The forwards' rounds hold no classifier call (it would slow the forward after it); the classifier is timed
    # in rounds of its own beside the verifier's one-token step, its reference.
    assert len(seen) == 2 and seen[0] == [("verifier", 1), ("verifier", 3), ("drafter-weak", 1), ("verifier", 4)]
    assert seen[1][0] == ("verifier", 1) and len(seen[1]) == 2 and callable(seen[1][1])
    assert "c_pivot_measured" not in got[("verifier", "drafter-weak", 2)]
    assert got[("verifier", "drafter-weak", 3)]["c_pivot_measured"] > 0
    assert calls and all(shapes[0] == (1, 3, 128) for shapes in calls)  # timed on the PAD cell's N only
    assert all("c_pivot_measured" not in c for c in speed_constants(models, cells, rounds=3).values())


def test_tune_vs_grid_prices_pad_with_the_stores_c_pivot():
    from relaxspec.tune.compare import StoreCell, score, stored_pivot
    from relaxspec.tune.space import make_config

    def cell(method, params, n, tau, c_pivot=None):
        rows = {(i, 0): Row(i, 0, "p", "r", "x", 1.0, 12, {"mean_acceptance_length": tau}) for i in range(4)}
        metrics = {} if c_pivot is None else {"c_pivot_measured": c_pivot}
        return StoreCell(None if method == "ar" else make_config(method, params, n), {"draft_confidence": None},
                         False, rows, metrics)

    cells = [cell("ar", {}, 0, 1.0), cell("strict", {}, 3, 3.0, 0.0), cell("pad", {"threshold": 0.5}, 3, 3.0, 0.4),
             cell("pad", {"threshold": 0.7}, 3, 3.0, 0.5)]
    assert stored_pivot(cells) == {3: pytest.approx(0.45)}  # the median over the classifier's cells at N=3
    got = {s.config.method + str(s.config.params_dict): s.speed.mean
           for s in score(cells, {3: (0.2, 1.4)}, stored_pivot(cells)).values()}
    assert got["strict{}"] == pytest.approx(block_aware_speedup(3.0, 3, 0.2, 1.4))
    assert got["pad{'threshold': 0.5}"] == pytest.approx(block_aware_speedup(3.0, 3, 0.2, 1.4, c_pivot=0.45))
    no_pivot = score(cells, {3: (0.2, 1.4)})  # a store from before c_pivot: the model as it was
    assert len(no_pivot) == 3
    assert all(s.speed.mean == pytest.approx(block_aware_speedup(3.0, 3, 0.2, 1.4)) for s in no_pivot.values())

"""Dynamic draft length in the bench: N="auto" as a grid value and --draft-confidence as a setting, through a real
small bench run (stored, reported, reloaded), and the speed model of a cell whose drafts per round vary."""

import csv

import pytest

from relaxspec.bench.cell import CellSpec, block_widths, cell_config
from relaxspec.bench.config import BenchConfig
from relaxspec.bench.metrics import c_block_at, merge_engine_stats
from relaxspec.bench.store import Store
from relaxspec.cli import main


def test_c_block_is_interpolated_between_the_measured_widths():
    widths = [[2, 1.1], [4, 1.3], [11, 2.0]]
    assert c_block_at(widths, 2) == pytest.approx(1.1)
    assert c_block_at(widths, 3) == pytest.approx(1.2)
    assert c_block_at(widths, 7.5) == pytest.approx(1.3 + 0.7 * 3.5 / 7)
    assert c_block_at(widths, 1.5) == pytest.approx(1.1) and c_block_at(widths, 12) == pytest.approx(2.0)  # clamped
    assert block_widths(3) == [4] and block_widths(3, dynamic=True) == [2, 4]
    assert block_widths("auto") == [2, 4, 6, 8, 11]


def test_old_keys_hold_and_the_confidence_stop_enters_every_key_only_when_set():
    versions = {"verifier": "v1", "drafter-weak": "d1", "code": "c"}
    spec = CellSpec("verifier", "drafter-weak", "arithmetic", "strict", {}, 3, 0)
    plain = cell_config(spec, BenchConfig(), versions)
    assert "draft_confidence" not in plain
    stopped = cell_config(spec, BenchConfig(draft_confidence=0.4), versions)
    assert stopped == {**plain, "draft_confidence": 0.4}
    with pytest.raises(ValueError, match="draft lengths"):
        BenchConfig(draft_lengths=[3, "often"]).validate()
    with pytest.raises(ValueError, match="draft_confidence"):
        BenchConfig(draft_confidence=1.5).validate()


def _bench(out, *extra):
    return main(["bench", "--methods", "ar,strict,r-fuzzy:threshold=0.3", "--draft-lengths", "2,auto", "--limit", "2",
                 "--repeats", "1", "--looks", "1", "--max-new-tokens", "12", "--speed-prompts", "1", "--workers", "1",
                 "--out", str(out), "--no-progress", *extra])


def test_an_auto_cell_is_stored_reported_and_reloaded(tmp_path, capsys):
    out = tmp_path / "res"
    assert _bench(out) == 0
    text = capsys.readouterr().out
    assert "ran 5 cells" in text
    with Store(out) as store:
        cells = {(c.config["method"], c.config["draft_length"]): c for c in store.cells()}
    assert set(cells) == {("ar", 0), ("strict", 2), ("r-fuzzy", 2), ("strict", "auto"), ("r-fuzzy", "auto")}
    for method in ("strict", "r-fuzzy"):
        auto, fixed = cells[(method, "auto")].metrics, cells[(method, 2)].metrics
        # an auto cell's model: its mean drafts per round, c_block interpolated between the widths measured for it
        stats = merge_engine_stats(auto["engine_stats"])
        assert auto["model_draft_length"] == pytest.approx(stats.drafts_proposed / stats.sequence_rounds)
        assert 1 <= auto["model_draft_length"] <= 10
        widths = auto["c_block_widths"]
        assert [w for w, _ in widths] == [2, 4, 6, 8, 11]
        assert auto["model_c_block"] == pytest.approx(c_block_at(widths, auto["model_draft_length"] + 1))
        tau, c_rel = auto["mean_acceptance_length"], auto["c_rel_measured"]
        assert auto["block_aware_speedup_measured"] == pytest.approx(
            tau / (auto["model_draft_length"] * c_rel + auto["model_c_block"]))
        # a fixed N is modelled as before: at N, c_block at N + 1
        assert fixed["model_draft_length"] == 2 and "c_block_widths" not in fixed
        assert fixed["model_c_block"] == fixed["c_block_measured"]
    assert " auto " in text and "N=auto" in text  # the table's N column and the sanity check's line
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["draft_length"]) for r in rows] == [
        ("ar", "0"), ("strict", "2"), ("r-fuzzy", "2"), ("strict", "auto"), ("r-fuzzy", "auto")]
    assert any(p.name.endswith("_Nauto.png") for p in (out / "plots").iterdir())

    assert _bench(out) == 0  # reloaded: every cell's key is found again
    assert "ran 0 cells, skipped 5" in capsys.readouterr().out
    assert main(["report", str(out), "--no-plots"]) == 0
    assert "auto" in capsys.readouterr().out

    # the confidence stop: new cells (AR's too, the report groups by it), their drafts per round below N
    assert _bench(out, "--draft-confidence", "0.9", "--no-plots") == 0
    assert "ran 5 cells" in capsys.readouterr().out
    with Store(out) as store:
        stopped = {(c.config["method"], c.config["draft_length"]): c.metrics for c in store.cells()
                   if c.config.get("draft_confidence") == 0.9}
    assert len(stopped) == 5
    assert stopped[("strict", 2)]["model_draft_length"] < 2
    assert [w for w, _ in stopped[("strict", 2)]["c_block_widths"]] == [2, 3]
    assert stopped[("strict", "auto")]["model_draft_length"] < cells[("strict", "auto")].metrics["model_draft_length"]
    assert main(["report", str(out), "--no-plots", "--all"]) == 0
    assert capsys.readouterr().out.count("Sanity check") == 2  # two settings groups


def test_bad_dynamic_settings_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's usage and its one error line
        main(["bench", "--draft-lengths", "3,often", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.splitlines()[-1].endswith("expected an integer or 'auto', got 'often'")
    code = main(["bench", "--draft-confidence", "2", "--out", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "draft_confidence" in err and "Traceback" not in err, err


def test_tune_searches_auto_with_the_confidence_stop_and_writes_both(tmp_path, capsys):
    import json

    import relaxspec
    from relaxspec.bench.settings import load_toml
    from relaxspec.tune.space import DEFAULT_DRAFT_LENGTHS, search_space

    assert "auto" in DEFAULT_DRAFT_LENGTHS
    assert [c.label for c in search_space(["cactus:delta=10"], [2, "auto"])] == [
        "strict N=2", "strict N=auto", "cactus(delta=10) N=2", "cactus(delta=10) N=auto"]
    with pytest.raises(ValueError, match="draft lengths"):
        search_space(None, [2, "often"])
    result = relaxspec.tune(task="arithmetic", max_drop=0.02, out=str(tmp_path / "tune"), methods=["cactus:delta=10"],
                            draft_lengths=[2, "auto"], draft_confidence=0.5, sizes=(2, 4), caps=(4,), search_prompts=4,
                            heldout_prompts=2, heldout_repeats=1, max_new_tokens=24, budget_minutes=30.0, plots=False)
    with Store(tmp_path / "tune") as store:
        cells = [c for c in store.cells() if c.config["method"] != "ar"]
    assert {c.config["draft_length"] for c in cells} == {2, "auto"}
    assert all(c.config["draft_confidence"] == 0.5 for c in cells)
    # a configuration is priced at its cell's mean drafts per round (all of them vary under the stop)
    for c in cells:
        assert c.metrics["model_draft_length"] < (2 if c.config["draft_length"] == 2 else 10)
    toml = load_toml(result.toml_path)
    assert toml["draft_confidence"] == 0.5 and toml["draft_length"] == result.choice.draft_length
    bench = BenchConfig.from_dict(toml)  # the bench reads it too
    bench.out = str(tmp_path / "bench")
    bench.validate()
    assert bench.draft_confidence == 0.5 and bench.draft_lengths == [result.choice.draft_length]
    assert main(["generate", "--config", result.toml_path, "--prompt", "Tom has 3 apples and buys 4 more.",
                 "--json", "--max-new-tokens", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["draft_length"] in (2, 10)

import sqlite3

import pytest
import torch

from relaxspec.bench.grid import BenchConfig, run_grid
from relaxspec.bench.store import Row, Store

torch.set_num_threads(1)


def small_config(out, **kw):
    base = dict(verifiers=["verifier"], drafters=["drafter-weak"], tasks=["arithmetic"],
                methods=["ar", "strict", "cactus:delta=1/10", "typical"], draft_lengths=[2], limit=3, repeats=2,
                max_new_tokens=10, out=str(out))
    base.update(kw)
    return BenchConfig(**base)


def row(i, utility=1.0):
    return Row(prompt_index=i, repeat=0, prompt=f"p{i}", reference="1", response="r", utility=utility, tokens=3,
               stats={})


def test_put_is_atomic_and_has(tmp_path):
    with Store(tmp_path) as store:
        store.put("k1", {"method": "ar"}, {"utility": 1.0}, [row(0), row(1)])
        assert store.has("k1") and not store.has("k2")
        with pytest.raises(TypeError):  # the second row is broken: nothing of the cell may remain
            store.put("k2", {"method": "strict"}, {"utility": 0.5}, [row(0), row(1, utility=None)])
        assert not store.has("k2")
        assert len(store) == 1 and [c.key for c in store] == ["k1"]
        assert store.utilities("k1") == {(0, 0): 1.0, (1, 0): 1.0}
    conn = sqlite3.connect(tmp_path / "results.sqlite")
    assert conn.execute("SELECT COUNT(*) FROM rows WHERE cell_key = 'k2'").fetchone()[0] == 0


def test_interrupted_grid_resumes_with_only_the_rest(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "test-resume")  # concurrent source edits must not change keys
    config = small_config(tmp_path)
    done = []

    def stop_after_two(index, spec, key, metrics):
        done.append(key)
        if len(done) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grid(config, on_cell=stop_after_two, progress=False, log=lambda *a: None)
    with Store(tmp_path) as store:
        assert {c.key for c in store} == set(done)

    second = run_grid(small_config(tmp_path), progress=False, log=lambda *a: None)
    assert sorted(second.skipped) == sorted(done)
    assert len(second.ran) == 3 and not set(second.ran) & set(done)
    with Store(tmp_path) as store:
        cells = list(store)
        assert len(cells) == 5
        methods = sorted(c.config["method"] for c in cells)
        assert methods == ["ar", "cactus", "cactus", "strict", "typical"]
        for c in cells:
            assert len(store.rows(c.key)) == 6  # 3 prompts x 2 repeats
            assert c.metrics["n_samples"] == 6 and 0.0 <= c.metrics["utility"] <= 1.0
            if c.config["method"] != "ar":
                assert c.metrics["c_rel_measured"] > 0
                assert len(c.metrics["acceptance_rate_per_position"]) == 2

    third = run_grid(small_config(tmp_path), progress=False, log=lambda *a: None)
    assert third.ran == [] and len(third.skipped) == 5
    # a changed setting is a different cell
    fourth = run_grid(small_config(tmp_path, methods=["ar"], max_new_tokens=8), progress=False, log=lambda *a: None)
    assert len(fourth.ran) == 1


def test_code_version_enters_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "v1")
    first = run_grid(small_config(tmp_path, methods=["ar"], limit=1, repeats=1), progress=False, log=lambda *a: None)
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "v2")
    second = run_grid(small_config(tmp_path, methods=["ar"], limit=1, repeats=1), progress=False, log=lambda *a: None)
    assert len(first.ran) == len(second.ran) == 1 and first.ran != second.ran


def test_pad_cells_are_skipped_with_a_warning_without_a_classifier(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "test-pad")
    config = small_config(tmp_path, methods=["ar", "pad"], limit=1, repeats=1,
                          pad_classifier=str(tmp_path / "missing.pt"))
    with pytest.warns(UserWarning, match="skipping 3 pad cells"):
        summary = run_grid(config, progress=False, log=lambda *a: None)
    assert len(summary.ran) == 1 and len(summary.unavailable) == 3
    assert all("pad(threshold=" in label for label in summary.unavailable)


def test_pad_cells_run_with_the_shipped_classifier(tmp_path, monkeypatch):
    pivot = pytest.importorskip("relaxspec.pivot")
    try:
        path = pivot.builtin_classifier_path()
    except FileNotFoundError:
        pytest.skip("no built-in PAD classifier shipped")
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "test-pad-run")
    config = small_config(tmp_path, methods=["ar", "pad:threshold=0.5"], limit=2, repeats=1)
    summary = run_grid(config, progress=False, log=lambda *a: None)
    assert len(summary.ran) == 2 and not summary.unavailable
    with Store(tmp_path) as store:
        pad = next(c for c in store if c.config["method"] == "pad")
        assert pad.config["params"] == {"threshold": 0.5} and pad.config["pad_classifier"]
        assert pad.metrics["n_samples"] == 2 and path.exists()

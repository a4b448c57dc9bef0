import csv
import os
import subprocess
import sys

import pytest


def run(*args, cwd):
    # pinned code version: other people editing the sources between the two runs must not change the keys
    env = dict(os.environ, OMP_NUM_THREADS="1", RELAXSPEC_CODE_VERSION="test-cli")
    return subprocess.run([sys.executable, "-m", "relaxspec", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_bench_then_report_end_to_end(tmp_path):
    out = tmp_path / "res"
    (tmp_path / "bench.toml").write_text('methods = ["ar", "strict", "r-fuzzy:threshold=0.3"]\n'
                                         'draft_lengths = [3]\nmax_new_tokens = 10\nrepeats = 1\nlooks = 2\n'
                                         'speed_prompts = 1\n')
    args = ["bench", "--config", str(tmp_path / "bench.toml"), "--limit", "2", "--out", str(out), "--no-progress"]
    first = run(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "ran 3 cells" in first.stdout and "r-fuzzy(threshold=0.3)" in first.stdout
    assert "2 of 2 looks run" in first.stdout  # 2 samples decide nothing: look 2 extends strict and r-fuzzy
    assert "Best rule" in first.stdout and "Sanity check" in first.stdout and "plots:" in first.stdout
    assert (out / "results.sqlite").is_file() and (out / "plots").is_dir()
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["ar", "strict", "r-fuzzy"]
    assert [r["n_prompts"] for r in rows] == ["2", "4", "4"]  # look 2 adds new prompts, not repeats
    assert [r["n_samples"] for r in rows] == ["2", "4", "4"]
    assert " 4x1 " in first.stdout  # prompts x repeats per cell

    again = run(*args, cwd=tmp_path)
    assert again.returncode == 0 and "ran 0 cells, skipped 3" in again.stdout

    report = run("report", str(out), "--csv", str(tmp_path / "x.csv"), "--max-drop", "0.1", "--no-plots", "--all",
                 cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "x.csv").is_file() and "budget 0.1" in report.stdout
    to_dir = run("report", str(out), "--csv", str(tmp_path), "--no-plots", cwd=tmp_path)
    assert to_dir.returncode == 2 and to_dir.stderr.strip().startswith("relaxspec: error: --csv")
    assert "is a directory" in to_dir.stderr and "Traceback" not in to_dir.stderr

    bad = run("bench", "--methods", "nope", "--out", str(out), cwd=tmp_path)
    assert bad.returncode == 2 and "unknown method 'nope'" in bad.stderr
    missing = run("report", str(tmp_path / "empty"), cwd=tmp_path)
    assert missing.returncode == 2 and "no results.sqlite" in missing.stderr
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.sqlite").write_bytes(b"garbage" * 500)
    broken = run("report", str(tmp_path / "broken"), cwd=tmp_path)
    assert broken.returncode == 2 and "is corrupted" in broken.stderr and "Traceback" not in broken.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_failing_cell_is_reported_and_the_rest_completes_locally(tmp_path, capsys, workers):
    # spec-cont-dec needs the drafter's distribution q, which prompt lookup (ngram) does not give: that cell
    # raises in the engine, in-process or in a pool worker (an out-of-range parameter is refused before any work)
    from relaxspec.bench.store import Store
    from relaxspec.cli import main

    out = tmp_path / "res"
    code = main(["bench", "--drafter", "ngram", "--methods", "strict,mentored:alpha=0.5,spec-cont-dec:beta=0.5",
                 "--draft-lengths", "2", "--limit", "1",
                 "--repeats", "1", "--looks", "1", "--max-new-tokens", "6", "--speed-prompts", "0",
                 "--workers", workers, "--out", str(out), "--no-progress", "--no-plots"])
    assert code == 1
    err = capsys.readouterr().err
    assert "1 cells failed (not stored; each fails again until what it says is fixed):\n  arithmetic spec-cont-dec(beta=0.5) N=2 seed=0: " \
           "ValueError: " in err and "needs the drafter's distribution" in err and "Traceback" not in err
    with Store(out) as store:
        assert sorted(c.config["method"] + str(c.config["params"]) for c in store.cells()) == \
            ["mentored{'alpha': 0.5}", "strict{}"]

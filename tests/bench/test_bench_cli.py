import csv

import pytest


def run(forker, *args, cwd):
    """`python -m relaxspec ARGS` in a process of its own (forked, with one torch thread: conftest.forker)."""
    # pinned code version: other people editing the sources between the two runs must not change the keys
    return forker.run(["-m", "relaxspec", *args], cwd=cwd, env={"RELAXSPEC_CODE_VERSION": "test-cli"}, timeout=300)


def run_here(capsys, *args):
    """`relaxspec ARGS` through main() in this process (as `python -m relaxspec` runs it): (exit code, stdout,
    stderr). For what needs no fresh process: a re-run and the refusals (an interpreter with torch is ~3 s)."""
    from relaxspec.cli import main
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_bench_then_report_end_to_end(tmp_path, capsys, monkeypatch, forker):
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "test-cli")  # (as run() pins it)
    out = tmp_path / "res"
    (tmp_path / "bench.toml").write_text('methods = ["ar", "strict", "r-fuzzy:threshold=0.3"]\n'
                                         'draft_lengths = [3]\nmax_new_tokens = 10\nrepeats = 1\nlooks = 2\n'
                                         'speed_prompts = 1\n')
    args = ["bench", "--config", str(tmp_path / "bench.toml"), "--limit", "2", "--out", str(out), "--no-progress"]
    first = run(forker, *args, cwd=tmp_path)
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

    report = run(forker, "report", str(out), "--csv", str(tmp_path / "x.csv"), "--max-drop", "0.1", "--no-plots", "--all",
                 cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "x.csv").is_file() and "budget 0.1" in report.stdout

    monkeypatch.chdir(tmp_path)
    code, stdout, _ = run_here(capsys, *args)
    assert code == 0 and "ran 0 cells, skipped 3" in stdout
    code, _, err = run_here(capsys, "report", out, "--csv", tmp_path, "--no-plots")
    assert code == 2 and err.strip().startswith("relaxspec: error: --csv")
    assert "is a directory" in err and "Traceback" not in err

    code, _, err = run_here(capsys, "bench", "--methods", "nope", "--out", out)
    assert code == 2 and "unknown method 'nope'" in err
    code, _, err = run_here(capsys, "report", tmp_path / "empty")
    assert code == 2 and "no results.sqlite" in err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.sqlite").write_bytes(b"garbage" * 500)
    code, _, err = run_here(capsys, "report", tmp_path / "broken")
    assert code == 2 and "is corrupted" in err and "Traceback" not in err


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

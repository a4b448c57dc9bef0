"""relaxspec tune on the built-in pair, tiny: the TOML round-trips through `generate --config` and is read by
the bench; a resumed tune re-runs nothing stored; held-out prompts are disjoint from the search prompts."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relaxspec.bench.stats import ratio_interval, t_value
from relaxspec.tune.objective import speed_interval
from relaxspec.tune.run import TuneConfig, heldout_jobs, run_tune, search_jobs

SRC = str(Path(__file__).resolve().parents[2] / "src")
TINY = dict(methods=["cactus:delta=10"], draft_lengths=[2], sizes=(2, 4), caps=(2,), search_prompts=4,
            heldout_prompts=3, heldout_repeats=1, max_new_tokens=48, budget_minutes=30.0)


def _cli(forker, *args, timeout=300):
    """`python -m relaxspec ARGS` in a process of its own (forked: this tree's src first, conftest.forker)."""
    return forker.run(["-m", "relaxspec", *args], cwd=Path(SRC).parent, timeout=timeout)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    import torch
    torch.set_num_threads(1)
    import relaxspec
    out = tmp_path_factory.mktemp("tune")
    result = relaxspec.tune(task="arithmetic", max_drop=0.02, out=str(out), **TINY)
    return result, out


def test_the_plot_title_fits_the_figure(tuned):
    """The title (task name, then what is drawn) lies inside the figure, a long task name included."""
    import dataclasses

    import matplotlib.pyplot as plt
    from relaxspec.tune.report import search_figure
    result, _ = tuned
    for task in (result.config.task, "humaneval-instruct"):
        fig = search_figure(dataclasses.replace(result, config=dataclasses.replace(result.config, task=task)))
        box = fig.axes[0].title.get_window_extent(fig.canvas.get_renderer())
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, (task, box, fig.bbox)
        plt.close(fig)


def test_tune_writes_a_toml_that_generate_and_bench_read(tuned, forker):
    result, out = tuned
    assert result.choice is not None and Path(result.toml_path).is_file() and Path(result.plot_path).is_file()
    toml = Path(result.toml_path)
    from relaxspec.bench.config import BenchConfig
    from relaxspec.bench.settings import load_toml
    bench = BenchConfig.from_dict(load_toml(toml))
    bench.validate()
    assert bench.method_specs() == [(result.choice.method, result.choice.params_dict)]
    assert bench.draft_lengths == [result.choice.draft_length] and bench.tasks == ["arithmetic"]
    assert (bench.temperature, bench.top_p, bench.max_new_tokens) == (0.7, 0.95, 48)
    prompt = "Tom has 12 apples and buys 30 more. How many apples does he have?"
    via_config = _cli(forker, "generate", "--config", str(toml), "--prompt", prompt, "--json")
    assert via_config.returncode == 0, via_config.stderr
    c = result.choice
    params = [a for k, v in c.params for a in ("--param", f"{k}={v}")]
    explicit = _cli(forker, "generate", "--prompt", prompt, "--json", "--method", c.method, "--draft-length",
                    str(c.draft_length), "--temperature", "0.7", "--top-p", "0.95", "--max-new-tokens", "48", *params)
    assert explicit.returncode == 0, explicit.stderr
    got, want = json.loads(via_config.stdout), json.loads(explicit.stdout)
    assert got["results"][0]["token_ids"] == want["results"][0]["token_ids"]
    assert got["stats"]["draft_length"] == c.draft_length


def test_generate_config_rejects_unknown_keys(tmp_path, forker):
    bad = tmp_path / "bad.toml"
    bad.write_text('method = "strict"\nfrobnicate = 3\n')
    run = _cli(forker, "generate", "--config", str(bad), "--prompt", "hi")
    assert run.returncode == 2 and "relaxspec: error: generate config" in run.stderr and "frobnicate" in run.stderr
    assert "Traceback" not in run.stderr


def test_heldout_prompts_are_disjoint_from_search_prompts(tuned):
    result, out = tuned
    from relaxspec.bench.store import Store
    search, heldout = set(), set()
    with Store.open_existing(out) as store:
        for cell in store.cells():
            target = heldout if "prompts" in cell.config else search
            target.update(r.prompt for r in store.rows(cell.key))
    assert search and heldout and not search & heldout
    assert len(search) == TINY["search_prompts"] and len(heldout) == TINY["heldout_prompts"]
    jobs = heldout_jobs(80, 40, 3)
    assert {i for i, _ in jobs} == set(range(80, 120)) and len(set(jobs)) == 120
    assert {i for i, _ in search_jobs(500, 80)} == set(range(80))


def test_resumed_tune_reruns_nothing_stored(tuned, tmp_path):
    result, out = tuned
    # The same settings again: every sample is in the store.
    again = run_tune(TuneConfig(task="arithmetic", max_drop=0.02, out=str(out), **TINY), progress=False)
    assert again.search_samples == 0 and again.confirm_samples == 0
    assert again.choice == result.choice
    # What the race read is counted whether generated now or found stored: a fresh run generated just that.
    assert result.search_used == (result.search_samples, result.search_tokens)
    assert result.confirm_used == (result.confirm_samples, result.confirm_tokens)
    assert (again.search_used, again.confirm_used) == (result.search_used, result.confirm_used)
    # One more rung: only the new samples run (the configurations alive at rung 2, their strict and AR, 4 more
    # samples each).
    longer = dict(TINY, sizes=(2, 4, 8), caps=(2, 2))
    more = run_tune(TuneConfig(task="arithmetic", max_drop=0.02, out=str(out), **longer), progress=False)
    alive = [c for c in more.race.finalists]
    cells = {c for c in alive} | {c.strict for c in alive}
    assert more.search_samples == 4 * (len(cells) + 1)


def test_ratio_interval_on_known_vectors():
    exact = ratio_interval([2.0, 4.0, 6.0] * 5, [1.0, 2.0, 3.0] * 5, 0.95)
    assert ratio_interval([2.0, 4.0, 6.0], [1.0, 2.0, 3.0], 0.95).high == math.inf  # mean(b) > 0 unclear at n=3
    assert exact.mean == pytest.approx(2.0) and exact.low == pytest.approx(2.0) and exact.high == pytest.approx(2.0)
    noisy = ratio_interval([1.0, 3.0] * 50, [1.0] * 100, 0.95)  # b constant: mean(a) +- t_99 sqrt(CR1 var)
    assert noisy.mean == pytest.approx(2.0)
    assert noisy.high - 2.0 == pytest.approx(t_value(0.95, 99) * math.sqrt(100 / 99 / 100), rel=1e-3)
    assert 2.0 - noisy.low == pytest.approx(noisy.high - 2.0)
    clustered = ratio_interval([1.0, 1.0, 3.0, 3.0] * 25, [1.0] * 100, 0.95, [i // 2 for i in range(100)])
    assert clustered.clusters == 50 and clustered.high - 2.0 == pytest.approx(t_value(0.95, 49) * math.sqrt(
        50 / 49 / 50), rel=1e-3)  # 50 prompts, each twice: the interval of 50 samples, not 100
    assert ratio_interval([1.0], [1.0], 0.95).high == math.inf
    with pytest.raises(ValueError, match="objective"):
        speed_interval("nope", {}, {}, 2, 0, 0.1, 1.0, 0.95)
    # measured-bs1: the measured batch-1 speed-up itself, over the configuration's samples, with no interval
    bs1 = speed_interval("measured-bs1", {(0, 0): None, (1, 0): None}, None, 2, 0, 0.1, 1.0, 0.95, batch1=1.3)
    assert (bs1.mean, bs1.n, bs1.confidence) == (1.3, 2, 0.95) and math.isnan(bs1.low) and math.isnan(bs1.high)
    assert math.isnan(speed_interval("measured-bs1", {}, None, 2, 0, 0.1, 1.0, 0.95).mean)  # not measured


def test_cli_tune_errors_are_one_line(tmp_path, forker):
    run = _cli(forker, "tune", "--max-drop", "1.5", "--out", str(tmp_path))
    assert run.returncode == 2 and run.stderr.strip().startswith("relaxspec: error: tune: max drop")


def _rows(out: Path) -> int:
    import sqlite3
    db = out / "results.sqlite"
    if not db.is_file():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            return conn.execute("SELECT COUNT(*) FROM rows").fetchone()[0]
        except sqlite3.OperationalError:  # the schema is being created
            return 0


def test_interrupted_tune_resumes_without_rerunning_stored_samples(tmp_path):
    import signal
    import time
    args = ["tune", "--methods", "cactus:delta=10", "--draft-lengths", "2", "--rungs", "2,4", "--caps", "2",
            "--search-prompts", "4", "--heldout-prompts", "3", "--heldout-repeats", "1", "--max-new-tokens", "48",
            "--out", str(tmp_path), "--no-progress", "--no-plots"]
    proc = subprocess.Popen([sys.executable, "-m", "relaxspec", *args], env={**os.environ, "PYTHONPATH": SRC},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while _rows(tmp_path) == 0 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    before = _rows(tmp_path)
    assert before > 0
    if proc.returncode == 130:  # interrupted mid-search (it may also have finished first on a fast machine)
        assert "re-run the same command to resume" in err
    result = run_tune(TuneConfig(task="arithmetic", max_drop=0.02, out=str(tmp_path), **TINY), progress=False)
    assert result.search_samples + result.confirm_samples == _rows(tmp_path) - before

"""Bench grids on Ray (one local Ray instance with 2 CPUs for the module) give the local executor's results."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

ray = pytest.importorskip("ray")

from relaxspec.bench.config import BenchConfig  # noqa: E402
from relaxspec.bench.executors import Executor, ExecutorOptions, make_executor  # noqa: E402
from relaxspec.bench.runner import run_grid  # noqa: E402

CODE_VERSION = "test-ray"  # pinned: sources edited while the tests run must not change the cells' keys
GRID = dict(methods=["ar", "strict", "cactus:delta=1"], draft_lengths=[2, 3], limit=2, repeats=1, looks=1,
            max_new_tokens=64, speed_prompts=1, workers=1)
GRID_FLAGS = ["--methods", "ar,strict,cactus:delta=1", "--draft-lengths", "2,3", "--limit", "2", "--repeats", "1",
              "--looks", "1", "--max-new-tokens", "64", "--speed-prompts", "1", "--workers", "1"]
N_CELLS = 5  # ar + (strict, cactus) x N in {2, 3}
# metrics that are timings (they depend on where and when a cell ran); every other value must match
TIMINGS = {"run_id", "sample_wall_s", "tokens_per_s", "c_rel_measured", "c_block_measured", "latency_verifier_s",
           "latency_drafter_s", "batch1", "batch1_ar_s_per_token", "batch1_s_per_token", "measured_speedup_batch1",
           "modelled_speedup_measured_c_rel", "block_aware_speedup_measured", "model_c_block", "c_block_widths"}


@pytest.fixture(scope="module")
def cluster():
    """The address of a local Ray instance with 2 CPUs, shared by the module's tests, shut down after them."""
    env = os.environ.get("RELAXSPEC_CODE_VERSION")
    os.environ["RELAXSPEC_CODE_VERSION"] = CODE_VERSION  # the workers inherit it
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        if env is None:
            os.environ.pop("RELAXSPEC_CODE_VERSION")
        else:
            os.environ["RELAXSPEC_CODE_VERSION"] = env


def dump(out) -> dict:
    """Every stored cell: its config, its metrics apart from timings, and its rows, as JSON text (byte-compared)."""
    conn = sqlite3.connect(os.path.join(out, "results.sqlite"))
    cells = {}
    for key, config, metrics in conn.execute("SELECT key, config, metrics FROM cells"):
        m = {k: v for k, v in json.loads(metrics).items() if k not in TIMINGS}
        m["engine_stats"] = [{k: v for k, v in part.items() if not k.startswith("time_")} for part in m["engine_stats"]]
        rows = conn.execute("SELECT prompt_index, repeat, prompt, reference, response, utility, tokens, stats, "
                            "token_hash FROM rows WHERE cell_key = ? ORDER BY repeat, prompt_index", (key,)).fetchall()
        cells[key] = {"config": config, "metrics": json.dumps(m, sort_keys=True), "rows": json.dumps(rows)}
    conn.close()
    return cells


@pytest.fixture(scope="module")
def local_cells(tmp_path_factory, cluster):
    out = tmp_path_factory.mktemp("local")
    summary = run_grid(BenchConfig(**GRID, out=str(out)), progress=False)
    assert len(summary.ran) == N_CELLS and not summary.failed
    return dump(out)


def test_ray_grid_stores_the_local_cells(tmp_path, cluster, local_cells):
    summary = run_grid(BenchConfig(**GRID, out=str(tmp_path)), progress=False,
                       executor=ExecutorOptions(kind="ray", ray_address=cluster, cells_per_worker=2))
    assert len(summary.ran) == N_CELLS and not summary.failed
    cells = dump(tmp_path)
    assert sorted(cells) == sorted(local_cells)
    for key, cell in cells.items():
        assert cell == local_cells[key], json.loads(cell["config"])["method"]
    spec = [json.loads(c["metrics"]) for c in cells.values() if json.loads(c["config"])["method"] == "cactus"]
    assert all(m["n_samples"] == 2 and m["mean_acceptance_length"] > 1 for m in spec)


def test_failing_cell_is_reported_and_the_rest_completes(tmp_path, cluster, capsys):
    # spec-cont-dec needs the drafter's distribution q, which prompt lookup (ngram) does not give: that cell raises
    # in the Ray worker's engine, the others run and are stored (an out-of-range parameter is refused before any work)
    out = tmp_path / "res"
    from relaxspec.cli import main
    code = main(["bench", "--drafter", "ngram", "--methods", "strict,mentored:alpha=0.5,spec-cont-dec:beta=0.5",
                 "--draft-lengths", "2", "--limit", "1",
                 "--repeats", "1", "--looks", "1", "--max-new-tokens", "6", "--speed-prompts", "0", "--workers", "1",
                 "--executor", "ray", "--ray-address", cluster, "--out", str(out), "--no-progress", "--no-plots"])
    assert code == 1
    err = capsys.readouterr().err
    assert "1 cells failed (not stored; each fails again until what it says is fixed):\n" \
           "  arithmetic spec-cont-dec(beta=0.5) N=2 seed=0: ValueError: " in err
    assert "needs the drafter's distribution" in err and "Traceback" not in err
    cells = dump(out)
    methods = sorted((json.loads(c["config"])["method"], json.loads(c["config"])["params"].get("alpha"))
                     for c in cells.values())
    assert methods == [("mentored", 0.5), ("strict", None)]


def test_killed_driver_resumes(tmp_path, cluster, local_cells):
    """A driver killed (SIGKILL) mid-grid loses only the cells in flight; re-running completes the grid."""
    out = tmp_path / "res"
    env = dict(os.environ, OMP_NUM_THREADS="1", RELAXSPEC_CODE_VERSION=CODE_VERSION)
    cmd = [sys.executable, "-m", "relaxspec", "bench", *GRID_FLAGS, "--executor", "ray", "--ray-address", cluster,
           "--out", str(out), "--no-progress", "--no-plots"]
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    stored = 0
    while time.monotonic() < deadline and first.poll() is None:
        stored = _count(out)
        if stored >= 1:
            first.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)  # (a cell takes a few tenths of a second: the kill must land before the last is stored)
    first.wait(timeout=60)
    log.close()
    assert first.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()
    stored = _count(out)
    assert 1 <= stored < N_CELLS

    again = run_grid(BenchConfig(**GRID, out=str(out)), progress=False,
                     executor=ExecutorOptions(kind="ray", ray_address=cluster))
    assert len(again.skipped) == stored and len(again.ran) == N_CELLS - stored and not again.failed
    assert dump(out) == local_cells


def _count(out) -> int:
    db = out / "results.sqlite"
    if not db.is_file():
        return 0
    conn = sqlite3.connect(db, timeout=5)
    try:
        return conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is not written yet
        return 0
    finally:
        conn.close()


@dataclass
class Job:
    """A generic executor job. `marker`: its worker process exits on the first try (the marker file does not
    exist yet), a worker dying mid-job; `die`: it exits on every try; `fail`: it raises."""
    label: str
    marker: str = ""
    die: bool = False
    fail: bool = False
    affinity: str = "pair"

    def run(self, cache):
        cache["runs"] = cache.get("runs", 0) + 1
        if self.fail:
            raise ValueError(f"bad parameters in {self.label}")
        if self.die or (self.marker and not os.path.exists(self.marker)):
            if self.marker:
                open(self.marker, "w").close()
            os._exit(1)
        return self.label, cache["runs"]


# Ray workers cannot import this test module: its jobs travel by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_ray_executor_retries_dead_workers_a_bounded_number_of_times(tmp_path, cluster):
    marker = str(tmp_path / "died-once")
    jobs = [Job("a"), Job("b", marker=marker), Job("c", fail=True), Job("dies", die=True), Job("d")]
    with make_executor(ExecutorOptions(kind="ray", ray_address=cluster, max_retries=1)) as pool:
        done = {f.job.label: f for f in pool.run(jobs)}
    assert os.path.exists(marker)  # b's worker did die once; b was re-sent to the restarted worker
    assert done["b"].error is None and done["b"].result[0] == "b"
    assert done["c"].result is None and done["c"].error == "ValueError: bad parameters in c"
    assert done["dies"].result is None and done["dies"].error.startswith("worker ")
    assert "died (restarted 1 times)" in done["dies"].error
    assert done["a"].result[0] == "a" and done["d"].result[0] == "d"

    # the cache lives as long as the worker: 3 jobs on 2 workers, one worker's second job sees its first
    with make_executor(ExecutorOptions(kind="ray", ray_address=cluster)) as pool:
        assert isinstance(pool, Executor) and pool.capacity() == 2  # one interface; the cluster's 2 CPUs
        runs = [f.result[1] for f in pool.run([Job("x"), Job("y"), Job("z")])]
    assert sorted(runs)[-1] == 2 and len(pool.status) == 0


def test_local_executor_same_interface():
    with make_executor(ExecutorOptions(kind="local")) as pool:
        done = list(pool.run([Job("a"), Job("c", fail=True), Job("d")]))
    assert [(f.job.label, f.result, f.error) for f in done] == [
        ("a", ("a", 1), None), ("c", None, "ValueError: bad parameters in c"), ("d", ("d", 3), None)]
    with pytest.raises(ValueError, match="need --executor ray"):
        make_executor(ExecutorOptions(kind="local", gpus_per_cell=1))


def test_tune_on_ray_stores_the_samples_of_a_local_tune(tmp_path, cluster):
    """`relaxspec tune --executor ray`: each rung's samples run on Ray workers, the driver stores them; the
    stored samples and the choice are those of the same tune run in this process."""
    from relaxspec.bench.executors import ExecutorOptions
    from relaxspec.tune.run import TuneConfig, run_tune

    tiny = dict(methods=["cactus:delta=10", "mentored:alpha=0.5"], draft_lengths=[2], sizes=(2, 4), caps=(2,),
                search_prompts=4, heldout_prompts=2, heldout_repeats=1, max_new_tokens=16, budget_minutes=30.0,
                c_rel=0.3, c_block=1.2)
    local = run_tune(TuneConfig(out=str(tmp_path / "local"), **tiny), progress=False)
    on_ray = run_tune(TuneConfig(out=str(tmp_path / "ray"), **tiny), progress=False,
                      executor=ExecutorOptions(kind="ray", ray_address=cluster))
    assert on_ray.choice == local.choice and on_ray.search_samples == local.search_samples > 0
    assert on_ray.remote_samples == on_ray.search_samples and local.remote_samples == 0  # the search ran on Ray
    assert dump(tmp_path / "ray") == dump(tmp_path / "local")

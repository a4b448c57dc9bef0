"""relaxspec.bench as a library: its public API, a workbench that ensures a cell's samples, a typed cell request and
result, one executor interface."""

import os
from dataclasses import dataclass

import pytest
import torch

import relaxspec.bench as bench
from relaxspec.bench import BenchConfig, CellSpec, Executor, ExecutorOptions, Workbench, Wanted, make_executor
from relaxspec.bench.cell import CellRequest, CellResult, run_cell
from relaxspec.bench.executors import LocalExecutor, PoolExecutor

torch.set_num_threads(1)


def test_every_public_name_resolves_once():
    assert len(set(bench.__all__)) == len(bench.__all__)
    missing = [name for name in bench.__all__ if not hasattr(bench, name)]
    assert missing == []


def _config(tmp_path, drafter="drafter-weak") -> BenchConfig:
    return BenchConfig(verifiers=["verifier"], drafters=[drafter], tasks=["arithmetic"], methods=["ar", "strict"],
                       draft_lengths=[2], limit=3, repeats=1, looks=2, max_new_tokens=8, speed_prompts=0, workers=1,
                       out=str(tmp_path))


def test_a_request_for_given_samples_gives_the_look_s_rows_in_any_batching(tmp_path):
    config, cache = _config(tmp_path), {}
    spec = CellSpec("verifier", "drafter-weak", "arithmetic", "strict", {}, 2, 0)
    look = run_cell(CellRequest(spec, "k", [(0, 0), (1, 0), (2, 0)]), config, cache)
    assert isinstance(look, CellResult) and look.error is None and look.request.key == "k"
    assert [(r.prompt_index, r.repeat) for r in look.rows] == [(0, 0), (1, 0), (2, 0)]
    assert len(look.parts) == 1 and look.sample_wall_s > 0 and look.span[0] <= look.span[1]
    given = run_cell(CellRequest(spec, "k", samples=[(2, 0), (0, 0)], batch_size=1), config, cache)
    assert len(given.parts) == 2  # one generate call per sample
    rows = {(r.prompt_index, r.repeat): (r.response, r.utility, r.token_hash) for r in look.rows}
    assert {(r.prompt_index, r.repeat): (r.response, r.utility, r.token_hash) for r in given.rows} == \
        {k: rows[k] for k in ((2, 0), (0, 0))}


def test_a_cell_that_raises_gives_its_one_line_error_in_the_result(tmp_path):
    # spec-cont-dec needs the drafter's distribution q, which prompt lookup (ngram) does not give
    spec = CellSpec("verifier", "ngram", "arithmetic", "spec-cont-dec", {"beta": 0.5}, 2, 0)
    result = run_cell(CellRequest(spec, "k", [(0, 0)]), _config(tmp_path, "ngram"), {})
    assert result.rows == [] and result.error.startswith("ValueError: ") and "\n" not in result.error
    assert "needs the drafter's distribution" in result.error


def test_a_workbench_runs_only_the_samples_a_cell_lacks_here_or_on_its_executor(tmp_path):
    config = _config(tmp_path)
    spec = CellSpec("verifier", "drafter-weak", "arithmetic", "strict", {}, 2, 0)
    ar = CellSpec("verifier", None, "arithmetic", "ar", {}, 0, 0)
    bad = CellSpec("verifier", "drafter-weak", "arithmetic", "cactus", {"delta": -1.0}, 2, 0)  # delta must be >= 0
    keys = lambda rows: [(r.prompt_index, r.repeat) for r in rows]  # noqa: E731
    with Workbench(config) as workbench:
        assert keys(workbench.ensure(Wanted(spec, [(0, 0), (1, 0)]), run_id="a").rows) == [(0, 0), (1, 0)]
        assert keys(workbench.ensure(Wanted(spec, [(1, 0), (2, 0)])).rows) == [(2, 0)]  # only the sample it lacks
        assert workbench.ensure(Wanted(spec, [(2, 0)])) is None
        cell = workbench.store.get(workbench.key(spec))
        assert cell.metrics["n_samples"] == 3 and cell.metrics["c_rel_measured"] > 0  # its speed constants
        # on the executor (this process's by default): each cell once, a failure reported and not stored
        done = list(workbench.ensure_all([Wanted(ar, [(0, 0), (1, 0)]), Wanted(spec, [(0, 0)]), Wanted(bad, [(0, 0)]),
                                        Wanted(ar, [(0, 0)])], look=1))
        assert [(r.request.spec.method, r.error is None, m is not None) for r, m in done] == [
            ("ar", True, True), ("cactus", False, False)]
        assert done[1][0].error.startswith("ValueError: ") and not workbench.store.has(workbench.key(bad))
        assert workbench.store.get(workbench.key(ar)).metrics["look"] == 1
        with pytest.raises(ValueError):  # in this process, a failure raises
            workbench.ensure(Wanted(bad, [(0, 0)]))
        rows = workbench.store.rows(workbench.key(spec))
        stored = {(r.prompt_index, r.repeat): (r.response, r.token_hash) for r in rows}
    whole = run_cell(CellRequest(spec, "k", [(0, 0), (1, 0), (2, 0)]), config, {})  # the same rows in one request
    assert stored == {(r.prompt_index, r.repeat): (r.response, r.token_hash) for r in whole.rows}


def test_a_cell_stopped_between_its_generate_calls_keeps_them_and_goes_on(tmp_path):
    """workbench.ensure stores each generate call's samples as it ends: a `between` that raises after the first call
    (as a protocol part out of time does) leaves that call stored, with the cell's metrics; the same request then
    runs only the rest, and the cell holds what one whole run gives."""
    config = _config(tmp_path)
    spec = CellSpec("verifier", "drafter-weak", "arithmetic", "strict", {}, 2, 0)
    jobs = [(i, 0) for i in range(5)]

    class Stop(Exception):
        pass

    def stop():
        raise Stop
    with Workbench(config) as workbench:
        with pytest.raises(Stop):
            workbench.ensure(Wanted(spec, jobs, batch_size=2), between=stop)
        key = workbench.key(spec)
        assert sorted(workbench.store.utilities(key)) == jobs[:2]
        assert workbench.store.get(key).metrics["n_samples"] == 2
        rest = workbench.ensure(Wanted(spec, jobs, batch_size=2), between=lambda: None)
        assert [(r.prompt_index, r.repeat) for r in rest.rows] == jobs[2:]
        cell = workbench.store.get(key)
        assert cell.metrics["n_samples"] == 5 and len(cell.metrics["engine_stats"]) == 3  # a call of 2, 2, 1
        stored = {(r.prompt_index, r.repeat): (r.response, r.token_hash) for r in workbench.store.rows(key)}
    whole = run_cell(CellRequest(spec, "k", jobs), config, {})
    assert stored == {(r.prompt_index, r.repeat): (r.response, r.token_hash) for r in whole.rows}


@dataclass
class Job:
    """A generic executor job (picklable: a pool worker imports this module)."""
    label: str
    fail: bool = False
    affinity: str = "pair"
    die: bool = False  # the worker process is killed (as the kernel's out-of-memory killer kills it)

    def run(self, cache):
        cache["runs"] = cache.get("runs", 0) + 1
        if self.die:
            import signal
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fail:
            raise ValueError(f"bad parameters in {self.label}")
        return self.label


def test_local_and_pool_executors_are_one_interface():
    with make_executor(ExecutorOptions(), {"seeded": True}) as local:
        assert isinstance(local, LocalExecutor) and isinstance(local, Executor) and local.capacity() == 1
        done = [(f.job.label, f.result, f.error) for f in local.run([Job("a"), Job("b", fail=True)])]
        assert done == [("a", "a", None), ("b", None, "ValueError: bad parameters in b")]
        assert local.cache == {"seeded": True, "runs": 2}  # the cache it was given, across its jobs
    with make_executor(ExecutorOptions(), workers=2) as pool:
        assert isinstance(pool, PoolExecutor) and isinstance(pool, Executor) and pool.capacity() == 2
        done = {f.job.label: (f.result, f.error) for f in pool.run([Job("a"), Job("b", fail=True), Job("c")])}
    assert done == {"a": ("a", None), "b": (None, "ValueError: bad parameters in b"), "c": ("c", None)}


def test_a_pool_worker_killed_fails_the_unfinished_jobs_and_never_hangs():
    """A worker killed mid-job (out of memory): every job is still reported once, the killed one and those not
    finished as failed with one line that says why, never waited for; the next run starts a new pool."""
    import signal

    def hung(*_):
        raise TimeoutError("the pool waited for a dead worker")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(240)
    try:
        with make_executor(ExecutorOptions(), workers=2) as pool:
            jobs = [Job("a"), Job("dies", die=True), *(Job(f"later {i}") for i in range(4))]
            done = list(pool.run(jobs))
            assert sorted(f.job.label for f in done) == sorted(j.label for j in jobs)
            died = [f for f in done if f.error]
            assert "dies" in [f.job.label for f in died]
            assert all(f.error.startswith("BrokenProcessPool: its worker process died") and "\n" not in f.error
                       for f in died)
            assert all(f.result == f.job.label for f in done if not f.error)
            again = list(pool.run([Job("after")]))
            assert [(f.job.label, f.result, f.error) for f in again] == [("after", "after", None)]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)

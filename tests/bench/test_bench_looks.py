"""Adaptive allocation: later looks extend only undecided relaxed cells (and strict at their N), never beyond
the maximum number of looks or the time budget, and an interrupted look resumes without losing samples."""

import math

import pytest
import torch

from relaxspec.bench.config import BenchConfig
from relaxspec.bench.cell import CellSpec
from relaxspec.bench.runner import Grid, RunSummary, _look_jobs, run_grid
from relaxspec.bench.sampling import samples_at
from relaxspec.bench.workbench import Workbench
from relaxspec.bench.store import Row, Store

torch.set_num_threads(1)


def _rows(utilities, repeat=0):
    return [Row(prompt_index=i, repeat=repeat, prompt="p", reference="1", response="r", utility=u, tokens=3, stats={},
                token_hash=str(u)) for i, u in enumerate(utilities)]


def _cell(store, key, method, utilities):
    store.put(key, {"method": method}, {"sample_wall_s": 0.01 * len(utilities), "n_samples": len(utilities),
                                        "n_prompts": len(utilities)}, _rows(utilities))


def _jobs(look, keyed, strict_key, store, config, t_start, summary, parallel=None):
    """The look's wanted samples, each cell's task of unlimited prompts."""
    unlimited = lambda task, n: samples_at(config.limit, config.repeats, n, math.inf, config.heldout_band)  # noqa: E731
    grid = Grid(Workbench(config, store), summary, print, t_start, keyed=keyed, strict_key=strict_key,
                samples_at=unlimited)
    return _look_jobs(grid, look, parallel)


def test_later_looks_extend_only_undecided_cells(tmp_path):
    spec = lambda method, n=3: CellSpec("v", "d", "t", method, {}, n, 0)  # noqa: E731
    keyed = [(spec("ar", 0), "ar"), (spec("strict"), "strict"), (spec("same"), "same"), (spec("open"), "open"),
             (spec("beyond"), "beyond"), (spec("orphan", 4), "orphan")]
    strict_key = {"same": "strict", "open": "strict", "beyond": "strict", "orphan": None}
    base = [0.0] * 30 + [1.0] * 370
    with Store(tmp_path) as store:
        _cell(store, "ar", "ar", base)
        _cell(store, "strict", "strict", base)
        _cell(store, "same", "same", base)  # no pair differs in 400: +-0.014 at 98.3%, within 0.03: decided
        # 30 wins, 40 losses: -0.025 +- 0.05, straddles the budget
        _cell(store, "open", "open", [1.0] * 30 + [0.0] * 40 + [1.0] * 330)
        _cell(store, "beyond", "beyond", [0.0] * 400)  # wholly beyond
        _cell(store, "orphan", "orphan", [0.0] * 12 + [1.0] * 388)  # no strict at its N: cannot be decided
        config = BenchConfig(limit=400, repeats=1, looks=3, max_drop=0.03, time_budget_s=1e6)
        summary = RunSummary()
        jobs = _jobs(2, keyed, strict_key, store, config, 0.0, summary)
        assert [(w.spec.method, len(w.samples)) for w in jobs] == [("strict", 800), ("open", 800)]  # look 2's
        # at a wider budget the straddling cell is decided too: nothing to do
        wide = BenchConfig(limit=400, repeats=1, looks=3, max_drop=0.2, time_budget_s=1e6)
        assert _jobs(2, keyed, strict_key, store, wide, 0.0, RunSummary()) == []
        # the time budget: strict's next look (400 samples at 0.01 s) does not fit in 3 s; its relaxed cell
        # is not run without it
        import time
        tight = BenchConfig(limit=400, repeats=1, looks=3, max_drop=0.03, time_budget_s=3.0, workers=1)
        out = RunSummary()
        assert _jobs(2, keyed, strict_key, store, tight, time.perf_counter(), out) == []
        assert [label.split()[1] for label in out.out_of_time] == ["strict", "open"]
        # spread over the workers that run at once (Ray's capacity, not --workers): 2 s each on 2 fits one,
        # 1 s each on 4 fits both
        assert [w.spec.method for w in _jobs(2, keyed, strict_key, store, tight, time.perf_counter(),
                                             RunSummary(), parallel=2)] == ["strict"]
        assert [w.spec.method for w in _jobs(2, keyed, strict_key, store, tight, time.perf_counter(),
                                             RunSummary(), parallel=4)] == ["strict", "open"]


def small(out, **kw):
    base = dict(verifiers=["verifier"], drafters=["drafter-weak"], tasks=["arithmetic"],
                methods=["ar", "strict", "cactus:delta=0/10"], draft_lengths=[2], limit=3, repeats=1, looks=3,
                max_new_tokens=8, speed_prompts=1, workers=1, out=str(out))
    base.update(kw)
    return BenchConfig(**base)


def _repeats(out) -> dict:
    """(prompts, repeats per prompt) of each cell."""
    with Store(out) as store:
        return {(c.config["method"], json_params(c.config["params"])): (c.metrics["n_prompts"], store.repeats_done(c.key))
                for c in store}


def json_params(p):
    return tuple(sorted(p.items()))


def test_looks_stop_decided_cells_and_honour_the_maximum(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "test-looks")
    quiet = dict(progress=False, log=lambda *a: None)
    decided = run_grid(small(tmp_path / "a", max_drop=0.99), **quiet)  # every half-width <= 0.99 after look 1
    assert decided.looks_run == 1 and set(_repeats(tmp_path / "a").values()) == {(3, 1)}
    # with 3 samples nothing is decided at 0.03: every relaxed cell and strict go to the last look, AR stays;
    # later looks add new prompts (the task has them), each once, skipping tune's held-out band 3..242
    undecided = run_grid(small(tmp_path / "b"), **quiet)
    assert undecided.looks_run == 3
    assert _repeats(tmp_path / "b") == {("ar", ()): (3, 1), ("strict", ()): (12, 1),
                                        ("cactus", (("delta", 0.0),)): (12, 1), ("cactus", (("delta", 10.0),)): (12, 1)}
    with Store(tmp_path / "b") as store:
        cells = {c.config["method"] + str(c.config["params"]): c for c in store}
        strict = cells["strict{}"]
        assert strict.metrics["n_samples"] == 12 and strict.metrics["look"] == 3 and strict.metrics["looks"] == 3
        assert sorted(store.utilities(strict.key)) == [(i, 0) for i in (0, 1, 2, *range(243, 252))]
        assert len(strict.metrics["engine_stats"]) == 3  # one generate call per look, merged for tau
        # cactus at delta 0 is strict: coupled, every sample's tokens are strict's
        assert store.token_hashes(cells["cactus{'delta': 0.0}"].key) == store.token_hashes(strict.key)


def test_an_interrupted_look_resumes_without_losing_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "test-looks-resume")
    quiet = dict(progress=False, log=lambda *a: None)
    stored = []

    def stop_in_look_two(index, spec, key, metrics):
        stored.append((key, metrics["look"]))
        if metrics["look"] == 2:
            raise KeyboardInterrupt

    config = small(tmp_path / "r", looks=2)
    with pytest.raises(KeyboardInterrupt):
        run_grid(config, on_cell=stop_in_look_two, **quiet)
    first_key = stored[-1][0]
    with Store(tmp_path / "r") as store:
        assert len(store.utilities(first_key)) == 6  # the finished look-2 part is kept
    again = run_grid(small(tmp_path / "r", looks=2), **quiet)
    assert again.skipped and first_key not in again.ran and len(again.ran) == 2  # the two cells left
    fresh = run_grid(small(tmp_path / "f", looks=2), **quiet)
    assert len(fresh.ran) == 4
    with Store(tmp_path / "r") as resumed, Store(tmp_path / "f") as whole:
        for cell in whole:  # same keys, same coupled samples
            assert resumed.utilities(cell.key) == whole.utilities(cell.key)
            assert resumed.get(cell.key).metrics["n_samples"] == cell.metrics["n_samples"]


def test_later_looks_pair_each_relaxed_cell_with_its_own_drafters_strict(tmp_path):
    """With several drafters, a relaxed cell's reference is strict with the same drafter (cells' labels do not name
    the drafter): the first drafter's undecided cells are extended with their own strict, none runs out of time."""
    config = BenchConfig(drafters=["drafter-weak", "drafter-strong"], methods=["ar", "strict", "ensemble:weight=0.8"],
                         draft_lengths=[2], limit=2, repeats=1, looks=2, speed_prompts=0, max_new_tokens=8, workers=1,
                         time_budget_s=600, out=str(tmp_path))
    summary = run_grid(config, progress=False, log=lambda *a: None)
    assert summary.out_of_time == [] and summary.looks_run == 2
    with Store(tmp_path) as store:
        done = {(c.config["drafter"], c.config["method"]): c.metrics["n_samples"] for c in store.cells()}
    for drafter in config.drafters:  # 2 samples cannot decide anything: every relaxed cell is extended
        assert done[(drafter, "ensemble")] == 4 and done[(drafter, "strict")] == 4


def test_independent_prompts_first_then_repeats_when_the_pool_runs_out():
    from relaxspec.bench.sampling import look_design, looks_done
    held = BenchConfig().heldout_band  # tune's default held-out band (240)
    band = range(80, 80 + held)
    big = 10_000
    for look, prompts in ((1, 80), (2, 160), (3, 320), (4, 640)):  # a synthetic task: new prompts, one repeat
        ids, reps = look_design(80, 1, look, big, held)
        assert len(ids) == prompts and reps == 1 and not set(ids) & set(band) and len(set(ids)) == prompts
    # AIME's 30: repeats double instead
    assert [look_design(30, 1, look, 30, held) for look in (1, 2, 3)] == [(list(range(30)), 1), (list(range(30)), 2),
                                                                         (list(range(30)), 4)]
    # a band given by the caller: look 2's new prompts start after it; another band than the default enters the key
    assert look_design(80, 1, 2, big, 10)[0] == [*range(80), *range(90, 170)]
    from relaxspec.bench.cell import cell_config
    versions = {"verifier": "v", "code": "c"}
    spec = CellSpec("verifier", "drafter-weak", "arithmetic", "strict", {}, 3, 0)
    plain = cell_config(spec, BenchConfig(), versions)
    assert cell_config(spec, BenchConfig(heldout_band=10), versions) == {**plain, "heldout_band": 10}
    # a pool that runs out part-way (80 + 240 held out + 100 spare): new prompts first, then repeats
    ids, reps = look_design(80, 1, 3, 420, held)
    assert len(ids) == 180 and reps == 2  # 360 >= the 320 samples of look 3
    for pool in (30, 420, big):  # looks are nested, and resume where the store stopped
        for look in (1, 2, 3):
            before, after = set(samples_at(80, 1, look, pool, held)), set(samples_at(80, 1, look + 1, pool, held))
            assert before < after
        stored = samples_at(80, 1, 2, pool, held)
        assert looks_done(stored, lambda n, p=pool: samples_at(80, 1, n, p, held), 4) == 2


def test_samples_stored_under_another_plan_are_not_mixed_in(tmp_path):
    """--repeats is not in a cell's key: a cell stored with 1 repeat per prompt is reported, not extended with
    samples it already has, when a run asks for 2."""
    spec = CellSpec("v", "d", "t", "strict", {}, 3, 0)
    with Store(tmp_path) as store:
        _cell(store, "k", "strict", [1.0] * 4)  # prompts 0..3, repeat 0
        one, two = RunSummary(), RunSummary()
        assert _jobs(1, [(spec, "k")], {}, store, BenchConfig(limit=4, repeats=1), 0.0, one) == []
        assert _jobs(1, [(spec, "k")], {}, store, BenchConfig(limit=4, repeats=2), 0.0, two) == []
        assert not one.failed and two.failed == [f"{spec.label}: its stored samples follow another --repeats; "
                                                 "use another --out"]

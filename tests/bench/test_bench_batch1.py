"""The bench's batch-1 timing runs in a phase of its own, before any sample job (a quiet machine)."""

import torch

from relaxspec.bench.config import BenchConfig
from relaxspec.bench.runner import run_grid
from relaxspec.bench.store import Store


def test_batch1_timing_runs_before_and_apart_from_the_sample_jobs(tmp_path):
    torch.set_num_threads(1)
    config = BenchConfig(verifiers=["verifier"], drafters=["drafter-weak"], tasks=["arithmetic"],
                         methods=["ar", "strict", "typical"], draft_lengths=[2], limit=2, repeats=1, looks=1,
                         speed_prompts=2, max_new_tokens=8, workers=2, out=str(tmp_path / "b"))
    said = []
    summary = run_grid(config, progress=False, log=said.append)
    assert any("batch-1 timing of 2 cells" in line for line in said)
    assert len(summary.ran) == 3 and not summary.failed
    timing, look = summary.phases["batch 1"], summary.phases["look 1"]
    assert summary.phases["speed constants"][1] <= timing[0] <= timing[1]
    # every sample job (in the pool's two workers) started after the batch-1 phase ended
    assert timing[1] <= look[0] <= look[1]
    with Store(config.out) as store:
        batch1 = [c.metrics["batch1"] for c in map(store.get, summary.ran) if c.metrics["batch1"]]
    assert len(batch1) == 2  # strict and typical; AR has none
    for b in batch1:
        assert b["batch1_prompts"] == 2 and b["measured_speedup_batch1"] > 0
        assert "batch1_halves" not in b  # (too few prompts to halve)
    # AR ran once per prompt for both cells
    assert batch1[0]["batch1_ar_s_per_token"] == batch1[1]["batch1_ar_s_per_token"]
    # a re-run times nothing: every cell is stored
    said = []
    again = run_grid(config, progress=False, log=said.append)
    assert not any("batch-1" in line for line in said) and "look 1" not in again.phases


def test_batch1_timing_halves_show_the_drift_and_the_report_says_it(monkeypatch):
    # x b1 on the first and on the last half of the prompts: each half's ratio of medians, from the same runs.
    from relaxspec.bench import cell as cell_module
    from relaxspec.bench.cell import CellSpec, time_batch1_cells
    from relaxspec.bench.report import _drift
    from relaxspec.models import load_model
    from relaxspec.tasks import get_task

    torch.set_num_threads(1)
    v, d = load_model("verifier"), load_model("drafter-weak")
    spec = CellSpec("verifier", "drafter-weak", "arithmetic", "strict", {}, 2, 0)
    # A clock on which AR's runs take 1 s a token on the first two prompts and 2 s on the last two (the machine
    # drifted), strict's 1 s throughout: x b1 1.5 over all four, 1.0 and 2.0 on the halves.
    now, seconds, runs = [0.0], {"ar": [1, 1, 2, 2], "strict": [1, 1, 1, 1]}, {"ar": 0, "strict": 0}
    real = cell_module.generate_samples

    def timed(cell, *a, **k):
        out = real(cell, *a, **k)
        now[0] += seconds[cell.method][runs[cell.method]] * len(out.results[0].token_ids)
        runs[cell.method] += 1
        return out
    monkeypatch.setattr(cell_module, "generate_samples", timed)
    monkeypatch.setattr("relaxspec.models.hf.step_clock", lambda device: lambda: now[0])
    got = time_batch1_cells([spec], get_task("arithmetic", limit=4), lambda s: (v, d),
                            BenchConfig(speed_prompts=4, max_new_tokens=8))[0]
    assert got["batch1_prompts"] == 4 and got["measured_speedup_batch1"] == 1.5
    assert got["batch1_halves"] == [1.0, 2.0]
    line = _drift([{"batch1_halves": got["batch1_halves"]}, {"batch1_halves": [1.0, 1.1]}, {"batch1_halves": None}])
    assert len(line) == 1 and "differs by 0.55 (median over 2 cells; largest 1.00)" in line[0]

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
    # AR ran once per prompt for both cells
    assert batch1[0]["batch1_ar_s_per_token"] == batch1[1]["batch1_ar_s_per_token"]
    # a re-run times nothing: every cell is stored
    said = []
    again = run_grid(config, progress=False, log=said.append)
    assert not any("batch-1" in line for line in said) and "look 1" not in again.phases

"""bench --preset qwen-coder: its grid, its priced time, and a resumed run that stores what an uninterrupted one does."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relaxspec.bench import presets
from relaxspec.bench.names import AR, AUTO

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_grid_stages_and_cells():
    cells = presets.grid()
    assert {k: len(v) for k, v in cells.items()} == {"greedy": 7, "sampled": 23, "lengths": 2, "greedy-lengths": 4}
    assert sum(m == AR for v in cells.values() for m, _, _ in v) == 2  # greedy's and sampled's; lengths share them
    greedy = {m for m, _, _ in cells["greedy"]}
    assert greedy == {AR, "strict", "topk-delta", "topk-ratio", "spec-casc-tok", "ensemble", "spec-casc-opt"}
    assert {n for _, _, n in cells["lengths"]} == {5, AUTO} == {n for _, _, n in cells["greedy-lengths"]}
    # a relaxed rule at every N where 55 samples can decide one: greedy (the sampled stage decided none)
    assert {(m, n) for m, _, n in cells["greedy-lengths"]} == {(m, n) for m in ("strict", "spec-casc-tok")
                                                                for n in (5, AUTO)}
    configs = dict(presets.stage_configs({}))
    assert configs["greedy-lengths"].temperature == 0 == configs["greedy"].temperature
    assert configs["lengths"].temperature == 0.7
    sampled = {(m, tuple(p.values())) for m, p, _ in cells["sampled"]}
    assert ("cactus", (0.1,)) in sampled and ("cactus", (0.25,)) in sampled and ("spec-casc-tok", (0.8,)) in sampled
    # the 0.5B drafter gives logits: the rules that read them run too; PAD has no classifier for this pair
    from relaxspec.acceptance import RULES
    run = {m for v in cells.values() for m, _, _ in v}
    assert {"ensemble", "spec-casc-opt", "spec-cont-dec"} <= run and "pad" not in run
    assert set(RULES) - run == {"pad"}
    configs = dict(presets.stage_configs({}))
    assert all(c.drafters == ["qwen2.5-coder-0.5b"] and c.dtype == "int4" for c in configs.values())


def test_rules_left_out_at_greedy_repeat_strict():
    """At T=0 the sampled stage's other rules are exactly strict on the built-in pair: same token ids."""
    import torch
    torch.set_num_threads(1)
    from relaxspec import generate
    from relaxspec.tasks import get_task
    prompts = get_task("arithmetic", limit=6).prompts
    kw = dict(draft_length=3, max_new_tokens=24, temperature=0.0)
    strict = generate("verifier", "drafter-weak", prompts, method="strict", **kw)
    greedy_rules = {m for m, _, _ in presets.grid()["greedy"]}
    left_out = [(m, p) for m, p, _ in presets.grid()["sampled"] if m not in greedy_rules]
    assert len(left_out) == 11
    for m, p in left_out:
        out = generate("verifier", "drafter-weak", prompts, method=m, **kw, **p)
        assert [r.token_ids for r in out.results] == [r.token_ids for r in strict.results], (m, p)


def test_estimate_prices_every_cell():
    c = presets.Costs(ar_s_per_token=0.05, batch_ar_s_per_token=0.02, batch_spec_ratio=1.5,
                      tau={"ngram": 1.6, "lm": 3.0})
    assert c.sample_s == pytest.approx(0.02 * 210)
    assert c.ratio(AR, 0, "ngram") == 1.0 == c.batch_ratio(AR)
    assert c.batch_ratio("strict") == 1.5
    assert c.ratio("strict", 3, "ngram") == pytest.approx((1.3 + 3 * 0.003) / 1.6)
    assert c.ratio("strict", 3, "qwen2.5-coder-0.5b") == pytest.approx((1.3 + 3 * 0.39) / 3.0)
    assert c.ratio("strict", AUTO, "ngram") == c.ratio("strict", 5, "ngram")
    # greedy, sampled, lengths, greedy-lengths: AR 1, a speculative cell 1.5
    batched = (1 + 6 * 1.5) + (1 + 22 * 1.5) + 2 * 1.5 + 4 * 1.5
    b1 = 0.05 * 210  # an answer at batch 1
    r3, r5 = (1.3 + 3 * 0.39) / 3.0, (1.5 + 5 * 0.39) / 3.0
    timing = 4 * b1 * ((6 * r3 + 1) + (22 * r3 + 4) + (2 * r5 + 1) + (4 * r5 + 1))  # AR once per 6 cells, a turn
    est = presets.estimate(10, costs=c)
    assert est["total"] == pytest.approx(4 * c.overhead_s + 10 * batched * c.sample_s + timing)
    assert presets.estimate(10, repeats=2, costs=c)["greedy"] == est["greedy"]  # greedy never repeats
    assert presets.estimate(10, repeats=2, costs=c)["sampled"] > est["sampled"]


def test_fit_problems_is_the_most_that_fits():
    problems, repeats = presets.fit_problems()
    assert (problems, repeats) == (50, 1)  # at the measured costs (Costs' defaults)
    assert presets.estimate(50)["total"] <= presets.BUDGET_S < presets.estimate(51)["total"]
    fast = presets.Costs(batch_ar_s_per_token=0.001)
    problems, repeats = presets.fit_problems(costs=fast)
    assert problems == 164 and repeats > 1
    assert presets.estimate(164, repeats, fast)["total"] <= presets.BUDGET_S < \
        presets.estimate(164, repeats + 1, fast)["total"]
    with pytest.raises(ValueError, match="not even one problem fits"):
        presets.fit_problems(budget_s=60.0)


def test_stage_configs_take_flags_over_the_preset():
    configs = dict(presets.stage_configs({"verifiers": ["verifier"], "limit": 2, "repeats": 3}))
    assert list(configs) == ["greedy", "sampled", "lengths", "greedy-lengths"]
    for name, config in configs.items():
        config.validate()
        assert config.verifiers == ["verifier"] and config.drafters == ["qwen2.5-coder-0.5b"]
        assert config.tasks == ["humaneval-instruct"] and config.limit == 2 and config.looks == 1
        assert config.max_new_tokens == 512 and config.speed_prompts == 4 and config.workers == 1
    assert configs["greedy"].temperature == 0 and configs["greedy"].repeats == 1
    assert configs["sampled"].temperature == 0.7 and configs["sampled"].top_p == 0.95 and configs["sampled"].repeats == 3
    assert configs["sampled"].batch_size == 6
    text = presets.describe(presets.stage_configs({}))
    assert "36 cells on the first 50 of 164 problems" in text and "3.0 h" in text


def _bench(out, *extra):
    return [sys.executable, "-m", "relaxspec", "bench", "--preset", "qwen-coder", "--verifier", "verifier",
            "--drafter", "drafter-weak", "--limit", "2", "--max-new-tokens", "12", "--workers", "1", "--no-plots",
            "--no-progress", "--out", str(out), *extra]


def _rows(out):
    with sqlite3.connect(Path(out) / "results.sqlite") as db:
        return sorted(db.execute("SELECT cell_key, prompt_index, repeat, response, utility, tokens, token_hash "
                                 "FROM rows").fetchall())


def _stored_cells(out):
    path = Path(out) / "results.sqlite"
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(path, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_interrupted_run_resumes_to_the_same_rows(tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC}
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run = subprocess.run(_bench(whole), capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "36 cells on the first 2 of 164 problems" in run.stdout
    assert f"(greedy, T=0, {os.cpu_count()} threads)" in run.stderr  # every core unless --threads says otherwise
    want = _rows(whole)
    assert len(want) == 36 * 2

    proc = subprocess.Popen(_bench(resumed), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 600
    while _stored_cells(resumed) < 8 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "re-run the same command to resume" in err
    part = _rows(resumed)
    assert 0 < len(part) < len(want)
    again = subprocess.run(_bench(resumed), capture_output=True, text=True, env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "skipped" in again.stdout
    assert _rows(resumed) == want

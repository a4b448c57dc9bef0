"""bench --preset qwen-coder: its grid, its priced time, and a resumed run that stores what an uninterrupted one does."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from relaxspec.bench import presets
from relaxspec.bench.names import AR, AUTO

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_grid_stages_and_cells():
    cells = presets.grid()
    assert {k: len(v) for k, v in cells.items()} == {"greedy": 9, "sampled": 27, "lengths": 2, "greedy-lengths": 4}
    assert sum(m == AR for v in cells.values() for m, _, _ in v) == 2  # greedy's and sampled's; lengths share them
    greedy = {m for m, _, _ in cells["greedy"]}
    assert greedy == {AR, "strict", "topk-delta", "topk-ratio", "spec-casc-tok", "ensemble", "spec-casc-opt", "fly",
                      "regret-budget"}
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
    assert replace(c, batch_answer_s=10.3).sample_s == 10.3  # measured on the task: the per-token product set aside
    assert c.ratio(AR, 0, "ngram") == 1.0 == c.batch_ratio(AR)
    assert c.batch_ratio("strict") == 1.5 == c.batch_ratio("strict", "qwen2.5-coder-0.5b")
    assert c.batch_ratio("strict", "ngram") == c.batch_ratio("strict", "ngram:n=2") == pytest.approx((3 + 1) / 1.6)
    assert c.ratio("strict", 3, "ngram") == pytest.approx((1.3 + 3 * 0.003) / 1.6)
    assert c.ratio("strict", 3, "qwen2.5-coder-0.5b") == pytest.approx((1.3 + 3 * 0.39) / 3.0)
    assert c.ratio("strict", AUTO, "ngram") == c.ratio("strict", 5, "ngram")
    # greedy, sampled, lengths, greedy-lengths: AR 1, a speculative cell 1.5
    batched = (1 + 8 * 1.5) + (1 + 26 * 1.5) + 2 * 1.5 + 4 * 1.5
    b1 = 0.05 * 210  # an answer at batch 1
    r3, r5 = (1.3 + 3 * 0.39) / 3.0, (1.5 + 5 * 0.39) / 3.0
    timing = 4 * b1 * ((8 * r3 + 2) + (26 * r3 + 5) + (2 * r5 + 1) + (4 * r5 + 1))  # AR once per 6 cells, a turn
    est = presets.estimate(10, costs=c)
    assert est["total"] == pytest.approx(4 * c.overhead_s + 10 * batched * c.sample_s + timing)
    assert presets.estimate(10, repeats=2, costs=c)["greedy"] == est["greedy"]  # greedy never repeats
    assert presets.estimate(10, repeats=2, costs=c)["sampled"] > est["sampled"]
    # prompt lookup's cells at its own batched cost (the protocol's price uses the same)
    ngram = presets.estimate(10, costs=c, drafter="ngram")
    timing = sum(presets.timing_s(cells, c, "ngram") for cells in presets.grid("ngram").values())
    assert ngram["total"] == pytest.approx(4 * c.overhead_s + 10 * (2 + 40 * 2.5) * c.sample_s + timing)


def test_fit_problems_is_the_most_that_fits():
    problems, repeats = presets.fit_problems()
    assert (problems, repeats) == (42, 1)  # at the measured costs (Costs' defaults)
    assert presets.estimate(42)["total"] <= presets.BUDGET_S < presets.estimate(43)["total"]
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
    assert "42 cells on the first 42 of 164 problems" in text and "3.0 h" in text


def _bench(out, speed_prompts=1):
    # one prompt timed at batch 1 per cell, not the preset's 4: the timing path runs (new cells only on a resume),
    # at a quarter of its cost (4 prompts: ~40% of a run of the tiny pair); float32, not the preset's int4: the
    # tiny pair's 128-wide matrices run 10x slower through the int4 block kernel (its OpenMP calls dominate), and
    # what is tested here (stages, the store, interruption) does not depend on the weight format
    return [sys.executable, "-m", "relaxspec", "bench", "--preset", "qwen-coder", "--verifier", "verifier",
            "--drafter", "drafter-weak", "--limit", "1", "--max-new-tokens", "12", "--workers", "1", "--no-plots",
            "--speed-prompts", str(speed_prompts), "--dtype", "float32", "--no-progress", "--out", str(out)]


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


def _signalled(out, cells: int, signum) -> tuple[int, str]:
    """A small preset run into `out` sent `signum` once it has stored `cells` cells: (its exit code, its stderr)."""
    proc = subprocess.Popen(_bench(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC})
    deadline = time.time() + 600
    while _stored_cells(out) < cells and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def test_interrupted_run_resumes_to_the_same_rows(tmp_path):
    """SIGTERM mid-stage: exit 143 with bench's 'interrupted' line (before: killed, the shell's bare 'Terminated');
    the same command then stores what an uninterrupted run does."""
    env = {**os.environ, "PYTHONPATH": SRC}
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    # (no batch-1 timing in the whole run: it is not in the cells' keys nor in their rows)
    run = subprocess.run(_bench(whole, speed_prompts=0), capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "42 cells on the first 1 of 164 problems" in run.stdout
    assert f"(greedy, T=0, {os.cpu_count()} threads)" in run.stderr  # every core unless --threads says otherwise
    want = _rows(whole)
    assert len(want) == 42

    code, err = _signalled(resumed, 8, signal.SIGTERM)
    assert code == 143, err[-2000:]
    assert f"bench: interrupted; finished cells are stored in {resumed / 'results.sqlite'}; re-run the same command " \
           "to resume" in err and "Traceback" not in err
    part = _rows(resumed)
    assert 0 < len(part) < len(want)
    again = subprocess.run(_bench(resumed), capture_output=True, text=True, env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "skipped" in again.stdout
    assert _rows(resumed) == want


def test_ctrl_c_and_sigterm_say_how_to_resume_with_the_shells_codes(capsys, tmp_path):
    """The line and exit status of an interrupted bench (the preset's stages included): Ctrl-C (KeyboardInterrupt)
    130, SIGTERM (Terminated, once on_sigterm ran) 143; a real signal: test_interrupted_run_resumes_to_the_same_rows."""
    from relaxspec.cli.options import Terminated, interrupted
    assert interrupted("bench", "finished cells are", tmp_path, KeyboardInterrupt()) == 130
    assert interrupted("bench", "finished cells are", tmp_path, Terminated()) == 143
    line = f"\nbench: interrupted; finished cells are stored in {tmp_path / 'results.sqlite'}; re-run the same " \
           "command to resume\n"
    assert capsys.readouterr().err == line * 2


# ------------------------------------------------------------------ its flags, checked before any model loads


def _refused(capsys, *args) -> str:
    """In-process main(): exit 2 and one 'relaxspec: error:' line, returned."""
    from relaxspec.cli import main
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("relaxspec: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("flag", [["--temperature", "0.3"], ["--top-p", "0.9"], ["--top-k", "20"],
                                  ["--sampling", "paper"], ["--tasks", "arithmetic"], ["--methods", "strict"],
                                  ["--draft-lengths", "4"]])
def test_flags_the_stages_fix_are_refused(capsys, tmp_path, monkeypatch, flag):
    """--sampling was dropped, --temperature replaced every stage's (the greedy stages sampled), --tasks ran the
    stages on another task priced as HumanEval on the Qwen pair: each is refused, naming the flag."""
    monkeypatch.setenv("RELAXSPEC_CACHE", str(tmp_path / "cache"))  # (before: the run went on to the models)
    err = _refused(capsys, "bench", "--preset", "qwen-coder", *flag, "--out", tmp_path / "b")
    assert f"bench --preset qwen-coder fixes {flag[0]} itself" in err and "plain `relaxspec bench`" in err
    err = _refused(capsys, "bench", "--preset", "qwen-coder", "--sampling", "paper", "--temperature", "0.5",
                   "--out", tmp_path / "b")
    assert "fixes --temperature, --sampling itself" in err and "drop them" in err


def test_a_limit_past_humaneval_is_capped_with_a_line():
    with pytest.warns(UserWarning, match="--limit 500 is more than humaneval-instruct's 164 problems; running all 164"):
        configs = presets.stage_configs({"limit": 500})
    assert {c.limit for _, c in configs} == {164}
    assert "on the first 164 of 164 problems" in presets.describe(configs)


def test_only_the_pair_it_measured_is_priced():
    qwen = presets.describe(presets.stage_configs({}))
    assert "about 3.0 h in all" in qwen and "verifier qwen2.5-coder-1.5b, drafter qwen2.5-coder-0.5b" in qwen
    assert "h in all" in presets.describe(presets.stage_configs({"drafters": ["ngram"]}))
    for other in ({"verifiers": ["verifier"], "drafters": ["drafter-weak"]}, {"dtype": "float32"}):
        text = presets.describe(presets.stage_configs(other))
        assert "time not estimated: the preset's costs are qwen2.5-coder-1.5b's in int4" in text, text
        assert "min" not in text and "h in all" not in text


def test_every_missing_model_is_named_with_one_fetch(capsys, tmp_path, monkeypatch):
    """An empty cache: both models and one command fetching both (before: the 1.5B alone, at its load)."""
    monkeypatch.setenv("RELAXSPEC_CACHE", str(tmp_path / "cache"))
    err = _refused(capsys, "bench", "--preset", "qwen-coder", "--out", tmp_path / "b")
    assert f"not in the model cache ({tmp_path / 'cache' / 'models'}): qwen2.5-coder-1.5b (" in err
    assert "qwen2.5-coder-0.5b (" in err
    assert err.rstrip().endswith("run `relaxspec models fetch qwen2.5-coder-1.5b qwen2.5-coder-0.5b`")
    err = _refused(capsys, "bench", "--verifier", "qwen2.5-coder-1.5b", "--drafter", "qwen2.5-coder-0.5b,drafter-weak",
                   "--out", tmp_path / "b")  # a plain bench too
    assert err.rstrip().endswith("run `relaxspec models fetch qwen2.5-coder-1.5b qwen2.5-coder-0.5b`")

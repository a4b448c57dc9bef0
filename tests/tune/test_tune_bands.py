"""tune's search and held-out bands scale to a task smaller than 240 + 240 prompts (HumanEval's 164); tune with
prompt lookup as the drafter searches every rule it can serve."""

import json

import pytest

from relaxspec.tune.run import TuneConfig, prompt_bands, run_tune


def test_prompt_bands():
    assert prompt_bands(None, None, None) == (240, 240)  # a synthetic task: the defaults
    assert prompt_bands(1000, None, None) == (240, 240)
    assert prompt_bands(164, None, None) == (82, 82)
    assert prompt_bands(9, None, None) == (5, 4)
    assert prompt_bands(164, 100, None) == (100, 64) and prompt_bands(164, None, 40) == (124, 40)
    assert prompt_bands(164, 50, 60) == (50, 60)
    with pytest.raises(ValueError, match="has 164 prompts; it cannot hold 100 search \\+ 100 held-out"):
        prompt_bands(164, 100, 100)
    with pytest.raises(ValueError, match="cannot hold"):
        prompt_bands(1, None, None)


def test_the_default_held_out_band_is_the_one_bench_looks_skip():
    from relaxspec.bench import BenchConfig
    from relaxspec.tune.run import DEFAULT_HELDOUT_PROMPTS
    assert BenchConfig().heldout_band == DEFAULT_HELDOUT_PROMPTS == prompt_bands(None, None, None)[1]


def test_tune_on_a_small_task_splits_it(tmp_path):
    """8 prompts, no band given: 4 searched, the other 4 confirm; the held-out rows are exactly those prompts."""
    import torch
    torch.set_num_threads(1)
    data = tmp_path / "small.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} plus {a + 1}?", "answer": str(2 * a + 1)}) + "\n"
                            for a in range(8)))
    out = tmp_path / "tune"
    config = TuneConfig(task=f"jsonl:{data}", methods=["cactus:delta=10"], draft_lengths=[2], sizes=(2, 4), caps=(2,),
                        max_new_tokens=16, budget_minutes=30.0, out=str(out))
    result = run_tune(config, progress=False)
    assert (config.search_prompts, config.heldout_prompts) == (4, 4)
    from relaxspec.bench.store import Store
    search, heldout = set(), set()
    with Store.open_existing(out) as store:
        for cell in store.cells():
            (heldout if "prompts" in cell.config else search).update(r.prompt for r in store.rows(cell.key))
    prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines()]
    assert search == set(prompts[:4]) and heldout == set(prompts[4:])
    assert result.confirm_samples > 0


def test_tune_accepts_humaneval_instruct_and_refuses_too_wide_bands(tmp_path, forker):  # (forker: src first)
    out = tmp_path / "tune"
    run = forker.run(["-m", "relaxspec", "tune", "--task", "humaneval-instruct", "--max-drop", "0.03",
                      "--search-prompts", "100", "--heldout-prompts", "100", "--no-progress"], cwd=tmp_path, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "has 164 prompts; it needs 100 search + 100 held-out" in run.stderr
    tiny = forker.run(["-m", "relaxspec", "tune", "--task", "humaneval-instruct", "--max-drop", "0.03",
                       "--search-prompts", "2", "--heldout-prompts", "2", "--rungs", "1,2", "--caps", "1", "--drafter",
                       "ngram", "--draft-lengths", "2", "--max-new-tokens", "16", "--no-progress", "--no-plots",
                       "--out", out], cwd=tmp_path, timeout=600)
    assert tiny.returncode == 0, tiny.stderr
    assert "confirmation on 2 held-out samples" in tiny.stdout
    # every rule searched but those prompt lookup's one-hot q cannot serve, said once
    left_out = next(line for line in tiny.stderr.splitlines() if "left out: the drafter 'ngram'" in line)
    assert all(rule in left_out for rule in ("ensemble", "spec-casc-opt", "spec-cont-dec"))
    assert "cactus" not in left_out.split("left out")[0]

"""Every script under benchmarks/ still runs: each with tiny arguments, in a process of its own, to its end (exit 0
and a line of its table); the Python scripts' processes are forked from one that imported torch and transformers
once (tests/forked.py: ~3 s a script less). Their figures are not checked here (speed goals live in the scripts, not
in tests); a script that no longer runs is. (gpu_train_drafters.sh failed in its first second, and exited 0, after a
stricter argument check elsewhere: scripts outside the suite rot silently.) The SmolLM2 ones (real_pair,
smollm2_drafter, cpu_peer's full run) take minutes and are left to their own runs; `compile_speed` compiles for
minutes (its --help is checked); rules_against and tune_vs_grid need another tree or a bench's output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RUNS = {  # script: (tiny arguments, a line its output must hold)
    "b1_repeat": (["--prompts", "2", "--repeats", "1"], "S_blk"),
    "batch_throughput": (["--model", "verifier", "--dtype", "float32", "--task", "arithmetic", "--batch", "3",
                          "--max-new-tokens", "8", "--rows", "1", "2", "--context", "16", "--repeats", "2",
                          "--threads", "1"], "| GMAC/s |"),
    "compile_speed": (["--help"], "--modes"),
    "cpu_peer": (["--quick", "--no-progress"], "strict runs differ from AR"),
    "default_job_b1": (["--prompts", "2", "--draft-lengths", "3", "--pad"], "pad"),
    "drafter_kinds": (["--n", "4", "--draft-length", "3"], "ngram"),
    "dynamic_n": (["--pairs", "builtin", "--prompts", "2", "--max-new-tokens", "24", "--draft-lengths", "3",
                   "--confidences", "0.5", "--temperatures", "0"], "N=auto"),
    "engine_profile": (["--prompts", "2", "--max-new-tokens", "24", "--draft-lengths", "3", "--top", "5"], "ms/round"),
    "engine_speed": (["--prompts", "2", "--max-new-tokens", "24", "--draft-lengths", "3", "--repeats", "1",
                      "--batch", "4"], "x"),
    "task_baselines": (["--model", "verifier", "--limit", "2", "--max-new-tokens", "12", "--threads", "1",
                             "--skip-llama", "--out", "/dev/null", "--no-progress"], "| relaxspec |"),
    "int4_block_speed": (["--threads", "1", "--rows", "1", "4", "--rounds", "3"], "|"),
    "interval_coverage": (["--sims", "20"], "utility"),
    "loop_only": (["--prompts", "2", "--max-new-tokens", "24"], "us per round"),
    "model_speed": (["--model", "verifier", "--threads", "1", "--dtypes", "float32", "--repeats", "3", "--turns", "2"],
                    "float32"),
    "mtp_agreement": (["--verifier", "verifier", "--drafter", "drafter-mtp", "--task", "arithmetic", "--n", "3",
                       "--max-new-tokens", "24", "--depths", "2"], "arithmetic d1"),
    "phase_steps": (["--prompts", "2", "--repeats", "1", "--max-new-tokens", "24"], "timings not the point"),
    "prefill_head": (["--models", "verifier", "--lengths", "40"], "verifier"),
    "real_pair_memory": (["--verifier", "verifier", "--drafter", "drafter-weak", "--formats", "int4", "--loads",
                          "pair"], "| pair | "),  # (a fresh process a cell: the pair's loads both models)
    "real_pair_fidelity": (["--model", "verifier", "--formats", "float32", "int4", "--prompts", "2",
                            "--max-new-tokens", "12", "--threads", "1", "--no-progress"], "KL(ref || ours)"),
    "real_pair_peer": (["--verifier", "verifier", "--drafter", "drafter-weak", "--formats", "int4", "--threads", "1",
                        "--draft-lengths", "3", "--code-prompts", "1", "--chat-prompts", "1", "--max-new-tokens", "12",
                        "--rounds", "3", "--no-progress"], "strict runs differ from AR"),
    "ray_overhead": (["--jobs", "4"], "per job"),
    "round_identity": (["--quick", "--out", "/dev/null"], "settings in"),
    "preset_costs": (["--verifier", "verifier", "--drafter", "drafter-weak", "--dtype", "float32", "--batch", "2",
                      "--b1-prompts", "1", "--max-new-tokens", "8", "--threads", "1"], "| strict N=3, T=0.7 |"),
    "start_time": (["--verifier", "verifier", "--drafter", "drafter-weak", "--dtype", "float32", "--max-new-tokens",
                    "4", "--calls", "1"], " | - | "),  # (a fresh process a call; "-": its cache column, no failure)
    "round_ops": (["--prompts", "2", "--max-new-tokens", "24", "--top", "3"], "ops per round outside the forwards"),
    "round_parts": (["--prompts", "2", "--cells", "strict:3", "pad:3"], "x b1 / S_blk"),
    "sampler_speed": (["--vocab", "714", "--rows", "1", "--calls", "20", "--rounds", "3"], "714"),
    "verify_memory": (["--rules", "pad", "--batch", "3", "--drafts", "2", "--vocab", "50", "--blocks", "2", "--threads",
                       "1", "--temperatures", "0", "0.7"], "| pad | 0.7 | 0."),  # (a fresh process a cell: pad's
    # pivot input, the drafts greedy and sampled; "0.", the resident GB: the cell ran, not "failed: ...")
    "verify_speed": (["--batch", "2", "--drafts", "3", "--vocab", "100", "--repeats", "5", "--warmup", "2"], "pad"),
    "verify_step": (["--rules", "strict", "pad", "--drafts", "3", "--repeats", "20"], "pad"),
}
LEFT_OUT = {"real_pair", "smollm2_drafter", "rules_against", "tune_vs_grid",  # (see the module docstring)
            "humaneval_ties",  # (reads a results file: its own test below)
            "file_format"}  # (needs a qwen2 GGUF file: tests/models/test_gguf_file_format.py runs it on a small one)


def _run(command: list[str], env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_every_benchmark_script_is_listed():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    assert scripts == set(RUNS) | LEFT_OUT, scripts ^ (set(RUNS) | LEFT_OUT)


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_runs(script, forker):
    args, expected = RUNS[script]
    done = forker.run([f"benchmarks/{script}.py", *args], cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout, done.stdout[-2000:]


def test_the_drafter_training_recipe_runs(tmp_path):
    """benchmarks/gpu_train_drafters.sh at its small scale on the CPU, one built-in head: it trains and packs it, and
    an unknown head is refused before any work."""
    env = {"SCALE": "small", "DEVICE": "cpu", "HEADS": "mtp-b", "WORK": str(tmp_path / "work"), "PYTHON": sys.executable}
    done = _run(["bash", "benchmarks/gpu_train_drafters.sh", str(tmp_path / "out")], env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.tar")) == ["mtp-b.tar"]
    bad = _run(["bash", "benchmarks/gpu_train_drafters.sh", str(tmp_path / "out")], {**env, "HEADS": "mtp-z"})
    assert bad.returncode == 2 and "unknown head mtp-z" in bad.stderr


def test_humaneval_ties_runs_on_a_results_file(tmp_path, forker):
    # Two answers of the built-in verifier to HumanEval/0 that part at their third token: each format's lean there.
    import json
    results = tmp_path / "he.jsonl"
    results.write_text("".join(json.dumps({"system": system, "task_id": "HumanEval/0", "token_ids": ids,
                                           "passed": passed}) + "\n"
                               for system, ids, passed in (("relaxspec", [5, 6, 7, 8], False),
                                                           ("llama.cpp", [5, 6, 9], True))))
    done = forker.run(["benchmarks/humaneval_ties.py", "--results", str(results), "--model", "verifier", "--dtypes",
                       "float32", "int4", "--threads", "1", "--skip-llama"], cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| HumanEval/0 | 2 |" in done.stdout and "| False / True |" in done.stdout, done.stdout
    assert "int4: leans to our token at" in done.stdout and "as float32 does at" in done.stdout, done.stdout

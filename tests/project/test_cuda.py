"""CUDA checks (run by benchmarks/gpu_check.sh on a CUDA machine; skipped where there is no CUDA device)."""

import pytest
import torch

from relaxspec.cli import main
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.tasks import synthetic

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = synthetic.synthetic_task("arithmetic", "test", 4).prompts


def test_defaults_on_cuda_are_bfloat16_through_transformers(monkeypatch):
    monkeypatch.delenv("RELAXSPEC_DEVICE", raising=False)
    monkeypatch.delenv("RELAXSPEC_DTYPE", raising=False)
    lm = load_model("verifier")
    assert (lm.device.type, lm.dtype, lm.backend) == ("cuda", torch.bfloat16, "transformers")


def test_strict_greedy_equals_ar_greedy_on_cuda_in_float32():
    verifier = load_model("verifier", device="cuda", dtype="float32")
    drafter = load_model("drafter-weak", device="cuda", dtype="float32")
    ar = generate(verifier, None, PROMPTS, method="ar", max_new_tokens=48)
    strict = generate(verifier, drafter, PROMPTS, method="strict", draft_length=4, max_new_tokens=48)
    assert [r.token_ids for r in strict.results] == [r.token_ids for r in ar.results]


def test_cuda_results_match_cpu_in_float32():
    cpu = generate(load_model("verifier", device="cpu"), None, PROMPTS, method="ar", max_new_tokens=32)
    gpu = generate(load_model("verifier", device="cuda", dtype="float32"), None, PROMPTS, method="ar",
                   max_new_tokens=32)
    same = sum(a.token_ids == b.token_ids for a, b in zip(cpu.results, gpu.results))
    assert same >= len(PROMPTS) - 1  # float32 kernels differ slightly between devices; near-ties may flip one


def test_fast_path_on_cuda_matches_transformers():
    fast = load_model("verifier", device="cuda", dtype="float32", backend="fast")
    slow = load_model("verifier", device="cuda", dtype="float32", backend="transformers")
    ids = torch.tensor([fast.tokenizer(PROMPTS[0])["input_ids"]], device="cuda")
    mask, pos = torch.ones_like(ids), torch.arange(ids.shape[1], device="cuda")[None]
    a, ha = fast.forward(ids, fast.new_cache(), mask, pos, hidden_layer=2)
    b, hb = slow.forward(ids, slow.new_cache(), mask, pos, hidden_layer=2)
    assert a.device.type == "cuda" and a.dtype == torch.float32
    assert torch.allclose(a, b, atol=1e-3) and torch.allclose(ha, hb, atol=1e-3)


@pytest.mark.parametrize("method, params", [("strict", {}), ("cactus", {"delta": 0.25}), ("spec-cont-dec", {}),
                                            ("mentored", {"alpha": 0.7})])
def test_rules_sample_end_to_end_in_bfloat16_on_cuda(method, params):
    verifier = load_model("verifier", device="cuda", dtype="bfloat16")
    drafter = load_model("drafter-weak", device="cuda", dtype="bfloat16")
    out = generate(verifier, drafter, PROMPTS, method=method, draft_length=4, max_new_tokens=40, temperature=0.7,
                   **params)
    assert all(len(r.token_ids) > 5 for r in out.results)
    assert 0 < out.stats.acceptance_rate <= 1


def test_pad_and_cli_on_cuda(capsys):
    assert main(["generate", "--prompt", PROMPTS[0], "--method", "pad", "--device", "cuda", "--dtype", "float32",
                 "--max-new-tokens", "24"]) == 0
    assert capsys.readouterr().out.strip()


def test_smollm2_answers_on_cuda_in_bfloat16():
    lm = load_model("smollm2", device="cuda", dtype="bfloat16")
    out = generate(lm, None, ["What is the capital of France? Answer in one sentence."], method="ar",
                   max_new_tokens=20, chat_template="auto")
    assert "Paris" in out.results[0].text

from pathlib import Path

import torch

from conftest import benchmark_module

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mtp_agreement.py"


def test_the_trained_head_agrees_with_the_verifier_and_an_untrained_one_does_not():
    from relaxspec.models import load_model
    from relaxspec.drafters import load_drafter
    from relaxspec.drafters.mtp import HeadConfig, MTPDrafter, MTPHead

    m = benchmark_module("mtp_agreement")
    verifier = load_model("verifier")
    prompts = m.held_out_prompts("arithmetic", 3)
    trained = m.agreement(verifier, load_drafter("drafter-mtp", verifier), prompts, 40, depths=2)
    torch.manual_seed(0)
    untrained = MTPDrafter(MTPHead(HeadConfig(hidden=verifier.model.config.hidden_size)), verifier)
    fresh = m.agreement(verifier, untrained, prompts, 40, depths=2)
    assert len(trained) == 2 and all(0.0 <= r <= 1.0 for r in trained + fresh)
    assert trained[0] > 0.6 and fresh[0] < 0.3, (trained, fresh)


def test_the_script_refuses_a_drafter_that_is_not_a_head(forker):
    out = forker.run([SCRIPT, "--drafter", "drafter-weak", "--n", "1"], cwd=SCRIPT.parents[1], timeout=120)
    assert out.returncode == 2 and "not an MTP head" in out.stderr and "Traceback" not in out.stderr

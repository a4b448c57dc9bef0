"""The models the package ships: within the size the project allows, and the Qwen2.5-Coder-1.5B head named for the
registry's pinned file (its drafting on the real pair: `pytest -m real_pair tests/models/test_shipped_models.py`)."""

import json
from pathlib import Path

import pytest

import relaxspec
from relaxspec.models import registry
from relaxspec.models.family import BUILTIN_HEADS, head_directory

PACKAGE = Path(relaxspec.__file__).parent
SHIPPED_LIMIT = 25_000_000  # bytes of every trained model the package carries, together
HEAD, VERIFIER = "qwen2.5-coder-1.5b-head", "qwen2.5-coder-1.5b"


def test_the_shipped_models_fit_in_25_mb_together():
    files = [p for d in ("models/builtin", "pivot/builtin") for p in (PACKAGE / d).rglob("*") if p.is_file()]
    sizes = {str(p.relative_to(PACKAGE)): p.stat().st_size for p in files}
    assert any(name.endswith(f"{HEAD}/model.safetensors") for name in sizes)
    assert sum(sizes.values()) <= SHIPPED_LIMIT, sorted(sizes.items(), key=lambda kv: -kv[1])[:4]


def test_the_15b_head_is_a_builtin_head_named_for_the_registrys_file():
    assert HEAD in BUILTIN_HEADS
    config = json.loads((head_directory(HEAD) / "config.json").read_text())
    entry = registry.REGISTRY[VERIFIER]
    assert config["relaxspec_kind"] == "mtp" and config["dtype"] == "int4"
    assert config["verifier"]["name"] == VERIFIER and config["verifier"]["file"] == "gguf-" + entry.sha256[:16]
    assert config["draft_vocab"] and config["hidden"] == 1536  # a truncated head over the 1.5B's hidden states
    assert (head_directory(HEAD) / "model.safetensors").stat().st_size < 15_000_000


@pytest.mark.real_pair
def test_the_shipped_head_drafts_losslessly_for_the_15b_in_its_formats_and_is_refused_by_the_05b():
    from relaxspec.drafters import load_drafter
    from relaxspec.engine import generate
    from relaxspec.models import load_model

    prompt = "Write a Python function that returns the n-th Fibonacci number."
    for dtype in ("int4", "file"):
        verifier = load_model(VERIFIER, dtype=dtype)
        drafter = load_drafter(HEAD, verifier)
        ar = generate(verifier, None, [prompt], method="ar", max_new_tokens=48)
        strict = generate(verifier, drafter, [prompt], method="strict", draft_length=4, max_new_tokens=48)
        assert strict.results[0].token_ids == ar.results[0].token_ids
        # it drafts the verifier's answer: tau 1.85 at N = 4 in int4 (2026-12-07); an untrained head accepts ~none
        assert strict.stats.drafts_accepted > 0.5 * strict.stats.sequence_rounds, strict.stats
        del verifier, drafter
    with pytest.raises(ValueError, match="was trained for verifier 'qwen2.5-coder-1.5b'"):
        load_drafter(HEAD, load_model("qwen2.5-coder-0.5b", dtype="int4"))

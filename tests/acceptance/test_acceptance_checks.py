"""The verify step's input checks (acceptance/checks.py) as a caller meets them: draft_probs that are not
distributions, tensors on the meta device (one line each, never a traceback from inside the step)."""

import pytest
import torch

from relaxspec.acceptance import process_logits, verify


@pytest.mark.parametrize("bad", ["nan", "negative", "zero"])
def test_verify_refuses_draft_probs_that_are_not_distributions(bad):
    g = torch.Generator().manual_seed(0)
    t, d = torch.randn(2, 3, 5, generator=g), torch.randn(2, 2, 5, generator=g)
    x = torch.randint(0, 5, (2, 2), generator=g)
    q = process_logits(d, temperature=0.7)
    q[0, 1] = {"nan": float("nan"), "negative": -0.1, "zero": 0.0}[bad]
    for temperature in (0.7, 0.0):  # the sampled and the greedy path
        with pytest.raises(ValueError, match="draft_probs must be"):
            verify("strict", t, d, x, draft_probs=q, temperature=temperature)


@pytest.mark.parametrize("on_meta", ["target_logits", "draft_logits", "draft_tokens", "draft_probs"])
def test_verify_on_meta_tensors_is_one_line(on_meta):
    """RuntimeError: Tensor.item() cannot be called on meta tensors before."""
    g = torch.Generator().manual_seed(0)
    block = {"target_logits": torch.randn(1, 3, 5, generator=g), "draft_logits": torch.randn(1, 2, 5, generator=g),
             "draft_tokens": torch.zeros(1, 2, dtype=torch.long)}
    block["draft_probs"] = process_logits(block["draft_logits"], temperature=0.7)
    every = {name: value.to("meta") for name, value in block.items()}
    for tensors in ({**block, on_meta: block[on_meta].to("meta")}, every):
        with pytest.raises(ValueError, match=r"^\w+ is on the meta device: a shape without values, nothing to "):
            verify("strict", tensors["target_logits"], tensors["draft_logits"], tensors["draft_tokens"],
                   draft_probs=tensors["draft_probs"], temperature=0.7)

"""generate's and verify's arguments of the wrong kind: a model's name and a generator of prompts are taken, bytes
and a generator that is not torch's are refused."""

import pytest
import torch

from relaxspec.acceptance import verify
from relaxspec.engine import generate

PROMPT = "Question: 12 + 7\nAnswer:"


def test_api_arguments_of_the_wrong_kind():
    out = generate("verifier", None, (p for p in [PROMPT]), method="ar", max_new_tokens=3)  # a name, a generator
    assert len(out.results) == 1 and len(out.results[0].token_ids) == 3
    with pytest.raises(ValueError, match="got bytes"):
        generate("verifier", None, PROMPT.encode(), method="ar", max_new_tokens=3)
    g = torch.Generator().manual_seed(0)
    t, d = torch.randn(1, 3, 5, generator=g), torch.randn(1, 2, 5, generator=g)
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        verify("strict", t, d, torch.zeros(1, 2, dtype=torch.long), temperature=0.7, generator=5)

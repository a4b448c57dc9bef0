"""A drafter from a name (`load_drafter`), or from what `generate` accepts (`as_drafter`): any kind, the MTP
head's included (drafters/mtp.py, which builds on base.py: so apart from it)."""

from __future__ import annotations

from pathlib import Path

from relaxspec.drafters.base import Drafter, LMDrafter, NgramDrafter, parse_ngram
from relaxspec.models.hf import CausalLM, load_model


def load_drafter(name: str | Path, verifier: CausalLM) -> Drafter:
    """A drafter for `verifier` from a name: 'ngram[:n=3][,min=1]' (prompt lookup), a trained MTP head (the
    built-in 'drafter-mtp' or 'smollm2-drafter', or a `relaxspec drafter train` directory: it must have been
    trained for this verifier), or a causal LM (built-in name or Hugging Face directory)."""
    from relaxspec.drafters import mtp

    text = str(name)
    if text == "ngram" or text.startswith("ngram:"):
        return NgramDrafter(verifier.vocab_size, name=text, **parse_ngram(text))
    if mtp.is_mtp(text):
        return mtp.load_mtp_drafter(text, verifier)
    return LMDrafter(load_model(name, device=verifier.device, dtype=verifier.weight_format,
                                compile=verifier.compiled))


def as_drafter(drafter, verifier: CausalLM) -> Drafter:
    """What `generate` accepts as a drafter: a Drafter, a CausalLM (wrapped) or a name."""
    if isinstance(drafter, Drafter):
        return drafter
    if isinstance(drafter, CausalLM):
        return LMDrafter(drafter)
    if isinstance(drafter, (str, Path)):
        return load_drafter(drafter, verifier)
    raise ValueError(f"drafter must be a Drafter, a CausalLM or a drafter name, got {type(drafter).__name__}")

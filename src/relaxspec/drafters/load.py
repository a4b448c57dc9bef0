"""A drafter from a name (`load_drafter`), or from what `generate` accepts (`as_drafter`): any kind, the MTP
head's included (drafters/mtp.py, which builds on base.py: so apart from it). `drafter_model`: the causal LM a
drafter argument drafts with, known before any model loads (generate loads it with the verifier, in one call)."""

from __future__ import annotations

from pathlib import Path

from relaxspec.drafters.base import Drafter, LMDrafter, NgramDrafter, parse_ngram
from relaxspec.models.family import is_mtp
from relaxspec.models.hf import CausalLM, load_beside


def _is_ngram(text: str) -> bool:
    return text == "ngram" or text.startswith("ngram:")


def drafter_class(name: str | Path) -> type[Drafter]:
    """The class of the drafter `load_drafter` builds from a name, known before any model loads."""
    from relaxspec.drafters import mtp

    text = str(name)
    return NgramDrafter if _is_ngram(text) else mtp.MTPDrafter if is_mtp(text) else LMDrafter


def load_drafter(name: str | Path, verifier: CausalLM) -> Drafter:
    """A drafter for `verifier` from a name: 'ngram[:n=3][,min=1]' (prompt lookup), a trained MTP head (the
    built-in 'drafter-mtp', 'smollm2-drafter' or 'qwen2.5-coder-1.5b-head', or a `relaxspec drafter train`
    directory: it must have been trained for this verifier), or a causal LM (built-in name or Hugging Face directory)."""
    from relaxspec.drafters import mtp

    text = str(name)
    if _is_ngram(text):
        return NgramDrafter(verifier.vocab_size, name=text, **parse_ngram(text))
    if is_mtp(text):
        return mtp.load_mtp_drafter(text, verifier)
    return LMDrafter(load_beside(name, verifier))


def drafter_model(drafter) -> CausalLM | str | Path | None:
    """The causal LM a drafter argument of `generate` drafts with, known before any model loads: an LM drafter's, a
    CausalLM, or the name of one (a name that is neither prompt lookup nor an MTP head); None for the other kinds."""
    if isinstance(drafter, Drafter):
        return getattr(drafter, "lm", None)
    if isinstance(drafter, CausalLM):
        return drafter
    if isinstance(drafter, (str, Path)) and not _is_ngram(str(drafter)) and not is_mtp(str(drafter)):
        return drafter
    return None


def as_drafter(drafter, verifier: CausalLM, lm: CausalLM | None = None) -> Drafter:
    """What `generate` accepts as a drafter: a Drafter, a CausalLM (wrapped) or a name; `lm`: the causal LM a name
    names, already loaded (`drafter_model`, then models.hf.load_inputs)."""
    if isinstance(drafter, Drafter):
        return drafter
    if isinstance(drafter, CausalLM):
        return LMDrafter(drafter)
    if isinstance(drafter, (str, Path)):
        return LMDrafter(lm) if lm is not None else load_drafter(drafter, verifier)
    raise ValueError(f"drafter must be a Drafter, a CausalLM or a drafter name, got {type(drafter).__name__}")

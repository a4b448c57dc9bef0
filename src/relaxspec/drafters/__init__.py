"""Drafters: what proposes the tokens a verifier checks. One protocol (`Drafter`), three kinds: a causal LM
(`LMDrafter`), prompt lookup (`NgramDrafter`) and an MTP head on the verifier's hidden states
(`relaxspec.drafters.mtp`); `load_drafter(name, verifier)` builds any of them from a name. `Drafting`: a drafter with
its drafting policy (how many tokens each row proposes: N, draft_length="auto", the confidence stop)."""

from relaxspec.drafters.base import (Drafter, LMDrafter, NgramDrafter, Proposal, draft_timer, measure_draft_latency,
                                     one_hot_logits, parse_ngram)
from relaxspec.drafters.load import as_drafter, drafter_class, drafter_model, load_drafter
from relaxspec.drafters.policy import AUTO_MAX, AUTO_START, Drafting

__all__ = ["Drafter", "Proposal", "LMDrafter", "NgramDrafter", "load_drafter", "drafter_class", "as_drafter",
           "drafter_model", "measure_draft_latency", "draft_timer", "one_hot_logits", "parse_ngram", "Drafting",
           "AUTO_START", "AUTO_MAX"]

"""Acceptance rules for speculative decoding: pure tensor math plus one shared verify step.

    from relaxspec.acceptance import verify, RULES
    res = verify("cactus", target_logits, draft_logits, draft_tokens, delta=0.25)

`RULES` maps each method name to its rule object (parameters with defaults,
valid ranges, strict setting and paper grid), in a stable order.
"""

from relaxspec.acceptance.base import (
    RULES,
    ParamSpec,
    Positions,
    Rule,
    Targets,
    TensorInput,
    VerifyContext,
    get_rule,
)

# Importing a rule module registers its rule in RULES (this order is the listing order).
from relaxspec.acceptance import (  # noqa: E402,F401
    strict,
    cactus,
    mentored,
    fuzzy,
    rfuzzy,
    spec_casc_opt,
    spec_casc_tok,
    ensemble,
    spec_cont_dec,
    typical,
    pad,
)
from relaxspec.acceptance.processing import entropy, jsd, process_logits, total_variation
from relaxspec.acceptance.random import Draws, SequenceSeeds, derive_seed
from relaxspec.acceptance.verify import VerifyResult, build_context, relaxed_targets, verify

__all__ = [
    "verify",
    "VerifyResult",
    "relaxed_targets",
    "RULES",
    "get_rule",
    "process_logits",
    "entropy",
    "jsd",
    "total_variation",
    "build_context",
    "ParamSpec",
    "TensorInput",
    "Rule",
    "Targets",
    "Positions",
    "VerifyContext",
    "Draws",
    "SequenceSeeds",
    "derive_seed",
]

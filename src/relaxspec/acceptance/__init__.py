"""Acceptance rules for speculative decoding: pure tensor math plus one shared verify step.

    from relaxspec.acceptance import verify, RULES
    res = verify("cactus", target_logits, draft_logits, draft_tokens, delta=0.25)

`RULES` maps each method name to its rule object (parameters with defaults,
valid ranges, strict setting and paper grid; what it needs from the engine:
`extra_draft_passes`, `reads_q`, `inputs`, `greedy_closed_form`; whether it is valid
with a one-hot q: `check_one_hot_q`), in a stable order.
"""

from relaxspec.acceptance.base import (
    RULES,
    ChoiceSpec,
    ParamSpec,
    Positions,
    Rule,
    Targets,
    StateSpec,
    TensorInput,
    VerifyContext,
    check_one_hot_q,
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
    threshold,
    topk_delta,
    topk_ratio,
    fly,
    regret_budget,
    pad,
)
from relaxspec.acceptance.processing import (
    GREEDY_TEMPERATURE,
    check_sampling_args,
    entropy,
    is_greedy,
    jsd,
    process_logits,
    process_logits_unchecked,
    total_variation,
)
from relaxspec.acceptance.random import DRAFT, TOKEN, Draws, SequenceSeeds, derive_seed
from relaxspec.acceptance.verify import GREEDY_MODES, VerifyResult, build_context, relaxed_targets, verify

__all__ = [
    "verify",
    "VerifyResult",
    "relaxed_targets",
    "RULES",
    "get_rule",
    "check_one_hot_q",
    "is_greedy",
    "GREEDY_TEMPERATURE",
    "GREEDY_MODES",
    "process_logits",
    "process_logits_unchecked",
    "entropy",
    "jsd",
    "total_variation",
    "build_context",
    "ParamSpec",
    "ChoiceSpec",
    "StateSpec",
    "TensorInput",
    "Rule",
    "Targets",
    "Positions",
    "VerifyContext",
    "Draws",
    "SequenceSeeds",
    "derive_seed",
    "DRAFT",
    "TOKEN",
    "check_sampling_args",
]

"""A generate call's arguments, checked: `Request.check` runs every check of `generate`'s arguments (each a
one-line ValueError), loads a verifier given by name, makes the drafter a Drafter, checks the rule's settings
once (its VerifyStep) and encodes the prompts into the models' context."""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass

from relaxspec.acceptance import Rule, check_sampling_args, derive_seed, get_rule
from relaxspec.acceptance.verify import VerifyStep
from relaxspec.drafters import AUTO_MAX, Drafter, as_drafter
from relaxspec.engine.phase import Phase, check_phase, parse_phase
from relaxspec.models.hf import CausalLM, hidden_blocks, load_model
from relaxspec.models.prompts import check_context, encode_prompts, prompt_list
from relaxspec.models.stream import model_device
from relaxspec.names import AR, AUTO


@dataclass
class Request:
    """A generate call's arguments once checked (`Request.check`), as the strategies read them."""

    verifier: CausalLM
    drafter: Drafter | None  # None for AR (which ignores the drafter argument)
    drafter_lm: CausalLM | None  # the drafter's own LM, whose context and compiled shapes count too
    prompts: list[str]
    encoded: list[list[int]]  # the prompts' token ids (chat template applied), each fitting the context
    max_new_tokens: int
    sampling: dict  # temperature, top_k, top_p
    seeds: list[int]  # one per sequence
    device: object
    rule: Rule | None = None  # None: AR
    step: VerifyStep | None = None  # the rule with its settings, checked once (each round runs the block unchecked)
    inputs: dict | None = None  # rule inputs given as values (a pivot_fn or a phase gives the others per round)
    draft_length: int = 0  # N: the most drafts of a round (auto's bound), at most max_new_tokens
    auto: bool = False  # draft_length="auto"
    draft_confidence: float | None = None
    pivot_fn: object = None
    phase: Phase | None = None
    hidden_layer: int | tuple[int, ...] | None = None  # the verifier layer(s) whose hidden states a round reads

    @classmethod
    def check(cls, verifier, drafter, prompts, method, draft_length, max_new_tokens, temperature, top_k, top_p, seed,
              pivot_fn, chat_template, system, phase, draft_confidence, rule_params) -> "Request":
        """generate's arguments checked in its order (the first error wins), as a Request."""
        check_sampling_args(temperature, top_k, top_p)
        draft_confidence = check_draft_confidence(draft_confidence)
        if isinstance(verifier, (str, os.PathLike)):  # a name or a path, as the drafter argument accepts
            verifier = load_model(verifier)
        phase = parse_phase(phase)
        if phase is not None:
            check_phase(phase, verifier.tokenizer)
        prompts = prompt_list(prompts)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        rule = None
        if method != AR:
            rule = get_rule(method)  # unknown method -> ValueError listing the known ones
            drafter = _check_speculative(verifier, drafter, rule, method, draft_length, pivot_fn, rule_params)
        elif rule_params:
            raise ValueError(f"method 'ar' takes no rule parameters, got {sorted(rule_params)}")
        elif pivot_fn is not None:
            raise ValueError("method 'ar' takes no pivot_fn")
        elif draft_confidence is not None:
            raise ValueError("method 'ar' drafts nothing: it takes no draft_confidence")
        hidden_layer = _hidden_layer(verifier, drafter, pivot_fn) if rule is not None else None
        seeds = _sequence_seeds(seed, len(prompts))
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        # (a rule input's values, e.g. PAD's pivot_prob, checked with the round's one copy to the host: `inputs_ok`)
        step = None if rule is None else VerifyStep(method, **sampling, defer_input_checks=True, **{
            name: value for name, value in rule_params.items() if name not in rule.inputs})
        inputs = {name: value for name, value in rule_params.items() if rule is not None and name in rule.inputs}
        drafter_lm = getattr(drafter, "lm", None)
        encoded = encode_prompts(verifier.tokenizer, prompts, chat_template=chat_template, system=system)
        encoded = check_context(encoded, max_new_tokens, verifier, drafter_lm)
        # A round never proposes more than the room left, so a longer draft could not be used: N is bounded by
        # max_new_tokens (and so are the per-position statistics, sized to N).
        N = 0 if rule is None else min(AUTO_MAX if draft_length == AUTO else draft_length, max_new_tokens)
        return cls(verifier=verifier, drafter=drafter if rule is not None else None, drafter_lm=drafter_lm,
                   prompts=prompts, encoded=encoded, max_new_tokens=max_new_tokens, sampling=sampling, seeds=seeds,
                   device=model_device(verifier), rule=rule, step=step, inputs=inputs, draft_length=N,
                   auto=rule is not None and draft_length == AUTO, draft_confidence=draft_confidence,
                   pivot_fn=pivot_fn, phase=phase, hidden_layer=hidden_layer)


def _check_speculative(verifier, drafter, rule, method, draft_length, pivot_fn, rule_params) -> Drafter:
    """The checks of a speculative method's arguments; its drafter as a Drafter."""
    if drafter is None:
        raise ValueError(f"method {method!r} needs a drafter (only 'ar' runs without one)")
    if draft_length != AUTO and (isinstance(draft_length, bool) or not isinstance(draft_length, numbers.Integral)
                                 or draft_length < 1):
        raise ValueError(f"draft_length must be an integer >= 1 or {AUTO!r}, got {draft_length!r}")
    drafter = as_drafter(drafter, verifier)
    drafter.check(verifier, rule)
    wants_pivot = "pivot_prob" in rule.inputs and "pivot_prob" not in rule_params
    if wants_pivot and pivot_fn is None:
        raise ValueError(f"method {method!r} needs a pivot classifier: pass pivot_fn= (see relaxspec.pivot)")
    if pivot_fn is not None and not wants_pivot:
        raise ValueError(f"pivot_fn is only used by methods that take a pivot_prob input, not {method!r}")
    return drafter


def check_draft_confidence(value) -> float | None:
    """draft_confidence: None (off) or a probability threshold in (0, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise ValueError(f"draft_confidence must be a probability in (0, 1] (or None: off), got {value!r}")
    return float(value)


def _sequence_seeds(seed, batch_size: int) -> list[int]:
    """One seed per sequence: derived from the call's seed and the prompt's index, or given."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return [derive_seed(int(seed), i) for i in range(batch_size)]
    if isinstance(seed, (list, tuple)) and all(isinstance(s, numbers.Integral) and not isinstance(s, bool)
                                                for s in seed):
        if len(seed) != batch_size:
            raise ValueError(f"seed: got {len(seed)} per-prompt seeds for {batch_size} prompts")
        return [int(s) for s in seed]
    raise ValueError(f"seed must be an integer or a list of one integer per prompt, got {seed!r}")


def _hidden_layer(verifier: CausalLM, drafter: Drafter | None, pivot_fn) -> int | tuple[int, ...] | None:
    """The verifier layer(s) whose hidden states a round needs: a hidden-state drafter's `hidden_layers`,
    the pivot classifier's layer for PAD, or None."""
    pivot_layer = None if pivot_fn is None else getattr(pivot_fn, "hidden_layer", -1)
    if drafter is None or not drafter.needs_hidden:
        return pivot_layer
    layers = drafter.hidden_layers
    if pivot_layer is not None and hidden_blocks(pivot_layer, verifier.num_layers) != hidden_blocks(
            layers, verifier.num_layers):
        raise ValueError(f"a {drafter.kind} drafter reads the verifier's hidden states of blocks {list(layers)}; "
                         f"a pivot classifier on layer {pivot_layer} cannot run with it")
    return layers

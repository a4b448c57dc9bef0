"""A generate call's arguments, checked. `Request` takes them as keyword arguments and only checks: every check that
needs no model, in generate's order, each a one-line ValueError (the first error wins, before any model loads); it
loads nothing. `load`
then gives the request its models through one call of the models layer (`models.hf.load_inputs`: the verifier and
the drafter's own LM loaded when given by name or path, the prompts encoded and checked against the context of
both), and checks what reads them: the phase's markers against the verifier's tokenizer, the drafter (made for the
verifier) against the verifier and the rule, the verifier layers a round reads."""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field
from typing import Sequence

from relaxspec.acceptance import Rule, check_sampling_args, derive_seed, get_rule
from relaxspec.acceptance.verify import VerifyStep
from relaxspec.drafters import AUTO_MAX, Drafter, as_drafter, drafter_model
from relaxspec.engine.phase import Phase, check_phase, parse_phase
from relaxspec.models.hf import CausalLM, load_inputs
from relaxspec.models.prompts import prompt_list
from relaxspec.names import AR, AUTO


@dataclass(kw_only=True, eq=False)
class Request:
    """generate's arguments (see `generate`) once checked, as the strategies read them."""

    verifier: CausalLM | str | os.PathLike  # a CausalLM once loaded (`load`)
    drafter: Drafter | CausalLM | str | None  # a Drafter once loaded; None for AR (which ignores the drafter argument)
    prompts: list  # (any iterable of prompts is read once, into a list)
    method: str
    draft_length: int | str  # then N: the most drafts of a round (auto's bound), at most max_new_tokens
    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int | Sequence[int]
    pivot_fn: object
    chat_template: str
    system: str | None
    phase: Phase | str | tuple | None
    draft_confidence: float | None
    rule_params: dict
    # made by the checks
    auto: bool = field(init=False)  # draft_length="auto"
    rule: Rule | None = field(init=False)  # None: AR
    step: VerifyStep | None = field(init=False)  # the rule with its settings, checked once (each round runs unchecked)
    inputs: dict = field(init=False)  # rule inputs given as values (a hook gives the others per round)
    sampling: dict = field(init=False)  # temperature, top_k, top_p
    seeds: list[int] = field(init=False)  # one per sequence
    # made by `load`
    encoded: list[list[int]] = field(init=False)  # the prompts' token ids (chat template applied), each fitting
    drafter_lm: CausalLM | None = field(init=False)  # the drafter's own LM, whose context and compiled shapes count
    hidden_layer: int | tuple[int, ...] | None = field(init=False)  # the verifier layer(s) a round reads
    device: object = field(init=False)

    def __post_init__(self):
        check_sampling_args(self.temperature, self.top_k, self.top_p)
        self.draft_confidence = check_draft_confidence(self.draft_confidence)
        self.phase = parse_phase(self.phase)
        self.prompts = prompt_list(self.prompts)
        if (isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, numbers.Integral)
                or self.max_new_tokens < 1):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        self.rule = None if self.method == AR else get_rule(self.method)  # unknown -> ValueError listing the known ones
        if self.rule is not None:
            self._check_speculative()
        elif self.rule_params:
            raise ValueError(f"method 'ar' takes no rule parameters, got {sorted(self.rule_params)}")
        elif self.pivot_fn is not None:
            raise ValueError("method 'ar' takes no pivot_fn")
        elif self.draft_confidence is not None:
            raise ValueError("method 'ar' drafts nothing: it takes no draft_confidence")
        self.seeds = _sequence_seeds(self.seed, len(self.prompts))
        self.sampling = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        rule, params = self.rule, self.rule_params
        # (a rule input's values, e.g. PAD's pivot_prob, checked with the round's one copy to the host: `inputs_ok`)
        self.step = None if rule is None else VerifyStep(self.method, **self.sampling, defer_input_checks=True, **{
            name: value for name, value in params.items() if name not in rule.inputs})
        self.inputs = {name: value for name, value in params.items() if rule is not None and name in rule.inputs}
        # A round never proposes more than the room left, so a longer draft could not be used: N is bounded by
        # max_new_tokens (and so are the per-position statistics, sized to N).
        self.auto = rule is not None and self.draft_length == AUTO
        self.draft_length = 0 if rule is None else min(AUTO_MAX if self.auto else self.draft_length,
                                                       self.max_new_tokens)

    def _check_speculative(self) -> None:
        """The checks of a speculative method's arguments that need no model."""
        if self.drafter is None:
            raise ValueError(f"method {self.method!r} needs a drafter (only 'ar' runs without one)")
        length = self.draft_length
        if length != AUTO and (isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 1):
            raise ValueError(f"draft_length must be an integer >= 1 or {AUTO!r}, got {length!r}")
        wants_pivot = "pivot_prob" in self.rule.inputs and "pivot_prob" not in self.rule_params
        if wants_pivot and self.pivot_fn is None:
            raise ValueError(f"method {self.method!r} needs a pivot classifier: pass pivot_fn= (see relaxspec.pivot)")
        if self.pivot_fn is not None and not wants_pivot:
            raise ValueError(f"pivot_fn is only used by methods that take a pivot_prob input, not {self.method!r}")


def load(request: Request) -> Request:
    """`request` with its models (see the module doc)."""
    r = request
    lm = drafter_model(r.drafter) if r.rule is not None else getattr(r.drafter, "lm", None)  # (AR: an LM drafter's)
    r.verifier, r.drafter_lm, r.encoded = load_inputs(r.verifier, r.prompts, r.max_new_tokens, drafter_lm=lm,
                                                      chat_template=r.chat_template, system=r.system)
    r.device = r.verifier.device
    if r.phase is not None:
        check_phase(r.phase, r.verifier.tokenizer)
    if r.rule is None:
        r.drafter, r.hidden_layer = None, None  # (AR ignores the drafter argument)
        return r
    r.drafter = as_drafter(r.drafter, r.verifier, r.drafter_lm)
    r.drafter.check(r.verifier, r.rule)
    r.hidden_layer = r.drafter.hidden_layer(r.verifier,
                                            None if r.pivot_fn is None else getattr(r.pivot_fn, "hidden_layer", -1))
    return r


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

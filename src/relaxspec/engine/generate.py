"""Batched speculative generation: draft N tokens, verify them in one verifier pass, roll back.

Each round, for every live row:
  1. the drafter (relaxspec.drafters: an LM, an MTP head, prompt lookup) proposes x_1..x_N
     with its processed distribution q (one-hot for prompt lookup);
  2. the verifier scores [last, x_1..x_N] in one forward (logits for N drafts + bonus);
  3. `verify` (any acceptance rule) keeps n drafts and emits one more token;
  4. both roll back to the accepted prefix (the verifier's cache by masking the rejected slots; the
     drafter by its own rule, reading the verifier's hidden states if it drafts from them); `last`
     becomes the emitted token.

Rows accept different numbers of drafts, so each row keeps its own positions while all rows share one
cache length, and the slots a row has dead are dropped by a bounded compaction (relaxspec.models.stream's
`Stream`). Near `max_new_tokens` each row drafts at most its own room minus one (ragged draft lengths
within a block, verify's `num_drafts`), so a row's rounds never depend on its batch.

Per round the host gets one copy of the round's outcome (accepted counts and tokens, for the trace the
drafts); the outputs, statistics and traces are assembled from that log at the end.

Randomness (docs/design.md, "Coupled randomness"): each sequence has its own seed, and every draw it
consumes (drafter sample, acceptance uniform, residual / bonus / AR sample) is keyed by (that seed,
the absolute output position, the purpose), so outputs do not depend on the batch, and two
methods given the same seeds share every draw.

The call is a thin driver: its arguments checked into a `Request` and its models loaded by one call of the models
layer (engine/request.py), then a strategy (engine/round.py: `Autoregressive`, or `Speculative` with its drafter's
drafting policy, drafters/policy.py, and the verify step's hooks, engine/hooks.py) round by round while a row is
live, and the outputs assembled from the `Book` (engine/book.py).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

from relaxspec.drafters import AUTO_MAX, AUTO_START, Drafter
from relaxspec.engine.book import Round
from relaxspec.engine.request import Request, check_draft_confidence, load
from relaxspec.engine.round import Autoregressive, Decoding, Speculative
from relaxspec.engine.stats import GenerationStats
from relaxspec.models.device import inference
from relaxspec.models.hf import CausalLM
from relaxspec.names import AR

# (names other modules import from here)
__all__ = ["generate", "GenerationOutput", "SequenceResult", "Round", "AR", "AUTO_START", "AUTO_MAX",
           "check_draft_confidence"]


@dataclass
class SequenceResult:
    prompt: str
    text: str
    token_ids: list[int]
    stats: GenerationStats  # this sequence's counts (its forwards and times are 0: those are per call)
    trace: list[Round] = field(default_factory=list)
    seed: int = 0  # the sequence's own seed: rerun it alone, or in any batch, with this seed


@dataclass
class GenerationOutput:
    results: list[SequenceResult]
    stats: GenerationStats


@inference  # one inference mode for the whole call, not one per forward
def generate(
    verifier: CausalLM | str,
    drafter: Drafter | CausalLM | str | None,
    prompts: list[str] | str,
    method: str = "strict",
    draft_length: int | str = 5,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | Sequence[int] = 0,
    pivot_fn=None,
    chat_template: str = "auto",
    system: str | None = None,
    phase=None,
    draft_confidence: float | None = None,
    **rule_params,
) -> GenerationOutput:
    """Generate from `verifier` with `drafter` proposing `draft_length` tokens per round under
    acceptance rule `method` (any name in relaxspec.acceptance.RULES), or plain autoregressive
    decoding with method="ar". temperature 0 is greedy. Stops at EOS or `max_new_tokens`.
    draft_length "auto": each sequence drafts 5 tokens, then 2 more after a round that accepted all of
    them and 1 fewer after any other, within [1, 10] (transformers' heuristic schedule; its own history
    only, so outputs stay batch invariant). Near `max_new_tokens` a sequence drafts at most its room
    minus one. draft_confidence t: a sequence also stops drafting after a draft its drafter gave a
    probability below t (that draft is still proposed; transformers' assistant_confidence_threshold);
    with "auto" the schedule counts the drafts actually proposed. A one-hot drafter (prompt lookup) has
    confidence 1: the stop never fires for it.
    `drafter`: any Drafter (relaxspec.drafters: LM, MTP head, prompt lookup), a CausalLM (an
    LM drafter) or a drafter name for `load_drafter`.

    seed: an int (sequence i gets `derive_seed(seed, i)`) or one int per prompt (a per-request seed,
    as vLLM's `SamplingParams.seed`); a sequence's output depends on its own seed only, not on the
    other prompts of the call. Prompts go through the verifier tokenizer's chat template when it
    has one (chat_template "auto"; "on" requires one, "off" never uses it; `system`: a system turn).
    A prompt that does not fit the models' context with `max_new_tokens` is an error. `pivot_fn`
    computes a rule's `pivot_prob` input from the verifier's hidden states (see relaxspec.pivot).
    phase: relax only inside a span of the response, strict outside (relaxspec.engine.phase: "think", a
    "BEGIN..END" spec, a (begin, end) pair of token strings / ids, or a Phase); None relaxes everywhere."""
    request = load(Request(verifier=verifier, drafter=drafter, prompts=prompts, method=method,
                           draft_length=draft_length, max_new_tokens=max_new_tokens, temperature=temperature,
                           top_k=top_k, top_p=top_p, seed=seed, pivot_fn=pivot_fn, chat_template=chat_template,
                           system=system, phase=phase, draft_confidence=draft_confidence, rule_params=rule_params))
    decoding = Autoregressive(request) if request.rule is None else Speculative(request)
    t_start = time.perf_counter()
    last = decoding.start()  # the prefills; `last` (not yet in any cache) is fed by round one
    while decoding.book.live_count:
        last = decoding.round(last)
    decoding.stats.time_total_s = time.perf_counter() - t_start
    output = _output(request, decoding)
    for message in decoding.warnings():  # (read from the call's summed stats)
        warnings.warn(message, stacklevel=2)
    return output


def _output(request: Request, decoding: Decoding) -> GenerationOutput:
    """Each sequence's text, tokens, stats and trace from the book; the call's stats with their sums."""
    stats, tokenizer = decoding.stats, request.verifier.tokenizer
    outputs, seq_stats, traces = decoding.book.results()
    results = [SequenceResult(prompt=prompt, text=tokenizer.decode(outputs[seq], skip_special_tokens=True),
                              token_ids=outputs[seq], stats=seq_stats[seq], trace=traces[seq], seed=request.seeds[seq])
               for seq, prompt in enumerate(request.prompts)]
    rule_state = decoding.rule_state()  # (one copy to the host, at the end)
    for seq, values in enumerate(zip(*rule_state.values())):
        seq_stats[seq].rule_state = {name: [value] for name, value in zip(rule_state, values)}
    merged = GenerationStats.merge(seq_stats)
    for name in ("sequences", "sequence_rounds", "drafts_proposed", "drafts_accepted", "drafts_cut",
                 "proposed_per_position", "accepted_per_position", "generated_tokens", "emitted_tokens",
                 "rule_state"):
        setattr(stats, name, getattr(merged, name))
    return GenerationOutput(results=results, stats=stats)

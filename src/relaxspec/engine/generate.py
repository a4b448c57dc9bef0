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
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import torch

from relaxspec.acceptance import DRAFT, TOKEN, SequenceSeeds, is_greedy, process_logits_unchecked
from relaxspec.engine.book import Book, Round
from relaxspec.engine.hooks import AUTO_MAX, AUTO_START, AutoDraftLength, ConfidenceStop, PhaseRelax
from relaxspec.engine.request import Request, check_draft_confidence
from relaxspec.engine.stats import GenerationStats
from relaxspec.drafters import Drafter
from relaxspec.models.compiled import plan_static_shapes
from relaxspec.models.device import inference
from relaxspec.models.hf import CausalLM
from relaxspec.models.stream import Stream, left_pad
from relaxspec import native
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


def _sample(logits: torch.Tensor, temperature, top_k, top_p, draws, purpose: int, offset: int = 0):
    """(token, processed distribution it was drawn from); greedy takes the argmax without building
    a one-hot row (and draws nothing), and returns None for the distribution."""
    if is_greedy(temperature):
        return logits.argmax(dim=-1), None
    probs = process_logits_unchecked(logits, temperature, top_k, top_p)  # settings checked once by generate
    return draws.sample(probs, purpose, offset), probs


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
    r = Request.check(verifier, drafter, prompts, method, draft_length, max_new_tokens, temperature, top_k, top_p,
                      seed, pivot_fn, chat_template, system, phase, draft_confidence, rule_params)
    verifier, drafter, rule, step, inputs, device = r.verifier, r.drafter, r.rule, r.step, r.inputs, r.device
    prompts, encoded, seeds, sampling, hidden_layer = r.prompts, r.encoded, r.seeds, r.sampling, r.hidden_layer
    phase, pivot_fn, draft_confidence, N = r.phase, r.pivot_fn, r.draft_confidence, r.draft_length
    if device.type == "cpu":
        native.tune_allocator()  # (once per process: a round's temporaries reuse memory, no page faults)
    greedy = is_greedy(temperature)
    ids, mask = left_pad(encoded, verifier.tokenizer, device)
    B = ids.shape[0]
    extra = rule.extra_draft_passes if rule is not None else 0  # drafter rows beyond N (bonus position)
    # compiled models: static cache capacity and step widths of this call (models/compiled.py)
    plan_static_shapes(verifier, r.drafter_lm, ids.shape[1] + max_new_tokens + N + 1, N + 1)
    eos = verifier.eos_token_id
    schedule = AutoDraftLength(B, N) if r.auto else None
    book = Book(B, N, max_new_tokens, eos, device, trace=rule is not None, schedule=schedule)
    stats = GenerationStats(draft_length=N, sequences=B)

    t_start = time.perf_counter()
    # Prefill all but the last prompt token; `last` (not yet in any cache) is fed by round one.
    target = Stream(verifier)
    drafter_hidden = rule is not None and drafter.needs_hidden
    hidden = target.prefill(ids[:, :-1], mask[:, :-1], hidden_layer=hidden_layer if drafter_hidden else None)
    if rule is not None:
        drafter.prefill(ids[:, :-1], mask[:, :-1], hidden)
    last = ids[:, -1].clone() if rule is not None else ids[:, -1:].clone()  # AR: [B, 1], the block it feeds
    sequence_seeds = SequenceSeeds(seeds, device)
    phases = PhaseRelax(phase, verifier.tokenizer, encoded, device) if phase is not None and rule is not None else None

    while book.live_count:
        # Each row drafts at most its own room minus one (a round emits up to n + 1 tokens), so a row's
        # rounds do not depend on the other rows of the batch; the block is as wide as the roomiest
        # row's, the others' extra columns are padding (verify's num_drafts).
        width, num_drafts = book.draft_lengths()
        draws = None if greedy else sequence_seeds.at(None, width if rule is not None else 0,
                                                      host_start=book.length)  # each row's next position
        if rule is None:
            t0 = time.perf_counter()
            logits, _ = target.feed(last)
            token, _ = _sample(logits[:, -1], **sampling, draws=draws, purpose=TOKEN)
            stats.verifier_forwards += 1
            stats.time_verify_s += time.perf_counter() - t0
            tokens, accepted, results = token[:, None], None, None
        else:
            t0 = time.perf_counter()
            stop = None if draft_confidence is None else ConfidenceStop(draft_confidence, book.limits())
            proposal = drafter.propose(last, width, extra, lambda logits, i: _sample(
                logits, **sampling, draws=draws, purpose=DRAFT, offset=i), stop=stop)
            draft_tokens, draft_logits = proposal.tokens, proposal.logits
            if stop is not None:  # rows that stopped early draft fewer (the block may be narrower)
                width, num_drafts = book.drafted(stop.count)
            stats.drafter_forwards += proposal.forwards
            t1 = time.perf_counter()
            stats.time_draft_s += t1 - t0

            target_logits, hidden = target.feed(torch.cat([last[:, None], draft_tokens], dim=1),
                                                hidden_layer=hidden_layer)
            stats.verifier_forwards += 1
            params = dict(inputs)
            if pivot_fn is not None:
                params["pivot_prob"] = pivot_fn(hidden[:, 1:], target_logits[:, :width], draft_logits[:, :width],
                                                draft_tokens)
            if phases is not None:  # where each row's span lets the rule decide (strict elsewhere)
                params["relax"] = phases.relax(draft_tokens, book.limits(), stats)
            results = step(target_logits, draft_logits, draft_tokens, random=draws, draft_probs=proposal.probs,
                           num_drafts=num_drafts, **params)
            accepted, tokens = results.num_accepted, results.tokens
            stats.time_verify_s += time.perf_counter() - t1

        # One copy to the host per round: what each row appended and whether it is done.
        done = book.record(tokens, accepted, *(() if results is None else (draft_tokens, results.relaxed_only)),
                           inputs_ok=None if results is None else results.inputs_ok)
        if book.inputs_failed:  # a rule input out of range this round (the round is not logged)
            raise step.input_error(**params)
        last = tokens if rule is None else results.last_token
        if rule is not None:
            # Roll back both to `last` + the accepted drafts (the drafter gets the verifier's hidden
            # states of that block when it drafts from them); one row keeps what the host's `longest_kept` says.
            target.invalidate_tail(None if accepted.shape[0] == 1 else accepted + 1, width + 1,
                                   longest=book.longest_kept)
            # (each row's kept drafts and emitted token, from the round's host copy, for what reads them there)
            round_rows = book.last_round() if phases is not None or drafter.host_rounds else None
            drafter.rollback(accepted, hidden if drafter_hidden else None, longest=book.longest_kept - 1,
                             rounds=round_rows if drafter.host_rounds else None)
            if phases is not None:  # commit each row's emitted tokens to its phase state
                phases.advance(round_rows)
        if done is not None:
            keep = torch.tensor(done, dtype=torch.long, device=device)
            last = last[keep]
            sequence_seeds.select(keep)
            target.select(keep)
            if rule is not None:
                drafter.select(keep)
            if phases is not None:
                phases.select(done)

    stats.time_total_s = time.perf_counter() - t_start
    tokenizer = verifier.tokenizer
    outputs, seq_stats, traces = book.results()
    results = []
    for seq, prompt in enumerate(prompts):
        results.append(SequenceResult(prompt=prompt, text=tokenizer.decode(outputs[seq], skip_special_tokens=True),
                                      token_ids=outputs[seq], stats=seq_stats[seq], trace=traces[seq],
                                      seed=seeds[seq]))
    merged = GenerationStats.merge(seq_stats)
    for name in ("sequences", "sequence_rounds", "drafts_proposed", "drafts_accepted", "drafts_cut",
                 "proposed_per_position", "accepted_per_position", "generated_tokens", "emitted_tokens"):
        setattr(stats, name, getattr(merged, name))
    message = None if phases is None else phases.never_opened(stats)
    if message is not None:
        warnings.warn(message, stacklevel=2)
    return GenerationOutput(results=results, stats=stats)

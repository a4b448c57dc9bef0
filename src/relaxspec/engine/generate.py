"""Batched speculative generation: draft N tokens, verify them in one verifier pass, roll back.

Each round, for every live row:
  1. the drafter (relaxspec.drafters: an LM, an MTP head, prompt lookup) proposes x_1..x_N
     with its processed distribution q (one-hot for prompt lookup);
  2. the verifier scores [last, x_1..x_N] in one forward (logits for N drafts + bonus);
  3. `verify` (any acceptance rule) keeps n drafts and emits one more token;
  4. both roll back to the accepted prefix (the verifier's cache by masking the rejected slots; the
     drafter by its own rule, reading the verifier's hidden states if it drafts from them); `last`
     becomes the emitted token.

Rows accept different numbers of drafts, so each row's positions come from its own attention-mask
row while all rows share one cache length (see relaxspec.models.hf).

Randomness (docs/design.md, "Coupled randomness"): each sequence has its own seed, and every draw it
consumes (drafter sample, acceptance uniform, residual / bonus / AR sample) is keyed by (that seed,
the absolute output position, the purpose), so outputs do not depend on the batch, and two
methods given the same seeds share every draw.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from relaxspec.acceptance import (
    DRAFT,
    TOKEN,
    SequenceSeeds,
    check_sampling_args,
    derive_seed,
    get_rule,
    is_greedy,
    process_logits,
    verify,
)
from relaxspec.engine.phase import PhaseTracker, check_phase, parse_phase
from relaxspec.engine.stats import GenerationStats
from relaxspec.drafters import Drafter, as_drafter
from relaxspec.models.hf import CausalLM, hidden_blocks
from relaxspec.models.prompts import check_context, encode_prompts
from relaxspec.models.stream import Stream, left_pad, model_device
from relaxspec.names import AR


@dataclass
class Round:
    """One verify step of one sequence, kept for `--show`."""

    drafts: list[int]
    num_accepted: int
    emitted: int  # the residual-or-bonus token
    relaxed_only: list[bool]  # accepted although the strict test (same uniform) would have rejected


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
    probs = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return draws.sample(probs, purpose, offset), probs


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


def generate(
    verifier: CausalLM,
    drafter: Drafter | CausalLM | str | None,
    prompts: list[str] | str,
    method: str = "strict",
    draft_length: int = 5,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | Sequence[int] = 0,
    pivot_fn=None,
    chat_template: str = "auto",
    system: str | None = None,
    phase=None,
    **rule_params,
) -> GenerationOutput:
    """Generate from `verifier` with `drafter` proposing `draft_length` tokens per round under
    acceptance rule `method` (any name in relaxspec.acceptance.RULES), or plain autoregressive
    decoding with method="ar". temperature 0 is greedy. Stops at EOS or `max_new_tokens`.
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
    check_sampling_args(temperature, top_k, top_p)
    phase = parse_phase(phase)
    if phase is not None:
        check_phase(phase, verifier.tokenizer)
    if isinstance(prompts, str):
        prompts = [prompts]
    if not prompts:
        raise ValueError("no prompts given")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    rule = None
    if method != AR:
        rule = get_rule(method)  # unknown method -> ValueError listing the known ones
        if drafter is None:
            raise ValueError(f"method {method!r} needs a drafter (only 'ar' runs without one)")
        if isinstance(draft_length, bool) or not isinstance(draft_length, numbers.Integral) or draft_length < 1:
            raise ValueError(f"draft_length must be an integer >= 1, got {draft_length!r}")
        drafter = as_drafter(drafter, verifier)
        drafter.check(verifier, rule)
        wants_pivot = "pivot_prob" in rule.inputs and "pivot_prob" not in rule_params
        if wants_pivot and pivot_fn is None:
            raise ValueError(f"method {method!r} needs a pivot classifier: pass pivot_fn= (see relaxspec.pivot)")
        if pivot_fn is not None and not wants_pivot:
            raise ValueError(f"pivot_fn is only used by methods that take a pivot_prob input, not {method!r}")
    elif rule_params:
        raise ValueError(f"method 'ar' takes no rule parameters, got {sorted(rule_params)}")
    elif pivot_fn is not None:
        raise ValueError("method 'ar' takes no pivot_fn")

    hidden_layer = _hidden_layer(verifier, drafter, pivot_fn) if rule is not None else None
    device = model_device(verifier)
    seeds = _sequence_seeds(seed, len(prompts))
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    greedy = is_greedy(temperature)
    encoded = encode_prompts(verifier.tokenizer, prompts, chat_template=chat_template, system=system)
    encoded = check_context(encoded, max_new_tokens, verifier, getattr(drafter, "lm", None))
    ids, mask = left_pad(encoded, verifier.tokenizer, device)
    B = ids.shape[0]
    N = draft_length if rule is not None else 0
    extra = rule.extra_draft_passes if rule is not None else 0  # drafter rows beyond N (bonus position)
    eos = verifier.eos_token_id
    outputs: list[list[int]] = [[] for _ in range(B)]
    traces: list[list[Round]] = [[] for _ in range(B)]
    seq_stats = [GenerationStats(draft_length=N, sequences=1) for _ in range(B)]
    stats = GenerationStats(draft_length=N, sequences=B)

    t_start = time.perf_counter()
    # Prefill all but the last prompt token; `last` (not yet in any cache) is fed by round one.
    target = Stream(verifier)
    drafter_hidden = rule is not None and drafter.needs_hidden
    hidden = target.prefill(ids[:, :-1], mask[:, :-1], hidden_layer=hidden_layer if drafter_hidden else None)
    if rule is not None:
        drafter.prefill(ids[:, :-1], mask[:, :-1], hidden)
    last = ids[:, -1].clone()
    live = list(range(B))  # which sequence each batch row belongs to
    produced = torch.zeros(B, dtype=torch.long, device=device)  # tokens emitted so far, per live row
    sequence_seeds = SequenceSeeds([seeds[b] for b in live], device)
    phases = PhaseTracker(phase, verifier.tokenizer, encoded) if phase is not None and rule is not None else None

    n_round = 0  # drafts per round (AR: none)
    while live:
        draws = None if greedy else sequence_seeds.at(produced)
        if rule is None:
            t0 = time.perf_counter()
            logits, _ = target.feed(last[:, None])
            token, _ = _sample(logits[:, -1], **sampling, draws=draws, purpose=TOKEN)
            stats.verifier_forwards += 1
            stats.time_verify_s += time.perf_counter() - t0
            emitted = token[:, None]
            accepted = torch.zeros(len(live), dtype=torch.long, device=device)
            results = None
        else:
            # Draft no further than the roomiest row can still use: a round emits up to n + 1 tokens.
            room = max_new_tokens - min(len(outputs[b]) for b in live)
            n_round = max(1, min(N, room - 1))
            t0 = time.perf_counter()
            proposal = drafter.propose(last, n_round, extra, lambda logits, i: _sample(
                logits, **sampling, draws=draws, purpose=DRAFT, offset=i))
            draft_tokens, draft_logits = proposal.tokens, proposal.logits
            stats.drafter_forwards += proposal.forwards
            t1 = time.perf_counter()
            stats.time_draft_s += t1 - t0

            target_logits, hidden = target.feed(torch.cat([last[:, None], draft_tokens], dim=1),
                                                hidden_layer=hidden_layer)
            stats.verifier_forwards += 1
            params = dict(rule_params)
            if pivot_fn is not None:
                params["pivot_prob"] = pivot_fn(hidden[:, 1:], target_logits[:, :n_round],
                                                draft_logits[:, :n_round], draft_tokens)
            if phases is not None:
                params["relax"] = torch.tensor(phases.relax(draft_tokens.tolist()), device=device)
            results = verify(method, target_logits, draft_logits, draft_tokens, **sampling, random=draws,
                             draft_probs=proposal.probs, **params)
            accepted = results.num_accepted
            stats.time_verify_s += time.perf_counter() - t1

            # Roll back both to `last` + the accepted drafts (the drafter gets the verifier's hidden
            # states of that block when it drafts from them).
            target.invalidate_tail(accepted + 1, n_round + 1)
            drafter.rollback(accepted, hidden if drafter_hidden else None)
            emitted = results.tokens

        # Bookkeeping per sequence (plain lists: one copy out of the tensors per round).
        accepted_list, emitted_list = accepted.tolist(), emitted.tolist()
        if results is not None:
            drafts_list, relaxed_list = draft_tokens.tolist(), results.relaxed_only.tolist()
        done = []
        for b, seq in enumerate(live):
            n = accepted_list[b]
            new = emitted_list[b][: n + 1]
            out = outputs[seq]
            room = max_new_tokens - len(out)
            stop = eos is not None and eos in new[:room]
            out.extend(new[: min(room, new.index(eos) if stop else room)])
            seq_stats[seq].add_round(n, n_round)
            if results is not None:
                traces[seq].append(Round(drafts=drafts_list[b], num_accepted=n, emitted=new[n],
                                         relaxed_only=relaxed_list[b]))
            done.append(stop or len(out) >= max_new_tokens)
        if phases is not None:
            phases.advance([emitted_list[b][: accepted_list[b] + 1] for b in range(len(live))])
        last = emitted.gather(1, accepted[:, None]).squeeze(1)
        produced = produced + accepted + 1
        if any(done):
            keep_list = [b for b, d in enumerate(done) if not d]
            keep = torch.tensor(keep_list, dtype=torch.long, device=device)
            live = [live[b] for b in keep_list]
            last, produced = last[keep], produced[keep]
            sequence_seeds.select(keep)
            target.select(keep)
            if rule is not None:
                drafter.select(keep)
            if phases is not None:
                phases.select(keep_list)

    stats.time_total_s = time.perf_counter() - t_start
    tokenizer = verifier.tokenizer
    results = []
    for seq, prompt in enumerate(prompts):
        seq_stats[seq].generated_tokens = len(outputs[seq])
        results.append(SequenceResult(prompt=prompt, text=tokenizer.decode(outputs[seq], skip_special_tokens=True),
                                      token_ids=outputs[seq], stats=seq_stats[seq], trace=traces[seq],
                                      seed=seeds[seq]))
    merged = GenerationStats.merge(seq_stats)
    for name in ("sequences", "sequence_rounds", "drafts_proposed", "drafts_accepted", "proposed_per_position",
                 "accepted_per_position", "generated_tokens"):
        setattr(stats, name, getattr(merged, name))
    return GenerationOutput(results=results, stats=stats)

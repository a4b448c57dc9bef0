"""Batched speculative generation: draft N tokens, verify them in one verifier pass, roll back.

Each round, for every live row:
  1. the drafter proposes x_1..x_N from its processed distribution q;
  2. the verifier scores [last, x_1..x_N] in one forward (logits for N drafts + bonus);
  3. `verify` (any acceptance rule) keeps n drafts and emits one more token;
  4. both caches "roll back" by masking the rejected slots; `last` becomes the emitted token.

Rows accept different numbers of drafts, so each row's positions come from its own attention-mask
row while all rows share one cache length (see relaxspec.models.hf).

Randomness (DESIGN.md, "Coupled randomness"): each sequence has its own seed, and every draw it
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

from relaxspec.acceptance import SequenceSeeds, derive_seed, get_rule, process_logits, verify
from relaxspec.acceptance.processing import check_sampling_args
from relaxspec.acceptance.random import DRAFT, TOKEN
from relaxspec.engine.stats import GenerationStats
from relaxspec.models.hf import CausalLM, check_same_vocab, crop_cache

AR = "ar"


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


class _Stream:
    """One model's cache plus the per-row attention mask over its slots (a row's real slots also
    count its positions, so there is no separate counter to keep in step)."""

    def __init__(self, lm: CausalLM, device: torch.device | None = None):
        self.lm = lm
        self.device = model_device(lm) if device is None else device
        self.cache = lm.new_cache()
        self.mask = None  # [B, L] 1 where the cache slot belongs to the row's sequence

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        self.mask = torch.zeros((ids.shape[0], 0), dtype=torch.long, device=self.device)
        if ids.shape[1]:
            self.feed(ids, mask)

    def feed(self, ids: torch.Tensor, valid: torch.Tensor | None = None, hidden_layer=None):
        """Append ids [B, T]; `valid` [B, T] says which slots are real (others are masked out for good;
        None: all are). Returns float32 logits [B, T, V] and the hidden state asked for (or None)."""
        # A row's next position is its number of real slots so far.
        start = self.mask.sum(dim=1, keepdim=True)
        if valid is None:
            positions = start + torch.arange(ids.shape[1], device=self.device)
            valid = torch.ones_like(ids)
        else:
            positions = start + valid.cumsum(dim=1) - valid  # real slots get consecutive positions
        self.mask = torch.cat([self.mask, valid], dim=1)
        logits, hidden = self.lm.forward(ids, self.cache, self.mask, positions, hidden_layer=hidden_layer)
        return logits.float(), hidden  # rules see float32 whatever the model's dtype

    def invalidate_tail(self, keep: torch.Tensor, width: int) -> None:
        """Of the last `width` slots, keep only the first keep[b] per row (rollback), then crop the
        tail columns that no row uses any more."""
        self.mask[:, -width:] *= torch.arange(width, device=self.device) < keep[:, None]
        length = self.mask.shape[1] - width + int(keep.max())
        if length < self.mask.shape[1]:
            crop_cache(self.cache, length)
            self.mask = self.mask[:, :length]

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]


def _sample(logits: torch.Tensor, temperature, top_k, top_p, draws, purpose: int, offset: int = 0):
    """(token, processed distribution it was drawn from); greedy takes the argmax without building
    a one-hot row (and draws nothing), and returns None for the distribution."""
    if temperature == 0:
        return logits.argmax(dim=-1), None
    probs = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return draws.sample(probs, purpose, offset), probs


def _encode(tokenizer, prompts: list[str], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask on `device`, encoded as `tokenizer(prompt)` does."""
    encoded = [tokenizer(p)["input_ids"] for p in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"prompt {i} is empty (it encodes to no tokens)")
    width = max(map(len, encoded))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = torch.device("cpu") if device is None else device
    rows = [[pad] * (width - len(row)) + row for row in encoded]
    ids = torch.tensor(rows, dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in encoded], dtype=torch.long,
                        device=device)
    return ids, mask


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


def model_device(lm: CausalLM) -> torch.device:
    """The device the model's weights live on (every tensor the engine makes goes there)."""
    device = getattr(lm, "device", None)
    return device if isinstance(device, torch.device) else next(lm.model.parameters()).device


def generate(
    verifier: CausalLM,
    drafter: CausalLM | None,
    prompts: list[str] | str,
    method: str = "strict",
    draft_length: int = 5,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | Sequence[int] = 0,
    pivot_fn=None,
    **rule_params,
) -> GenerationOutput:
    """Generate from `verifier` with `drafter` proposing `draft_length` tokens per round under
    acceptance rule `method` (any name in relaxspec.acceptance.RULES), or plain autoregressive
    decoding with method="ar". temperature 0 is greedy. Stops at EOS or `max_new_tokens`.

    seed: an int (sequence i gets `derive_seed(seed, i)`) or one int per prompt (a per-request seed,
    as vLLM's `SamplingParams.seed`); a sequence's output depends on its own seed only, not on the
    other prompts of the call. `pivot_fn` computes a rule's `pivot_prob` input from the verifier's
    hidden states (see relaxspec.pivot)."""
    check_sampling_args(temperature, top_k, top_p)
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
        check_same_vocab(verifier, drafter)
        wants_pivot = "pivot_prob" in rule.inputs and "pivot_prob" not in rule_params
        if wants_pivot and pivot_fn is None:
            raise ValueError(f"method {method!r} needs a pivot classifier: pass pivot_fn= (see relaxspec.pivot)")
        if pivot_fn is not None and not wants_pivot:
            raise ValueError(f"pivot_fn is only used by methods that take a pivot_prob input, not {method!r}")
    elif rule_params:
        raise ValueError(f"method 'ar' takes no rule parameters, got {sorted(rule_params)}")
    elif pivot_fn is not None:
        raise ValueError("method 'ar' takes no pivot_fn")

    device = model_device(verifier)
    seeds = _sequence_seeds(seed, len(prompts))
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    ids, mask = _encode(verifier.tokenizer, prompts, device)
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
    target = _Stream(verifier)
    target.prefill(ids[:, :-1], mask[:, :-1])
    streams = [target]
    if rule is not None:
        draft = _Stream(drafter)
        draft.prefill(ids[:, :-1].to(draft.device), mask[:, :-1].to(draft.device))
        streams.append(draft)
        catch_up = torch.zeros(B, dtype=torch.long, device=device)  # x_N when the drafter has not seen it
        needs_catch_up = torch.zeros(B, dtype=torch.long, device=device)
    last = ids[:, -1].clone()
    live = list(range(B))  # which sequence each batch row belongs to
    produced = torch.zeros(B, dtype=torch.long, device=device)  # tokens emitted so far, per live row
    sequence_seeds = SequenceSeeds([seeds[b] for b in live], device)

    n_round = 0  # drafts per round (AR: none)
    while live:
        draws = sequence_seeds.at(produced) if temperature else None
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
            draft_tokens, draft_logits, draft_probs = [], [], []
            # x_N goes in front of `last` for rows whose drafter has not seen it; the column is only
            # fed when some row needs it (a masked slot for the others).
            with_catch_up = bool(needs_catch_up.any())
            if with_catch_up:
                feed_ids = torch.stack([catch_up, last], dim=1)
                feed_valid = torch.stack([needs_catch_up, torch.ones_like(last)], dim=1)
            else:
                feed_ids, feed_valid = last[:, None], None
            for i in range(n_round + extra):
                logits, _ = draft.feed(feed_ids.to(draft.device),
                                       None if feed_valid is None else feed_valid.to(draft.device))
                logits = logits[:, -1].to(device)
                stats.drafter_forwards += 1
                draft_logits.append(logits)
                if i < n_round:
                    token, probs = _sample(logits, **sampling, draws=draws, purpose=DRAFT, offset=i)
                    draft_tokens.append(token)
                    draft_probs.append(probs)
                    feed_ids, feed_valid = token[:, None], None
            draft_tokens = torch.stack(draft_tokens, dim=1)
            draft_logits = torch.stack(draft_logits, dim=1)
            draft_probs = torch.stack(draft_probs, dim=1) if temperature else None  # verify reuses q
            t1 = time.perf_counter()
            stats.time_draft_s += t1 - t0

            hidden_layer = getattr(pivot_fn, "hidden_layer", -1) if pivot_fn is not None else None
            target_logits, hidden = target.feed(torch.cat([last[:, None], draft_tokens], dim=1),
                                                hidden_layer=hidden_layer)
            stats.verifier_forwards += 1
            params = dict(rule_params)
            if pivot_fn is not None:
                params["pivot_prob"] = pivot_fn(hidden[:, 1:], target_logits[:, :n_round],
                                                draft_logits[:, :n_round], draft_tokens)
            results = verify(method, target_logits, draft_logits, draft_tokens, **sampling, random=draws,
                             draft_probs=draft_probs, **params)
            accepted = results.num_accepted
            stats.time_verify_s += time.perf_counter() - t1

            # Roll back: the verifier keeps last + accepted drafts; the drafter the same, except that
            # it never saw x_N (unless it made the extra bonus pass), so that one is caught up next round.
            target.invalidate_tail(accepted + 1, n_round + 1)
            # Drafting appended [catch_up?, last, x_1..x_{N-1}] (+ x_N with the extra pass).
            fed_before = 1 + int(with_catch_up)
            keep_draft = fed_before + accepted.clamp(max=n_round - 1 + extra)
            draft.invalidate_tail(keep_draft.to(draft.device), fed_before + n_round - 1 + extra)
            needs_catch_up = (accepted == n_round).long() * (1 - extra)
            catch_up = draft_tokens[:, -1]
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
        last = emitted.gather(1, accepted[:, None]).squeeze(1)
        produced = produced + accepted + 1
        if any(done):
            keep_list = [b for b, d in enumerate(done) if not d]
            keep = torch.tensor(keep_list, dtype=torch.long, device=device)
            live = [live[b] for b in keep_list]
            last, produced = last[keep], produced[keep]
            sequence_seeds.select(keep)
            for s in streams:
                s.select(keep.to(s.device))
            if rule is not None:
                catch_up, needs_catch_up = catch_up[keep], needs_catch_up[keep]

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

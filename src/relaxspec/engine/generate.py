"""Batched speculative generation: draft N tokens, verify them in one verifier pass, roll back.

Each round, for every live row:
  1. the drafter proposes x_1..x_N from its processed distribution q;
  2. the verifier scores [last, x_1..x_N] in one forward (logits for N drafts + bonus);
  3. `verify` (any acceptance rule) keeps n drafts and emits one more token;
  4. both caches "roll back" by masking the rejected slots; `last` becomes the emitted token.

Rows accept different numbers of drafts, so each row keeps its own position
counter while all rows share one cache length (see relaxspec.models.hf).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from relaxspec.acceptance import get_rule, process_logits, verify
from relaxspec.acceptance.processing import check_sampling_args, sample_rows
from relaxspec.models.hf import CausalLM, check_same_vocab, crop_cache
from relaxspec.engine.stats import SequenceStats, aggregate

AR = "ar"
# Rules whose bonus token uses the drafter at the bonus position (one extra drafter pass).
_NEEDS_DRAFT_BONUS = {"spec-cont-dec"}


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
    stats: dict
    trace: list[Round] = field(default_factory=list)


@dataclass
class GenerationOutput:
    results: list[SequenceResult]
    stats: dict


class _Stream:
    """One model's cache plus the per-row attention mask over its slots (a row's real slots also
    count its positions, so there is no separate counter to keep in step)."""

    def __init__(self, lm: CausalLM):
        self.lm = lm
        self.cache = lm.new_cache()
        self.mask = None  # [B, L] 1 where the cache slot belongs to the row's sequence

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        self.mask = torch.zeros((ids.shape[0], 0), dtype=torch.long)
        if ids.shape[1]:
            self.feed(ids, mask)

    def feed(self, ids: torch.Tensor, valid: torch.Tensor | None = None, hidden_layer=None):
        """Append ids [B, T]; `valid` [B, T] says which slots are real (others are masked out for good;
        None: all are)."""
        # A row's next position is its number of real slots so far.
        start = self.mask.sum(dim=1, keepdim=True)
        if valid is None:
            positions = start + torch.arange(ids.shape[1])
            valid = torch.ones_like(ids)
        else:
            positions = start + valid.cumsum(dim=1) - valid  # real slots get consecutive positions
        self.mask = torch.cat([self.mask, valid], dim=1)
        return self.lm.forward(ids, self.cache, self.mask, positions, hidden_layer=hidden_layer)

    def invalidate_tail(self, keep: torch.Tensor, width: int) -> None:
        """Of the last `width` slots, keep only the first keep[b] per row (rollback), then crop the
        tail columns that no row uses any more."""
        self.mask[:, -width:] *= torch.arange(width) < keep[:, None]
        length = self.mask.shape[1] - width + int(keep.max())
        if length < self.mask.shape[1]:
            crop_cache(self.cache, length)
            self.mask = self.mask[:, :length]

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]


def _sample(logits: torch.Tensor, temperature, top_k, top_p, generator):
    """(token, processed distribution it was drawn from); greedy takes the argmax without building
    a one-hot row, and returns None for the distribution."""
    if temperature == 0:
        return logits.argmax(dim=-1), None
    probs = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return sample_rows(probs, generator), probs


def _encode(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask, encoded as `tokenizer(prompt)` does."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not prompts:
        raise ValueError("no prompts given")
    encoded = [tokenizer(p)["input_ids"] for p in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"prompt {i} is empty (it encodes to no tokens)")
    width = max(map(len, encoded))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, row in enumerate(encoded):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def generate(
    verifier: CausalLM,
    drafter: CausalLM | None,
    prompts: list[str],
    method: str = "strict",
    draft_length: int = 5,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    pivot_fn=None,
    **rule_params,
) -> GenerationOutput:
    """Generate from `verifier` with `drafter` proposing `draft_length` tokens per round under
    acceptance rule `method` (any name in relaxspec.acceptance.RULES), or plain autoregressive
    decoding with method="ar". temperature 0 is greedy. Stops at EOS or `max_new_tokens`."""
    check_sampling_args(temperature, top_k, top_p)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if method != AR:
        get_rule(method)  # unknown method -> ValueError listing the known ones
        if drafter is None:
            raise ValueError(f"method {method!r} needs a drafter (only 'ar' runs without one)")
        if not isinstance(draft_length, int) or draft_length < 1:
            raise ValueError(f"draft_length must be an integer >= 1, got {draft_length!r}")
        check_same_vocab(verifier, drafter)
        if method == "pad" and pivot_fn is None and "pivot_prob" not in rule_params:
            raise ValueError("method 'pad' needs a pivot classifier: pass pivot_fn= (see relaxspec.pivot)")
        if method != "pad" and pivot_fn is not None:
            raise ValueError(f"pivot_fn is only used by method 'pad', not {method!r}")
    elif rule_params:
        raise ValueError(f"method 'ar' takes no rule parameters, got {sorted(rule_params)}")

    generator = torch.Generator().manual_seed(seed)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    ids, mask = _encode(verifier.tokenizer, prompts)
    B = ids.shape[0]
    eos = verifier.eos_token_id
    outputs: list[list[int]] = [[] for _ in range(B)]
    traces: list[list[Round]] = [[] for _ in range(B)]
    seq_stats = [SequenceStats(draft_length if method != AR else 0) for _ in range(B)]
    timer = {"draft": 0.0, "verify": 0.0}
    calls = {"verifier": 0, "drafter": 0}

    t_start = time.perf_counter()
    # Prefill all but the last prompt token; `last` (not yet in any cache) is fed by round one.
    target = _Stream(verifier)
    target.prefill(ids[:, :-1], mask[:, :-1])
    streams = [target]
    if method != AR:
        draft = _Stream(drafter)
        draft.prefill(ids[:, :-1], mask[:, :-1])
        streams.append(draft)
        catch_up = torch.zeros(B, dtype=torch.long)  # x_N when the drafter has not seen it yet
        needs_catch_up = torch.zeros(B, dtype=torch.long)
    last = ids[:, -1].clone()
    rows = torch.arange(B)  # which sequence each live batch row belongs to

    while len(rows):
        if method == AR:
            t0 = time.perf_counter()
            logits, _ = target.feed(last[:, None])
            token, _ = _sample(logits[:, -1], **sampling, generator=generator)
            calls["verifier"] += 1
            timer["verify"] += time.perf_counter() - t0
            emitted = token[:, None]
            accepted = torch.zeros(len(rows), dtype=torch.long)
            results = None
        else:
            N = draft_length
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
            extra = 1 if method in _NEEDS_DRAFT_BONUS else 0
            for i in range(N + extra):
                logits, _ = draft.feed(feed_ids, feed_valid)
                calls["drafter"] += 1
                draft_logits.append(logits[:, -1])
                if i < N:
                    token, probs = _sample(logits[:, -1], **sampling, generator=generator)
                    draft_tokens.append(token)
                    draft_probs.append(probs)
                    feed_ids, feed_valid = token[:, None], None
            draft_tokens = torch.stack(draft_tokens, dim=1)
            draft_logits = torch.stack(draft_logits, dim=1)
            draft_probs = torch.stack(draft_probs, dim=1) if temperature else None  # verify reuses q
            t1 = time.perf_counter()
            timer["draft"] += t1 - t0

            hidden_layer = getattr(pivot_fn, "hidden_layer", -1) if pivot_fn is not None else None
            target_logits, hidden = target.feed(torch.cat([last[:, None], draft_tokens], dim=1),
                                                hidden_layer=hidden_layer)
            calls["verifier"] += 1
            params = dict(rule_params)
            if pivot_fn is not None:
                params["pivot_prob"] = pivot_fn(hidden[:, 1:], target_logits[:, :N], draft_logits[:, :N], draft_tokens)
            results = verify(method, target_logits, draft_logits, draft_tokens, **sampling, generator=generator,
                             draft_probs=draft_probs, **params)
            accepted = results.num_accepted
            timer["verify"] += time.perf_counter() - t1

            # Roll back: the verifier keeps last + accepted drafts; the drafter the same, except that
            # it never saw x_N (unless it made the extra bonus pass), so that one is caught up next round.
            target.invalidate_tail(accepted + 1, N + 1)
            # Drafting appended [catch_up?, last, x_1..x_{N-1}] (+ x_N with the extra pass).
            fed_before = 1 + int(with_catch_up)
            draft.invalidate_tail(fed_before + accepted.clamp(max=N - 1 + extra), fed_before + N - 1 + extra)
            needs_catch_up = (accepted == N).long() * (1 - extra)
            catch_up = draft_tokens[:, -1]
            emitted = results.tokens

        # Bookkeeping per sequence (plain lists: one copy out of the tensors per round).
        accepted_list, emitted_list = accepted.tolist(), emitted.tolist()
        if results is not None:
            drafts_list, relaxed_list = draft_tokens.tolist(), results.relaxed_only.tolist()
        done = []
        for b, seq in enumerate(rows.tolist()):
            n = accepted_list[b]
            new = emitted_list[b][: n + 1]
            out = outputs[seq]
            room = max_new_tokens - len(out)
            stop = eos is not None and eos in new[:room]
            out.extend(new[: min(room, new.index(eos) if stop else room)])
            seq_stats[seq].add_round(n)
            if results is not None:
                traces[seq].append(Round(drafts=drafts_list[b], num_accepted=n, emitted=new[n],
                                         relaxed_only=relaxed_list[b]))
            done.append(stop or len(out) >= max_new_tokens)
        last = emitted[torch.arange(len(rows)), accepted]
        if any(done):
            keep = torch.tensor([b for b, d in enumerate(done) if not d], dtype=torch.long)
            rows, last = rows[keep], last[keep]
            for s in streams:
                s.select(keep)
            if method != AR:
                catch_up, needs_catch_up = catch_up[keep], needs_catch_up[keep]

    total = time.perf_counter() - t_start
    tokenizer = verifier.tokenizer
    results = []
    batch_times = dict(time_draft_s=timer["draft"], time_verify_s=timer["verify"], time_total_s=total)
    for seq, prompt in enumerate([prompts] if isinstance(prompts, str) else prompts):
        # Sequences run together, so a sequence's time fields are those of its batch.
        stats = {**seq_stats[seq].as_dict(), **batch_times, "generated_tokens": len(outputs[seq])}
        results.append(SequenceResult(prompt=prompt, text=tokenizer.decode(outputs[seq], skip_special_tokens=True),
                                      token_ids=outputs[seq], stats=stats, trace=traces[seq]))
    stats = aggregate(seq_stats, draft_length if method != AR else 0)
    stats.update(verifier_calls=calls["verifier"], drafter_calls=calls["drafter"], **batch_times,
                 generated_tokens=sum(map(len, outputs)), sequence_rounds=stats["verifier_calls"])
    return GenerationOutput(results=results, stats=stats)


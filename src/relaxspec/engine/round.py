"""The two decoding strategies of `generate`, each a round over every live row:

* `Autoregressive`: the verifier feeds `last` and samples one token;
* `Speculative`: propose -> verifier feed -> verify -> record -> rollback (see `Speculative.round`), the drafter
  with its drafting policy (drafters.Drafting: N, dynamic N, confidence stop) and the verify step's hooks
  (engine.hooks: the pivot classifier, the phase) configured once.

Both keep the verifier's cache `Stream`, each sequence's random streams (`SequenceSeeds`) and the `Book`; a row
that ends leaves every one of them at once (`select`).
"""

from __future__ import annotations

import time

import torch

from relaxspec import native
from relaxspec.acceptance import DRAFT, TOKEN, SequenceSeeds, is_greedy, process_logits_unchecked
from relaxspec.drafters import Drafting
from relaxspec.engine.book import Book
from relaxspec.engine.hooks import Block, verify_hooks
from relaxspec.engine.request import Request
from relaxspec.engine.stats import GenerationStats
from relaxspec.models.compiled import plan_static_shapes
from relaxspec.models.stream import Stream, left_pad


def _sample(logits: torch.Tensor, temperature, top_k, top_p, draws, purpose: int, offset: int = 0):
    """(token, processed distribution it was drawn from); greedy takes the argmax without building
    a one-hot row (and draws nothing), and returns None for the distribution."""
    if is_greedy(temperature):
        return logits.argmax(dim=-1), None
    probs = process_logits_unchecked(logits, temperature, top_k, top_p)  # settings checked once by the request
    return draws.sample(probs, purpose, offset), probs


class Decoding:
    """What both strategies share: the setup of a call (padded prompts, compiled shapes, book, stats), the
    rows' random streams and the verifier's stream, and dropping the rows that ended."""

    def __init__(self, request: Request):
        self.request = r = request
        N = r.draft_length
        if r.device.type == "cpu":
            native.tune_allocator()  # (once per process: a round's temporaries reuse memory, no page faults)
        self.ids, self.mask = left_pad(r.encoded, r.verifier.tokenizer, r.device)
        # compiled models: static cache capacity and step widths of this call (models/compiled.py)
        plan_static_shapes(r.verifier, r.drafter_lm, self.ids.shape[1] + r.max_new_tokens + N + 1, N + 1)
        B = self.ids.shape[0]
        self.book = Book(B, N, r.max_new_tokens, r.verifier.eos_token_id, r.device, trace=r.rule is not None)
        self.stats = GenerationStats(draft_length=N, sequences=B)
        self.sampling, self.greedy = r.sampling, is_greedy(r.sampling["temperature"])
        self.drawn = not self.greedy or (r.step is not None and r.step.draws)

    def prefill(self, hidden_layer=None):
        """Prefill the verifier with all but the last prompt token (that one, `last`, is fed by round one); the
        hidden states of `hidden_layer` (None: none)."""
        self.target = Stream(self.request.verifier)
        return self.target.prefill(self.ids[:, :-1], self.mask[:, :-1], hidden_layer=hidden_layer)

    def draws(self, width: int):
        """The round's draws: each row's random stream from its next position (None when greedy, unless the rule's
        greedy test draws)."""
        return self.seeds.at(None, width, host_start=self.book.length) if self.drawn else None

    def select(self, last: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Keep only `rows` (those still live) of `last` and of every per-row state."""
        keep = torch.tensor(rows, dtype=torch.long, device=self.request.device)
        self.keep_rows(keep, rows)
        return last[keep]

    def keep_rows(self, keep: torch.Tensor, rows: list[int]) -> None:
        self.seeds.select(keep)
        self.target.select(keep)

    def warnings(self) -> list[str]:
        return []

    def rule_state(self) -> dict[str, list[float]]:
        """The rule's per-sequence state at the end of the call (`Rule.state`), one value per sequence in prompt
        order: {} for a rule without one (and AR)."""
        return {}


class Autoregressive(Decoding):
    """method="ar": one token per round, sampled from the verifier's logits."""

    def start(self) -> torch.Tensor:
        self.prefill()
        self.seeds = SequenceSeeds(self.request.seeds, self.request.device)
        return self.ids[:, -1:].clone()  # [B, 1], the block round one feeds

    def round(self, last: torch.Tensor) -> torch.Tensor:
        book, stats = self.book, self.stats
        book.drafted(0)  # (the book logs the round's drafts)
        draws = self.draws(0)
        t0 = time.perf_counter()
        logits, _ = self.target.feed(last)
        token, _ = _sample(logits[:, -1], **self.sampling, draws=draws, purpose=TOKEN)
        stats.verifier_forwards += 1
        stats.time_verify_s += time.perf_counter() - t0
        tokens = token[:, None]
        done = book.record(tokens)  # the round's one copy to the host
        return tokens if done is None else self.select(tokens, done)


class Speculative(Decoding):
    """A drafter proposes (as many tokens per row as its drafting policy decides), the verifier scores the block in
    one forward, the rule keeps a prefix and emits one more token (its inputs from the `hooks`: PAD's classifier,
    the phase), both roll back."""

    def __init__(self, request: Request):
        r = request
        super().__init__(r)
        self.drafter = Drafting(r.drafter, len(r.prompts), r.draft_length, r.auto, r.draft_confidence)
        self.step, self.inputs, self.hidden_layer = r.step, r.inputs, r.hidden_layer
        self.extra = r.rule.extra_draft_passes  # drafter rows beyond N (bonus position)
        self.drafter_hidden = r.drafter.needs_hidden
        self.hooks = verify_hooks(r, self.stats)
        # (each row's kept drafts and emitted token, from the round's host copy, for what reads them there)
        self.host_rounds = r.drafter.host_rounds or any(hook.host_rounds for hook in self.hooks)
        # The rule's per-sequence state (`Rule.state`, e.g. a request's spent budget), carried from round to round:
        # one value per sequence of the call, on the device; `live` says which sequence each live row is.
        self.state = r.rule.initial_state(len(r.prompts), r.device)
        self.live = torch.arange(len(r.prompts), device=r.device)

    def start(self) -> torch.Tensor:
        r = self.request
        hidden = self.prefill(self.hidden_layer if self.drafter_hidden else None)
        self.drafter.prefill(self.ids[:, :-1], self.mask[:, :-1], hidden)
        last = self.ids[:, -1].clone()
        self.seeds = SequenceSeeds(r.seeds, r.device)
        return last

    def round(self, last: torch.Tensor) -> torch.Tensor:
        """One round of every live row; each row's next `last` (the token it emitted)."""
        book, stats, drafter = self.book, self.stats, self.drafter
        # 1. propose: each row's drafts, as many as the drafter's policy decides within the row's room (so a row's
        # rounds do not depend on the other rows of the batch), with the q they were drawn from; the block is as wide
        # as the longest row's, the others' extra columns are padding (verify's num_drafts)
        lengths = drafter.lengths(book.room())
        width, num_drafts = book.drafted(lengths)
        draws = self.draws(width)
        t0 = time.perf_counter()
        proposal = drafter.propose(last, lengths, self.extra, lambda logits, i: _sample(
            logits, **self.sampling, draws=draws, purpose=DRAFT, offset=i))
        drafts = proposal.tokens
        if proposal.lengths is not None:  # rows that stopped early drafted fewer (the block may be narrower)
            width, num_drafts = book.drafted(proposal.lengths)
        stats.drafter_forwards += proposal.forwards
        t1 = time.perf_counter()
        stats.time_draft_s += t1 - t0

        # 2. verifier feed: [last, x_1..x_n] in one forward
        target_logits, hidden = self.target.feed(torch.cat([last[:, None], drafts], dim=1),
                                                 hidden_layer=self.hidden_layer)
        stats.verifier_forwards += 1

        # 3. verify: the rule keeps n drafts per row and emits one more token (its inputs from the hooks)
        params = dict(self.inputs)
        block = Block(drafts, target_logits, proposal.logits, hidden, book.proposed)
        for hook in self.hooks:
            params.update(hook.inputs(block))
        params.update({name: value[self.live] for name, value in self.state.items()})
        results = self.step(target_logits, proposal.logits, drafts, random=draws, draft_probs=proposal.probs,
                            num_drafts=num_drafts, **params)
        for name, value in self.state.items():  # (on the device: read once, at the end of the call)
            value[self.live] = results.state[name].to(value.dtype)
        accepted = results.num_accepted
        stats.time_verify_s += time.perf_counter() - t1

        # 4. record: the round's one copy to the host (what each row appended, whether it is done)
        done = book.record(results.tokens, accepted, drafts, results.relaxed_only, inputs_ok=results.inputs_ok)
        if book.inputs_failed:  # a rule input out of range this round (the round is not logged)
            raise self.step.input_error(**params)

        # 5. rollback: both to `last` + the accepted drafts (the drafter gets the verifier's hidden states of the
        # block when it drafts from them); one row keeps what the host's `longest_kept` says
        self.target.invalidate_tail(None if accepted.shape[0] == 1 else accepted + 1, width + 1,
                                    longest=book.longest_kept)
        rounds = book.last_round() if self.host_rounds else None
        drafter.rollback(accepted, hidden if self.drafter_hidden else None, book.kept, rounds)
        for hook in self.hooks:
            hook.advance(rounds)
        last = results.last_token
        return last if done is None else self.select(last, done)

    def keep_rows(self, keep: torch.Tensor, rows: list[int]) -> None:
        super().keep_rows(keep, rows)
        self.drafter.select(keep, rows)
        self.live = self.live[keep]
        for hook in self.hooks:
            hook.select(rows)

    def rule_state(self) -> dict[str, list[float]]:
        return {name: value.tolist() for name, value in self.state.items()}

    def warnings(self) -> list[str]:
        return [message for message in (hook.warning() for hook in self.hooks) if message]

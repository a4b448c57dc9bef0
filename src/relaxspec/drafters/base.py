"""Drafters: what proposes the tokens a verifier checks (docs/design.md, "Drafters").

The engine talks to every drafter through one small protocol, as transformers' `CandidateGenerator`:

    drafter.prefill(ids, mask, hidden)        the prompt, less its last token (left-padded rows)
    drafter.propose(last, n, extra, sample, stop=None)
                                              n tokens per live row (+ `extra` rows of logits)
    drafter.rollback(accepted, hidden, longest, rounds=None)
                                              keep `last` and the first accepted[b] drafts
    drafter.select(rows)                      rows leave the batch

`sample(logits, i)` is the engine's: it draws the token at draft offset i from the engine's
per-sequence random streams (so outputs stay batch invariant and coupled across methods) and
returns (tokens, processed probabilities, or None when greedy). `stop(i, logits, tokens, probs)`, when
given, is the drafting policy's (drafters/policy.py): a drafting loop calls it after draft i (not after the
last of the n) and, when it returns True, proposes only those i + 1 drafts (and then its `extra` rows): the
per-row early stop (draft_confidence) ends the loop once every row has stopped. A drafter without a distribution
(prompt lookup) returns one-hot logits: 0 at its token and -inf elsewhere, so every rule sees
q = one-hot; it has no loop to stop (its confidence is 1: `stop` never applies to it). Hidden-state
drafters name the verifier blocks they read in `hidden_layers` (e.g. (-1,): the last hidden state;
several: their states concatenated, EAGLE-3's fused features): the engine then hands them those hidden
states of the prompt and of every verified block. `longest` is accepted.max() when the caller has it on the
host (the engine does: one copy per round), so a drafter needs no device sync for it; a drafter whose work is on
the host (prompt lookup) sets `host_rounds` and gets `rounds` too: each row's kept drafts, then the token it
emitted (the next `last`), from that copy.

Kinds: `LMDrafter` (a causal LM sharing the verifier's vocabulary), `NgramDrafter` (prompt
lookup), and `relaxspec.drafters.mtp.MTPDrafter` (a head on the verifier's hidden states).
`load_drafter(name, verifier)` (drafters/load.py) builds any of them from a name. How many tokens each row
proposes (N, draft_length="auto", the confidence stop) is the drafting policy's: `drafters.policy.Drafting`
holds a drafter with its policy for one generate call.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
import torch

from relaxspec.models.hf import CausalLM, check_same_vocab, hidden_blocks
from relaxspec.models.stream import Stream, model_device


@dataclass
class Proposal:
    tokens: torch.Tensor  # [B, n] long
    logits: torch.Tensor  # [B, n + extra, V] float32 (one-hot drafters: 0 at the token, -inf elsewhere)
    probs: torch.Tensor | None  # [B, n, V] processed q the tokens were drawn from (None: verify derives it)
    forwards: int  # drafter forward passes this round took (0 for prompt lookup)
    lengths: np.ndarray | None = None  # [B] each row's number of drafts when a stop cut some (None: as asked)


class Drafter:
    """The protocol (see the module docstring). Subclasses set these class attributes."""

    kind = ""
    name = ""
    hidden_layers: tuple[int, ...] = ()  # verifier blocks whose hidden states prefill/rollback want (concatenated)
    one_hot_q = False  # proposes tokens without a distribution of its own
    max_extra_passes = 1  # drafter rows it can give beyond the N drafts (spec-cont-dec's bonus row)
    host_rounds = False  # rollback wants `rounds`: each row's round on the host, from the engine's copy

    @property
    def needs_hidden(self) -> bool:
        return bool(self.hidden_layers)

    def check(self, verifier: CausalLM, rule) -> None:
        """ValueError if this drafter cannot serve `verifier` under `rule`."""
        refused = self.refusal(rule, self.name)
        if refused:
            raise ValueError(refused)

    @classmethod
    def refusal(cls, rule, name: str) -> str | None:
        """Why a drafter of this class (named `name`) cannot serve `rule` whatever the verifier, or None: known before
        any model loads."""
        if rule.extra_draft_passes > cls.max_extra_passes:
            return (f"method {rule.name!r} needs the drafter's distribution at the bonus position, which a "
                    f"{cls.kind} drafter ({name!r}) cannot give")
        if cls.one_hot_q and not rule.valid_with_one_hot_q:  # the rule declares it (see `relaxspec methods`)
            return (f"method {rule.name!r} is meaningless with a {cls.kind} drafter ({name!r}): its q is one-hot, "
                    f"and then {rule.one_hot_q}")
        return None

    def hidden_layer(self, verifier: CausalLM, pivot_layer: int | None = None) -> int | tuple[int, ...] | None:
        """The verifier layer(s) whose hidden states a round reads: this drafter's `hidden_layers`, or a pivot
        classifier's layer (`pivot_layer`; None: none) when it reads none; a ValueError when both read, different
        blocks."""
        if not self.needs_hidden:
            return pivot_layer
        layers = self.hidden_layers
        if pivot_layer is not None and hidden_blocks(pivot_layer, verifier.num_layers) != hidden_blocks(
                layers, verifier.num_layers):
            raise ValueError(f"a {self.kind} drafter reads the verifier's hidden states of blocks {list(layers)}; "
                             f"a pivot classifier on layer {pivot_layer} cannot run with it")
        return layers

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    def propose(self, last: torch.Tensor, n: int, extra: int, sample, stop=None) -> Proposal:
        raise NotImplementedError

    def rollback(self, accepted: torch.Tensor, hidden: torch.Tensor | None = None, longest: int | None = None,
                 rounds: list[list[int]] | None = None) -> None:
        raise NotImplementedError

    def select(self, rows: torch.Tensor) -> None:
        raise NotImplementedError


class LMDrafter(Drafter):
    """A standalone causal LM with its own KV cache. It never feeds its last draft x_N (nothing
    needs its logits) unless it makes the extra bonus pass, so a row that accepted all N feeds x_N
    in front of `last` next round (catch-up)."""

    kind = "lm"

    def __init__(self, lm: CausalLM):
        self.lm = lm
        self.name = lm.name
        self.stream = None

    def check(self, verifier, rule) -> None:
        check_same_vocab(verifier, self.lm)
        super().check(verifier, rule)

    def prefill(self, ids, mask, hidden=None) -> None:
        self.stream = Stream(self.lm)
        self.stream.prefill(ids.to(self.stream.device), mask.to(self.stream.device))
        self.catch_up = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)  # x_N, when not yet fed
        # Rows that accepted all their drafts last round without the extra pass have not fed x_N yet: those
        # whose `accepted` [B] equals `drafted` (accepted None: no row). any_catch_up: whether some row
        # does, known on the host (None: read it from `accepted`).
        self.accepted, self.drafted, self.any_catch_up = None, 0, False

    def propose(self, last, n, extra, sample, stop=None) -> Proposal:
        device, own = last.device, self.stream.device
        same = device == own
        # The catch-up column is only fed when some row needs it (a masked slot for the others; a batch of one
        # row needs no mask).
        with_catch_up = self.any_catch_up
        if with_catch_up is None:
            with_catch_up = self.accepted is not None and bool((self.accepted == self.drafted).any())
        feed_valid = None
        if with_catch_up:
            feed_ids = torch.stack([self.catch_up, last], dim=1)
            if last.shape[0] > 1:
                feed_valid = torch.stack([(self.accepted == self.drafted).long(), torch.ones_like(last)], dim=1)
                feed_valid = feed_valid if same else feed_valid.to(own)
        else:
            feed_ids = last[:, None]
        tokens, logits_rows, probs = [], [], []
        i = 0
        while i < n + extra:
            logits, _ = self.stream.feed(feed_ids if same else feed_ids.to(own), feed_valid)
            logits = logits[:, -1] if same else logits[:, -1].to(device)
            logits_rows.append(logits)
            if i < n:
                token, p = sample(logits, i)
                tokens.append(token)
                probs.append(p)
                feed_ids, feed_valid = token[:, None], None
                if stop is not None and i + 1 < n and stop(i, logits, token, p):
                    n = i + 1  # every row has stopped drafting
            i += 1
        self._fed = (1 + int(with_catch_up), n, extra)
        self.catch_up = tokens[-1]
        return Proposal(torch.stack(tokens, dim=1), torch.stack(logits_rows, dim=1),
                        None if probs[0] is None else torch.stack(probs, dim=1), forwards=n + extra)

    def rollback(self, accepted, hidden=None, longest=None, rounds=None) -> None:
        # This round appended [catch_up?, last, x_1..x_{n-1}] (+ x_n with the extra pass).
        fed_before, n, extra = self._fed
        drafts_fed = n - 1 + extra
        if longest is not None and accepted.shape[0] == 1:  # the one row keeps what `longest` says
            keep = None
        else:
            keep = fed_before + accepted.clamp(max=drafts_fed)
            keep = keep if keep.device == self.stream.device else keep.to(self.stream.device)
        self.stream.invalidate_tail(keep, fed_before + drafts_fed,
                                    longest=None if longest is None else fed_before + min(longest, drafts_fed))
        # no row accepts more than n: with `longest` the host knows whether any row must catch up
        self.accepted, self.drafted = (None, 0) if extra else (accepted, n)
        self.any_catch_up = False if extra else None if longest is None else longest == n

    def select(self, rows) -> None:
        self.stream.select(rows.to(self.stream.device))
        self.catch_up = self.catch_up[rows]
        if self.accepted is not None:
            self.accepted, self.any_catch_up = self.accepted[rows], None


def one_hot_logits(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., V] logits 0 at `tokens` and -inf elsewhere: every processing of them gives one-hot q."""
    logits = torch.full((*tokens.shape, vocab_size), float("-inf"), device=tokens.device)
    return logits.scatter_(-1, tokens.unsqueeze(-1), 0.0)


class NgramDrafter(Drafter):
    """Prompt lookup (HF `prompt_lookup_num_tokens`, vLLM `ngram`): find the most recent earlier
    occurrence of the row's last k tokens (k = max_n down to min_n) in the prompt and the text so
    far, and propose the tokens that followed it; when they run out, look up again on the text
    extended by the proposal. Nothing found: repeat the last token (free, valid, and right on
    repetitive text). q is one-hot; no forward passes. Its texts are host lists: the engine's host copy of each
    round (`rounds`) extends them, so a round reads nothing from the device (but `last` in the first one)."""

    kind = "ngram"
    one_hot_q = True
    max_extra_passes = 0
    host_rounds = True

    def __init__(self, vocab_size: int, max_n: int = 3, min_n: int = 1, name: str = "ngram"):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram drafter: need 1 <= min <= n, got min={min_n}, n={max_n}")
        self.vocab_size, self.max_n, self.min_n, self.name = vocab_size, max_n, min_n, name

    def prefill(self, ids, mask, hidden=None) -> None:
        self.texts = [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu())]
        self._last = None  # each row's `last` on the host, once a rollback's `rounds` gave it

    def _continuation(self, text: list[int], want: int) -> list[int]:
        """Up to `want` tokens that followed the most recent earlier match of text's longest suffix."""
        arr = np.asarray(text)
        for k in range(min(self.max_n, len(text) - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], k)  # starts 0..L-1-k: not the suffix itself
            hits = np.flatnonzero((windows == arr[-k:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + k
                return text[start:start + want]
        return []

    def propose(self, last, n, extra, sample, stop=None) -> Proposal:
        if self._last is None:
            self._last = last.tolist()
        rows = []
        for text, token in zip(self.texts, self._last):
            context = text + [token]
            proposal: list[int] = []
            while len(proposal) < n:
                more = self._continuation(context + proposal, n - len(proposal)) or [(context + proposal)[-1]]
                proposal.extend(more)
            rows.append(proposal)
        self._proposed = rows
        tokens = torch.tensor(rows, dtype=torch.long, device=last.device)
        return Proposal(tokens, one_hot_logits(tokens, self.vocab_size), None, forwards=0)

    def rollback(self, accepted, hidden=None, longest=None, rounds=None) -> None:
        kept = ([row[:-1] for row in rounds] if rounds is not None
                else [proposal[:n] for proposal, n in zip(self._proposed, accepted.tolist())])
        for text, token, drafts in zip(self.texts, self._last, kept):
            text.append(token)
            text.extend(drafts)
        # the next `last`: the emitted tokens, from the host copy (without it, read at the next proposal)
        self._last = None if rounds is None else [row[-1] for row in rounds]

    def select(self, rows) -> None:
        rows = rows.tolist()
        self.texts = [self.texts[r] for r in rows]
        if self._last is not None:
            self._last = [self._last[r] for r in rows]


def parse_ngram(spec: str) -> dict:
    """'ngram', 'ngram:n=3' or 'ngram:n=4,min=2' -> NgramDrafter keyword arguments."""
    _, _, options = spec.partition(":")
    kwargs = {}
    for item in filter(None, options.split(",")):
        key, sep, value = item.partition("=")
        names = {"n": "max_n", "max": "max_n", "min": "min_n"}
        if not sep or key.strip() not in names or not value.strip().isdigit():
            raise ValueError(f"drafter {spec!r}: expected ngram[:n=N][,min=M] with integer N, M >= 1")
        kwargs[names[key.strip()]] = int(value)
    return kwargs


@torch.inference_mode()
def measure_draft_latency(drafter: Drafter, verifier: CausalLM, context: int = 128, n: int = 5,
                          rounds: int = 30) -> float:
    """Median seconds per drafted token, batch 1, through the protocol (`draft_timer`, alone). Over
    `measure_step_latency(verifier)` this is the drafter's c_rel, for any kind; the bench takes c_rel with
    the timer interleaved with the verifier's step instead (bench.cell.speed_constants)."""
    from relaxspec.models.hf import step_clock

    timer = draft_timer(drafter, verifier, context, n)
    clock = step_clock(model_device(verifier))
    return statistics.median([timer(clock) for _ in range(rounds + 3)][3:])


@torch.inference_mode()
def draft_timer(drafter: Drafter, verifier: CausalLM, context: int = 128, n: int = 5):
    """A step for `measure_step_latencies`: prefill `context` tokens, then each call proposes n greedily
    (timed: seconds per drafted token on the clock it is given) and rolls back to 2 accepted (untimed), so the
    context grows as in a real run."""
    from relaxspec.models.hf import synchronize

    device = model_device(verifier)
    ids = torch.randint(2, verifier.vocab_size, (1, context + 1), device=device)
    mask = torch.ones_like(ids)
    hidden = None
    if drafter.needs_hidden:
        positions = torch.arange(context, device=device)[None]
        _, hidden = verifier.forward(ids[:, :-1], verifier.new_cache(), mask[:, :-1], positions,
                                     hidden_layer=drafter.hidden_layers, logits=False)
    drafter.prefill(ids[:, :-1], mask[:, :-1], hidden)
    block_hidden = None if hidden is None else hidden[:, -1:].expand(1, n + 1, -1)
    accepted = torch.tensor([2], device=device)

    def timer(clock) -> float:
        synchronize(device)
        t = clock()
        drafter.propose(ids[:, -1], n, 0, lambda logits, i: (logits.argmax(dim=-1), None))
        synchronize(device)
        seconds = (clock() - t) / n
        drafter.rollback(accepted, block_hidden)
        return seconds

    return timer

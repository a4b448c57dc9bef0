"""The book of a generate call: each live row's output length and a log of the rounds, from one copy of each
round's outcome to the host (numpy, vectorised over the rows); the outputs, the counts of GenerationStats and the
`--show` trace are assembled from that log once at the end."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from relaxspec.drafters.policy import block_width
from relaxspec.engine.stats import GenerationStats


@dataclass
class Round:
    """One verify step of one sequence, kept for `--show`."""

    drafts: list[int]  # the drafts this sequence proposed (fewer than N near the length limit)
    num_accepted: int  # drafts verify kept (an EOS among them cuts the output there)
    emitted: int  # the residual-or-bonus token
    relaxed_only: list[bool]  # accepted although the strict test (same uniform) would have rejected
    tokens: int = 0  # tokens this round emitted (an ending EOS included): sum over rounds = stats.emitted_tokens


class Book:
    """Per-sequence bookkeeping of a generate call (see the module doc)."""

    def __init__(self, B: int, N: int, max_new_tokens: int, eos: int | None, device, trace: bool):
        self.N, self.max_new_tokens, self.eos, self.device, self.trace = N, max_new_tokens, eos, device, trace
        self.B = B
        self.live = np.arange(B)  # the sequence of each live row
        self.length = np.zeros(B, dtype=np.int64)  # each live row's output tokens so far (an ending EOS is not one)
        self.longest = 0  # the most output tokens of a live row (on the host: whether every row has room for N)
        self.positions = np.arange(N + 1)
        self.log = []  # per round: rows, accepted, tokens, drafts proposed, tokens emitted, appended, drafts, relaxed
        self.longest_kept = 0  # the most slots a live row keeps of this round's verifier block
        self.kept = np.zeros(B, dtype=np.int64)  # each row's kept drafts of the round last recorded (its host copy)
        self.inputs_failed = False  # a rule input of the last round recorded was out of range (`record`'s inputs_ok)

    @property
    def live_count(self) -> int:
        return len(self.live)

    def room(self) -> int | np.ndarray:
        """Each live row's most drafts this round: its room minus one (a round emits up to n + 1 tokens), and N; an
        int when every row has room for N."""
        if self.max_new_tokens - self.longest - 1 >= self.N:  # every row may draft N (AR: 0)
            return self.N
        return np.minimum(np.maximum(self.max_new_tokens - self.length - 1, 0), self.N)

    def drafted(self, lengths: int | np.ndarray) -> tuple[int, torch.Tensor | None]:
        """(block width, each row's number of drafts or None when all draft that many) for rows drafting
        `lengths` (an int: every row that many; [L]: each its own), the round's drafts proposed."""
        width = block_width(lengths)
        if not isinstance(lengths, np.ndarray) or (lengths == width).all():
            self.proposed = width
            return width, None
        self.proposed = lengths
        return width, torch.from_numpy(lengths).to(self.device)

    def limits(self) -> np.ndarray:
        """Each live row's number of drafts this round, from the last `drafted`."""
        return np.broadcast_to(self.proposed, (self.live_count,)).copy()

    def record(self, tokens, accepted=None, drafts=None, relaxed_only=None, inputs_ok=None) -> list[int] | None:
        """Log each live row's round (tokens [L, C]: the kept drafts, then the emitted token; accepted [L], None
        for AR (C = 1, no drafts); for the trace, the round's drafts and relaxed_only [L, C - 1]); returns the
        rows that stay live, or None if all do. inputs_ok [L] (bool; None: none to read) rides on the same copy:
        `inputs_failed` says whether a row's was False (the round is then not logged)."""
        width, pad = tokens.shape[1] - 1, self.N - tokens.shape[1] + 1
        if accepted is None:  # AR: its host row [n = 0, token] is made there
            host = tokens.cpu().numpy()  # the round's one copy to the host
            host = np.concatenate([np.zeros_like(host), host], axis=1)
        else:
            parts = [accepted[:, None], tokens]
            if drafts is not None:
                parts += [drafts, relaxed_only]  # (cat promotes the bools to long)
            if pad:  # a fixed layout, so that the log is one array at the end: [n, tokens, drafts, relaxed] padded to N
                filler = tokens.new_zeros((tokens.shape[0], pad))
                parts = parts[:2] + [filler] + parts[2:3] + [filler] + parts[3:] + [filler]
            if inputs_ok is not None:
                parts.append(inputs_ok[:, None])
            # the round's one copy to the host (CPU tensors: their numpy views, concatenated there)
            host = (np.concatenate([part.numpy() for part in parts], axis=1, dtype=np.int64) if tokens.is_cpu
                    else torch.cat(parts, dim=1).cpu().numpy())
        self.inputs_failed = False
        if inputs_ok is not None:
            host, self.inputs_failed = host[:, :-1], not host[:, -1].all()
            if self.inputs_failed:
                return None
        rows, n, tokens = self.live, host[:, 0], host[:, 1:width + 2]
        appended = emitted = n + 1  # (a row drafts at most its room minus one: its n + 1 tokens fit the length limit)
        stop = None
        if self.eos is not None:  # an EOS ends the output (it is emitted, not appended)
            is_eos = tokens == self.eos
            if is_eos.any():
                is_eos &= self.positions[:width + 1] < appended[:, None]
                stop = is_eos.any(axis=1)
                appended = np.where(stop, is_eos.argmax(axis=1), appended)
                emitted = appended + stop
        self.length = length = self.length + appended
        self.kept = n
        self.log.append((rows, self.proposed, emitted, appended, host))  # proposed: an int, or one per row
        self.longest_kept = int(n.max()) + 1
        self.longest = int(length.max())
        if stop is None and self.longest < self.max_new_tokens:
            return None
        done = length >= self.max_new_tokens
        if stop is not None:
            done |= stop
        if not done.any():
            return None
        keep = np.flatnonzero(~done)
        self.live, self.length = rows[keep], length[keep]
        self.longest = int(self.length.max()) if keep.size else 0
        return keep.tolist()

    def last_round(self) -> list[list[int]]:
        """Each row of the round just recorded: its kept drafts and the token it emitted, read from that
        round's host copy (no second copy of the tensors)."""
        host = self.log[-1][4]
        return [row[1:n + 2] for row, n in zip(host.tolist(), host[:, 0].tolist())]

    def results(self) -> tuple[list[list[int]], list[GenerationStats], list[list[Round]]]:
        """Per sequence: output tokens, GenerationStats and trace."""
        B, N = self.B, self.N
        outputs: list[list[int]] = [[] for _ in range(B)]
        traces: list[list[Round]] = [[] for _ in range(B)]
        rows, proposed, emitted, appended, host = (np.concatenate([
            np.broadcast_to(entry[i], entry[0].shape) if i == 1 else entry[i] for entry in self.log]) for i in range(5))
        n = host[:, 0]
        columns = (host[:, 1:N + 2], host[:, N + 2:2 * N + 2], host[:, 2 * N + 2:].astype(bool))
        lists = [a.tolist() for a in (rows, n, proposed, emitted, appended, *columns)]
        for seq, kept, k, count, length, tokens, drafts, flags in zip(*lists):
            outputs[seq].extend(tokens[:length])
            if self.trace:
                traces[seq].append(Round(drafts=drafts[:k], num_accepted=kept, emitted=tokens[kept],
                                         relaxed_only=flags[:k], tokens=count))
        counted = np.minimum(n, emitted)  # kept drafts that reached the output (not cut by an EOS before them)

        def per_sequence(values, width=None):
            total = np.zeros((B,) if width is None else (B, width), dtype=np.int64)
            np.add.at(total, rows, values)
            return total.tolist()

        rounds, emitted_total = per_sequence(np.ones_like(n)), per_sequence(emitted)
        proposed_total, accepted, cut = per_sequence(proposed), per_sequence(counted), per_sequence(n - counted)
        position = np.arange(N)
        per_proposed = per_sequence(position < proposed[:, None], N)
        per_accepted = per_sequence(position < counted[:, None], N)
        stats = [GenerationStats(draft_length=N, sequences=1, sequence_rounds=rounds[b], drafts_proposed=proposed_total[b],
                                 drafts_accepted=accepted[b], drafts_cut=cut[b], generated_tokens=len(outputs[b]),
                                 emitted_tokens=emitted_total[b], proposed_per_position=per_proposed[b],
                                 accepted_per_position=per_accepted[b]) for b in range(B)]
        return outputs, stats, traces

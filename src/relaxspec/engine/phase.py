"""Phase-aware relaxation: relax only inside a span of the response, strict outside.

A `Phase` names the span by two markers, each a token string or a token id: `begin` opens it (None: the
response starts inside it), `end` closes it (None: it never closes). The default is the reasoning span,
`<think>` ... `</think>` (TensorRT-LLM's `use_relaxed_acceptance_for_thinking`, SGLang's `--speculative-relaxed-thinking`
pull requests, vLLM pull request #43184); it needs a tokenizer that has those tokens.

`PhaseTracker` keeps each sequence's state (inside or not) and gives `verify` its `relax` mask [B, N+1]: a token
is decided by the rule where the tokens before it (prompt, output so far, the drafts before it) leave the
sequence inside the span, and by strict elsewhere. So the phase can change inside a draft block: the drafts after
a drafted end marker are verified strictly (the marker itself, generated inside, still by the rule). A string
marker is found in the text of the tokens decoded one by one (so "The answer is" matches however it was split into
tokens); an id marker matches that token. The state at the response's start is the last marker in the prompt
(inside after a begin marker, as a chat template ending in `<think>` leaves it), or inside when `begin` is None.

Spec strings (`--phase`, bench and tune settings): "think", or "BEGIN..END" with either side empty ("..The answer
is": from the response's start until "The answer is"); "#123" as a marker is token id 123.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

THINK = "think"
TASK = "task"  # the task's own span (`relaxspec.tasks.relax_span`), resolved by the bench and tune
THINK_BEGIN, THINK_END = "<think>", "</think>"


@dataclass(frozen=True)
class Phase:
    begin: str | int | None = THINK_BEGIN
    end: str | int | None = THINK_END

    def __str__(self) -> str:
        return f"{_marker_text(self.begin)}..{_marker_text(self.end)}"


def _marker_text(marker) -> str:
    return "" if marker is None else f"#{marker}" if isinstance(marker, int) else marker


def _marker(text: str, spec: str):
    if text.startswith("#") and text[1:].isdigit():
        return int(text[1:])
    return text or None


def parse_phase(spec) -> Phase | None:
    """A Phase from None, a Phase, a (begin, end) pair, or a spec string; ValueError for anything else."""
    if spec is None or isinstance(spec, Phase):
        phase = spec
    elif isinstance(spec, str):
        if spec == THINK:
            phase = Phase()
        elif spec == TASK:
            raise ValueError("phase 'task' needs a task: bench and tune resolve it to the task's span; "
                             "elsewhere give the markers ('BEGIN..END')")
        elif ".." in spec:
            begin, _, end = spec.partition("..")
            phase = Phase(_marker(begin, spec), _marker(end, spec))
        else:
            raise ValueError(f"phase must be 'think' or 'BEGIN..END' (either side may be empty; #ID is a token id), "
                             f"got {spec!r}")
    elif isinstance(spec, (tuple, list)) and len(spec) == 2:
        phase = Phase(*spec)
    else:
        raise ValueError(f"phase must be None, a Phase, a (begin, end) pair or a spec string, got {spec!r}")
    if phase is not None:
        for marker in (phase.begin, phase.end):
            ok = marker is None or (isinstance(marker, str) and marker) or (
                isinstance(marker, numbers.Integral) and not isinstance(marker, bool) and marker >= 0)
            if not ok:
                raise ValueError(f"phase markers must be non-empty token strings, token ids >= 0 or None, got {marker!r}")
        if phase.begin is None and phase.end is None:
            raise ValueError("phase: give a begin marker, an end marker or both (none relaxes everywhere: omit phase)")
    return phase


def check_phase(phase: Phase, tokenizer) -> None:
    """ValueError when the tokenizer cannot produce a marker: an id outside its vocabulary, or the default
    <think> / </think> that it does not have as tokens."""
    size = len(tokenizer)
    for marker in (phase.begin, phase.end):
        if isinstance(marker, int) and marker >= size:
            raise ValueError(f"phase marker #{marker} is not a token id of the verifier's tokenizer (size {size})")
    if phase == Phase():
        vocab = tokenizer.get_vocab()
        if THINK_BEGIN not in vocab or THINK_END not in vocab:
            raise ValueError("phase 'think': the verifier's tokenizer has no <think> / </think> tokens; "
                             "give the span's markers instead ('BEGIN..END')")


class PhaseTracker:
    """Per-sequence phase state of a batch (see the module doc)."""

    def __init__(self, phase: Phase, tokenizer, prompts: list[list[int]]):
        self.phase, self.tokenizer = phase, tokenizer
        texts = [m for m in (phase.begin, phase.end) if isinstance(m, str)]
        self.keep = max(map(len, texts), default=1) - 1  # characters of text a marker can straddle
        self._pieces: dict[int, str] = {}
        self.inside, self.tail = [], []
        for ids in prompts:
            inside, tail = False, ""
            for token in ids:
                inside, tail = self._step(inside, tail, token)
            self.inside.append(True if phase.begin is None else inside)
            self.tail.append(tail)

    def _piece(self, token: int) -> str:
        if token not in self._pieces:
            self._pieces[token] = self.tokenizer.decode([token])
        return self._pieces[token]

    def _hit(self, marker, token: int, text: str, new: int):
        """Where in `text` the marker ends if this token completes it (the new piece starts at `new`), else -1."""
        if marker is None:
            return -1
        if isinstance(marker, int):
            return len(text) if token == marker else -1
        at = text.rfind(marker, max(0, new - len(marker) + 1))
        return at + len(marker) if at >= 0 else -1

    def _step(self, inside: bool, tail: str, token: int) -> tuple[bool, str]:
        text = tail + self._piece(token) if self.keep else ""
        opened = self._hit(self.phase.begin, token, text, len(tail))
        closed = self._hit(self.phase.end, token, text, len(tail))
        if opened >= 0 or closed >= 0:
            inside = opened > closed  # both in one token: the later one wins (a tie closes)
        return inside, text[-self.keep:] if self.keep else ""

    def relax(self, drafts: list[list[int]]) -> list[list[bool]]:
        """[B][N+1]: whether the rule decides draft position i (i < N) and the bonus position (i = N)."""
        out = []
        for b, row in enumerate(drafts):
            inside, tail = self.inside[b], self.tail[b]
            flags = [inside]
            for token in row:
                inside, tail = self._step(inside, tail, token)
                flags.append(inside)
            out.append(flags)
        return out

    def advance(self, emitted: list[list[int]]) -> None:
        """Commit each row's emitted tokens (its accepted drafts and the last token)."""
        for b, row in enumerate(emitted):
            for token in row:
                self.inside[b], self.tail[b] = self._step(self.inside[b], self.tail[b], token)

    def select(self, keep: list[int]) -> None:
        self.inside = [self.inside[b] for b in keep]
        self.tail = [self.tail[b] for b in keep]

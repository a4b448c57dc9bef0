"""Where the random numbers of speculative decoding come from (docs/design.md, "Coupled randomness").

Two sources with one interface, `Draws`:

* `CounterDraws` (what the engine uses): every draw of a sequence is a pure function of
  (the sequence's 63-bit seed, the absolute output position the draw is for, its purpose),
  computed by a counter-based hash on the tensors' own device. Nothing depends on the
  batch a sequence runs in or on the order of calls, so a sequence's output is batch
  invariant, and two methods run with the same seed share every draw at every position
  (common random numbers: they emit the same tokens until their first differing decision).
* `GeneratorDraws`: a plain `torch.Generator` (or the global one), for `verify` used on its
  own, where there is no notion of an output position.

The hash is Wellons' "lowbias32" (two xor-shift-multiply rounds on 32-bit words), chained
over the key words. It is written with int64 tensor ops that never overflow, so it gives
the same bits on every device. Uniforms for acceptance tests take 24 bits (float32); the
uniform that picks a token by inverse CDF takes 53 bits from two hashes (float64 where the
device has it).
"""

from __future__ import annotations

from typing import Sequence

import torch

from relaxspec.acceptance.processing import sample_rows, sample_with_uniform

_MASK32 = 0xFFFFFFFF
_MASK63 = (1 << 63) - 1

# What a draw is for. A sequence consumes at most one draw of each purpose per output position.
DRAFT = 1  # the drafter's sample of the token at this position
ACCEPT = 2  # the acceptance uniform of the draft at this position
TOKEN = 3  # the verifier-side sample at this position: residual, bonus, or an AR step


def derive_seed(*keys: int) -> int:
    """A 63-bit seed mixed from integer keys (splitmix64 chained), e.g.
    derive_seed(call_seed, prompt_index) or derive_seed(bench_seed, prompt, repeat)."""
    state = 0x9E3779B97F4A7C15
    for key in keys:
        state = _splitmix64((state ^ (int(key) & ((1 << 64) - 1))) & ((1 << 64) - 1))
    return state & _MASK63


def _splitmix64(x: int) -> int:
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x * m) mod 2^32 for int64 x in [0, 2^32), without overflowing int64."""
    low = (x & 0xFFFF) * m
    high = ((x >> 16) * m) & 0xFFFF
    return (low + (high << 16)) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


class Draws:
    """The draws one verify block (or one drafting / AR step) consumes.

    `uniform(purpose, width)` gives [B, width] uniforms in [0, 1), one per position
    start..start+width-1 of each row; `sample(weights, purpose, offset)` picks one index per
    row of non-negative weights [B, V] with the uniform at position start + offset[b]."""

    def uniform(self, purpose: int, width: int, dtype=torch.float32) -> torch.Tensor:
        raise NotImplementedError

    def sample(self, weights: torch.Tensor, purpose: int, offset: torch.Tensor | int = 0) -> torch.Tensor:
        raise NotImplementedError


class GeneratorDraws(Draws):
    """Draws from a torch.Generator in call order (None: torch's global generator)."""

    def __init__(self, generator: torch.Generator | None, batch_size: int, device):
        self.generator = generator
        self.batch_size = batch_size
        self.device = device

    def uniform(self, purpose: int, width: int, dtype=torch.float32) -> torch.Tensor:
        return torch.rand((self.batch_size, width), generator=self.generator, device=self.device, dtype=dtype)

    def sample(self, weights, purpose, offset=0):
        return sample_rows(weights, self.generator)


class CounterDraws(Draws):
    """Counter-based draws for B sequences whose next output position is `start[b]`."""

    def __init__(self, seeds_low: torch.Tensor, seeds_high: torch.Tensor, start: torch.Tensor):
        self.low, self.high, self.start = seeds_low, seeds_high, start

    def _bits(self, purpose: int, positions: torch.Tensor, word: int) -> torch.Tensor:
        """32 random bits per (row, position): [B, K] int64 for positions [B, K]."""
        h = _hash32(self.low.unsqueeze(-1) ^ ((purpose * 0x9E3779B9 + word * 0x85EBCA6B) & _MASK32))
        h = _hash32(h ^ self.high.unsqueeze(-1))
        return _hash32(h ^ (positions & _MASK32))

    def uniform(self, purpose: int, width: int, dtype=torch.float32) -> torch.Tensor:
        positions = self.start.unsqueeze(-1) + torch.arange(width, device=self.start.device)
        bits = self._bits(purpose, positions, 0) >> 8  # 24 bits: exact in float32
        return bits.to(dtype) * (1.0 / (1 << 24))

    def uniform53(self, purpose: int, offset: torch.Tensor | int = 0) -> torch.Tensor:
        """[B] float64 uniforms (53 bits) at positions start + offset (float32 on mps)."""
        positions = (self.start + offset).unsqueeze(-1)
        high = (self._bits(purpose, positions, 1) >> 5).squeeze(-1)  # 27 bits
        low = (self._bits(purpose, positions, 2) >> 6).squeeze(-1)  # 26 bits
        dtype = torch.float32 if self.start.device.type == "mps" else torch.float64
        return (high.to(dtype) * float(1 << 26) + low.to(dtype)) * (1.0 / (1 << 53))

    def sample(self, weights, purpose, offset=0):
        return sample_with_uniform(weights, self.uniform53(purpose, offset))


class SequenceSeeds:
    """The seeds of the live rows of a batch, as two 32-bit halves on the batch's device."""

    def __init__(self, seeds: Sequence[int], device):
        seeds = [int(s) for s in seeds]
        for s in seeds:
            if not 0 <= s <= _MASK63:
                raise ValueError(f"a sequence seed must be an integer in [0, 2^63), got {s}")
        self.low = torch.tensor([s & _MASK32 for s in seeds], dtype=torch.long, device=device)
        self.high = torch.tensor([s >> 32 for s in seeds], dtype=torch.long, device=device)

    def at(self, start: torch.Tensor) -> CounterDraws:
        """Draws for rows whose next output position is start [B]."""
        return CounterDraws(self.low, self.high, start)

    def select(self, rows: torch.Tensor) -> None:
        self.low, self.high = self.low[rows], self.high[rows]

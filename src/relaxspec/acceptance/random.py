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

The definition (`stream_bits`, plain Python, is the reference the tensor code is tested against):
a stream (seed, purpose, word) has a 64-bit key, splitmix64 of the seed mixed with the purpose and
word, computed once per sequence on the host; the 32 bits at output position t are
lowbias32(lowbias32(key_low ^ t) ^ key_high), Wellons' "lowbias32" being two
xor-shift-multiply rounds on a 32-bit word. Both key halves enter every draw, so two sequences
share a stream only if their 64-bit keys are equal (not, as a 32-bit state would allow, one in
2^32 pairs). The tensor code uses int64 ops that never overflow, so it gives the same bits on
every device, and a round's draws (every row, position and purpose) come from one vectorised hash
(`SequenceSeeds.at(start, width)`; with the positions also on the host, as the engine has them, that hash
runs on the host in numpy (uint32 arithmetic: the same bits), the round's uniforms are made there too, and they go
to the device in one float64 copy). Uniforms for acceptance tests take 24 bits (float32, word 0);
the uniform that picks a token by inverse CDF takes 53 bits from words 1 and 2 (float64 where the
device has it).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from relaxspec.acceptance import fused
from relaxspec.acceptance.processing import cdf_dtype, sample_with_uniform

_MASK32 = 0xFFFFFFFF
_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1

# What a draw is for. A sequence consumes at most one draw of each purpose per output position.
DRAFT = 1  # the drafter's sample of the token at this position
ACCEPT = 2  # the acceptance uniform of the draft at this position
TOKEN = 3  # the verifier-side sample at this position: residual, bonus, or an AR step
PURPOSES = (DRAFT, ACCEPT, TOKEN)
WORDS = 3  # word 0: a 24-bit uniform; words 1 and 2: the two halves of a 53-bit uniform


def check_seed(seed, what: str = "seed") -> int:
    """A seed as given (an integer in [0, 2^64), where every value is a different seed), else a ValueError."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
        raise ValueError(f"{what} must be an integer in [0, 2^64), got {seed!r}")
    return seed


def derive_seed(*keys: int) -> int:
    """A 63-bit seed mixed from integer keys (splitmix64 chained), e.g.
    derive_seed(call_seed, prompt_index) or derive_seed(bench_seed, prompt, repeat). A key outside
    [0, 2^64) is a ValueError (it would otherwise wrap: 2^64 would be the same seed as 0)."""
    state = 0x9E3779B97F4A7C15
    for key in keys:
        check_seed(int(key))
        state = _splitmix64((state ^ (int(key) & _MASK64)) & _MASK64)
    return state & _MASK63


def _splitmix64(x: int) -> int:
    m = _MASK64
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def stream_key(seed: int, purpose: int, word: int) -> int:
    """The 64-bit key of stream (seed, purpose, word)."""
    return _splitmix64(seed ^ ((purpose * WORDS + word) * 0xD1B54A32D192ED03 & _MASK64))


def _lowbias32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def stream_bits(seed: int, purpose: int, word: int, position: int) -> int:
    """The 32 random bits of stream (seed, purpose, word) at output `position`: the reference definition."""
    key = stream_key(seed, purpose, word)
    return _lowbias32(_lowbias32((key & _MASK32) ^ (position & _MASK32)) ^ (key >> 32))


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """(x * m) mod 2^32 for int64 x in [0, 2^32), without overflowing int64."""
    low = (x & 0xFFFF) * m
    high = ((x >> 16) * m) & 0xFFFF
    return (low + (high << 16)) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding 32-bit words."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _bits(key_low: torch.Tensor, key_high: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`stream_bits` on int64 tensors: keys and positions of the same (broadcast) shape (`_bits_host` is the
    numpy version the engine's rounds use)."""
    return _hash32(_hash32(key_low ^ (positions & _MASK32)) ^ key_high)


def _bits_host(key_low: np.ndarray, key_high: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """`_bits` on numpy arrays in uint32 arithmetic (numpy's array products wrap mod 2^32: the same bits as
    `_mul32`, in a third of the ops): uint32 keys, int64 positions; uint32 bits."""
    x = key_low ^ (positions & _MASK32).astype(np.uint32)
    for rounds in (0, 1):
        x ^= x >> 16
        x *= np.uint32(0x7FEB352D)
        x ^= x >> 15
        x *= np.uint32(0x846CA68B)
        x ^= x >> 16
        if rounds == 0:
            x ^= key_high
    return x


def _uniform24(bits: torch.Tensor, dtype) -> torch.Tensor:
    return (bits >> 8).to(dtype) * (1.0 / (1 << 24))  # 24 bits: exact in float32


def _uniform53(high, low):
    """53-bit uniforms from two words of bits: torch tensors (float32 on mps, which has no float64) or numpy
    int64 arrays (float64). Every step is exact in float64 (27 + 26 bits, scaled by powers of 2)."""
    if isinstance(high, np.ndarray):
        return ((high >> 5).astype(np.float64) * float(1 << 26) + (low >> 6).astype(np.float64)) * (1.0 / (1 << 53))
    dtype = torch.float32 if high.device.type == "mps" else torch.float64  # mps has no float64
    return ((high >> 5).to(dtype) * float(1 << 26) + (low >> 6).to(dtype)) * (1.0 / (1 << 53))  # 27 + 26 bits


class Draws:
    """The draws one verify block (or one drafting / AR step) consumes.

    `uniform(purpose, width)` gives [B, width] uniforms in [0, 1), one per position
    start..start+width-1 of each row; `uniform53(purpose, offset)` the [B] uniforms of a sample at position
    start + offset[b] (float64; float32 on mps); `sample(weights, purpose, offset)` picks one index per
    row of non-negative weights [B, V] with them."""

    def uniform(self, purpose: int, width: int, dtype=torch.float32) -> torch.Tensor:
        raise NotImplementedError

    def uniform53(self, purpose: int, offset: torch.Tensor | int = 0) -> torch.Tensor:
        raise NotImplementedError

    def sample(self, weights: torch.Tensor, purpose: int, offset: torch.Tensor | int = 0) -> torch.Tensor:
        return sample_with_uniform(weights, self.uniform53(purpose, offset))

    def token_uniforms(self, width: int) -> torch.Tensor:
        """[B, width + 1]: column n holds what `uniform53(TOKEN, n)` gives each row, the same draw (a source whose
        draw does not depend on the offset may give one column expanded): the verify loop's token uniforms up front,
        for its one-call path (`verify`). Not defined here: a source without it takes the loop's other path."""
        raise NotImplementedError


class GeneratorDraws(Draws):
    """Draws from a torch.Generator in call order (None: torch's global generator)."""

    def __init__(self, generator: torch.Generator | None, batch_size: int, device):
        self.generator = generator
        self.batch_size = batch_size
        self.device = torch.device(device)

    def uniform(self, purpose: int, width: int, dtype=torch.float32) -> torch.Tensor:
        return torch.rand((self.batch_size, width), generator=self.generator, device=self.device, dtype=dtype)

    def uniform53(self, purpose, offset=0):
        return torch.rand((self.batch_size,), generator=self.generator, device=self.device,
                          dtype=cdf_dtype(self.device))

    def token_uniforms(self, width: int) -> torch.Tensor:
        return self.uniform53(TOKEN)[:, None].expand(self.batch_size, width + 1)  # (one draw per row, any offset)


def _round_lanes(width: int) -> list[tuple[int, int, int]]:
    """(purpose, word, positions) a round of `width` drafts reads: the drafter's 53-bit samples and the
    acceptance uniforms at offsets 0..width-1, the verifier's 53-bit sample at 0..width."""
    return [(DRAFT, 1, width), (DRAFT, 2, width), (ACCEPT, 0, width), (TOKEN, 1, width + 1), (TOKEN, 2, width + 1)]


_LAYOUTS: dict = {}  # (width, device) -> (key column, position offset) of every lane of a round
# the key columns a round's host table reads: ACCEPT word 0, DRAFT words 1 and 2, TOKEN words 1 and 2
_KEY_COLUMNS = np.array([(p - 1) * WORDS + w for p, w in ((ACCEPT, 0), (DRAFT, 1), (DRAFT, 2), (TOKEN, 1), (TOKEN, 2))])
_HOST_LAYOUTS: dict = {}  # width -> the same, in the order the host's table of uniforms is made in


class CounterDraws(Draws):
    """Counter-based draws for B sequences whose next output position is `start[b]`.

    With `width`, the draws a round of `width` drafts consumes (DRAFT and ACCEPT at offsets
    0..width-1, TOKEN at 0..width) are computed up front in one vectorised hash, and read from
    that table; draws outside it are computed on demand (same values)."""

    def __init__(self, keys_low: torch.Tensor, keys_high: torch.Tensor, start: torch.Tensor | None,
                 width: int | None = None, host: tuple | None = None):
        self.low, self.high, self._start = keys_low, keys_high, start  # keys [B, purposes * WORDS]
        self._host_start = None if host is None else host[2]  # start None: made from these when a draw needs it
        # host: (keys_low, keys_high, start) as numpy int64 arrays: the round's table is hashed there
        self._u53: dict = {}  # purpose -> [B, columns] 53-bit uniforms of the table, converted once per round
        self._u24: dict = {}  # dtype -> [B, width] the round's acceptance uniforms (when hashed on the host)
        self._table = None if width is None else self._round_table(width, host)

    @property
    def start(self) -> torch.Tensor:
        """[B] the next output position of each row, on the keys' device."""
        if self._start is None:
            self._start = torch.from_numpy(self._host_start).to(self.low.device)
        return self._start

    def _raw(self, purpose: int, word: int, positions: torch.Tensor) -> torch.Tensor:
        """32 bits per (row, position): [B, K] int64 for positions [B, K]."""
        c = (purpose - 1) * WORDS + word
        return _bits(self.low[:, c:c + 1], self.high[:, c:c + 1], positions)

    def _round_table(self, width: int, host: tuple | None = None) -> dict:
        """{(purpose, word): [B, columns] bits} for one round, from one hash over every lane (on the host
        when `host` has the keys and positions there: one copy of the bits to the device)."""
        if host is not None and self.low.device.type != "mps":
            # The uniforms themselves on the host (the same exact conversions: 24 and 53 bits fit a float64),
            # one float64 copy to the device, no conversion ops there.
            W = width
            low, high, start = host
            if fused.library() is not None:  # one C call (the same bits: tested)
                table = fused.round_table(low, high, start, W, _KEY_COLUMNS).to(self.low.device)
            else:
                if W not in _HOST_LAYOUTS:  # ACCEPT word 0, then the high words (DRAFT, TOKEN), then the low ones
                    order = [(ACCEPT, 0, W), (DRAFT, 1, W), (TOKEN, 1, W + 1), (DRAFT, 2, W), (TOKEN, 2, W + 1)]
                    _HOST_LAYOUTS[W] = (np.array([(p - 1) * WORDS + w for p, w, k in order for _ in range(k)]),
                                        np.array([i for _, _, k in order for i in range(k)]))
                columns, offsets = _HOST_LAYOUTS[W]
                bits = _bits_host(low[:, columns], high[:, columns], start[:, None] + offsets)
                table = np.empty((bits.shape[0], 3 * W + 1))
                table[:, :W] = (bits[:, :W] >> 8) * (1.0 / (1 << 24))
                table[:, W:] = _uniform53(bits[:, W:3 * W + 1], bits[:, 3 * W + 1:])
                table = torch.from_numpy(table).to(self.low.device)
            self._u24 = {torch.float64: table[:, :W]}
            self._u53[DRAFT], self._u53[TOKEN] = table[:, W:2 * W], table[:, 2 * W:]
            return {}
        lanes = _round_lanes(width)
        key = (width, None if host is not None else self.low.device)
        if key not in _LAYOUTS:
            columns = [(p - 1) * WORDS + w for p, w, k in lanes for _ in range(k)]
            offsets = [i for _, _, k in lanes for i in range(k)]
            _LAYOUTS[key] = (np.array(columns), np.array(offsets)) if host is not None else (
                torch.tensor(columns, device=self.low.device), torch.tensor(offsets, device=self.low.device))
        columns, offsets = _LAYOUTS[key]
        if host is not None:  # mps: the bits to the device, float32 uniforms made there
            low, high, start = host
            bits = torch.from_numpy(_bits_host(low[:, columns], high[:, columns], start[:, None] + offsets)
                                    .astype(np.int64))
            bits = bits.to(self.low.device)
        else:
            bits = _bits(self.low[:, columns], self.high[:, columns], self.start.unsqueeze(-1) + offsets)
        return dict(zip([(p, w) for p, w, _ in lanes], bits.split([k for _, _, k in lanes], dim=1)))

    def _words(self, purpose: int, word: int, offset: torch.Tensor | int, width: int = 1) -> torch.Tensor:
        """Bits [B, width] of (purpose, word) at positions start + offset + 0..width-1 (offset [B] or int)."""
        table = None if self._table is None else self._table.get((purpose, word))
        if table is not None and isinstance(offset, int) and offset + width <= table.shape[1]:
            return table[:, offset:offset + width]
        if table is not None and width == 1 and isinstance(offset, torch.Tensor):
            return table.gather(1, offset.unsqueeze(-1))
        positions = (self.start + offset).unsqueeze(-1) + torch.arange(width, device=self.start.device)
        return self._raw(purpose, word, positions)

    def uniform(self, purpose: int, width: int, dtype=torch.float32) -> torch.Tensor:
        if (purpose == ACCEPT and self._u24 and dtype in (torch.float32, torch.float64)
                and width <= self._u24[torch.float64].shape[1]):
            if dtype not in self._u24:  # 24-bit values: exact in float32
                self._u24[dtype] = self._u24[torch.float64].to(dtype)
            return self._u24[dtype][:, :width]
        return _uniform24(self._words(purpose, 0, 0, width), dtype)

    def uniform53(self, purpose: int, offset: torch.Tensor | int = 0) -> torch.Tensor:
        """[B] float64 uniforms (53 bits) at positions start + offset (float32 on mps)."""
        if purpose in self._u53 or self._table is not None and (purpose, 1) in self._table:
            if purpose not in self._u53:  # the round's whole lane at once (elementwise: the same values)
                self._u53[purpose] = _uniform53(self._table[(purpose, 1)], self._table[(purpose, 2)])
            table = self._u53[purpose]
            if isinstance(offset, torch.Tensor):
                return table.gather(1, offset.unsqueeze(-1)).squeeze(-1)
            if offset < table.shape[1]:
                return table[:, offset]
        return _uniform53(self._words(purpose, 1, offset), self._words(purpose, 2, offset)).squeeze(-1)

    def token_uniforms(self, width: int) -> torch.Tensor:
        if TOKEN not in self._u53 and self._table is not None and (TOKEN, 1) in self._table:
            self.uniform53(TOKEN)  # (the round's lane converted once)
        table = self._u53.get(TOKEN)
        if table is not None and table.shape[1] > width:
            return table[:, :width + 1]
        return _uniform53(self._words(TOKEN, 1, 0, width + 1), self._words(TOKEN, 2, 0, width + 1))


class SequenceSeeds:
    """The stream keys of the live rows of a batch (two 32-bit halves per purpose and word) on its device."""

    def __init__(self, seeds: Sequence[int], device):
        seeds = [int(s) for s in seeds]
        for s in seeds:
            if not 0 <= s <= _MASK63:
                raise ValueError(f"a sequence seed must be an integer in [0, 2^63), got {s}")
        keys = [[stream_key(s, p, w) for p in PURPOSES for w in range(WORDS)] for s in seeds]
        shape = (len(seeds), len(PURPOSES) * WORDS)
        self.host = (np.array([[k & _MASK32 for k in row] for row in keys], dtype=np.uint32).reshape(shape),
                     np.array([[k >> 32 for k in row] for row in keys], dtype=np.uint32).reshape(shape))
        self.low, self.high = (torch.from_numpy(keys.astype(np.int64)).to(device) for keys in self.host)

    def at(self, start: torch.Tensor | None, width: int | None = None,
           host_start: np.ndarray | None = None) -> CounterDraws:
        """Draws for rows whose next output position is start [B]; with `width`, a round of that many
        drafts' draws computed at once (on the host when `host_start`, the same positions as a numpy
        int64 array, is given; start may then be None: it is copied to the device only if a draw outside
        the round's table needs it)."""
        if start is None and host_start is None:
            raise ValueError("SequenceSeeds.at: give start (a tensor [B]) or host_start")
        host = None if host_start is None else (*self.host, np.asarray(host_start, dtype=np.int64))
        return CounterDraws(self.low, self.high, start, width, host)

    def select(self, rows: torch.Tensor) -> None:
        self.low, self.high = self.low[rows], self.high[rows]
        kept = rows.cpu().numpy()  # rows leave rarely: one copy then
        self.host = (self.host[0][kept], self.host[1][kept])

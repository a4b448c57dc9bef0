"""The CPU sampler in C: distribution processing and inverse-CDF sampling, each in one call per block of rows,
and a round's counter-stream uniforms (random.py) in one call.

On a small model the engine processes a few rows of logits many times a round (each draft, the verifier's N+1
rows, the residual / bonus sample, every AR token), and the torch path spends ~20 tiny tensor ops on each:
here a row costs one pass or a few over its V logits, in one ctypes call for all rows (`relaxspec.native`
builds the C, csrc/sampler.c, on first use; its interface: csrc/sampler.h). `processing.process_logits_unchecked` and
`processing.sample_with_uniform` call these for float32 CPU tensors when the library loaded, and keep their
torch code for everything else (other devices and dtypes, `RELAXSPEC_NATIVE=0`); tests compare the two.

* `process`: logits / temperature (float32 division, as torch), top-k (ties with the k-th value kept: the k-th
  largest from a size-k heap), top-p (the smallest most-likely set whose mass reaches top_p, ties at the cut
  kept lowest index first, the order of a stable descending sort), renormalised. Top-p never sorts: one pass
  adds each token's mass to a histogram over the float bits of max - logit (eight buckets an octave, from 2^-6
  to 32: a larger logit is never in a later bucket); walking the buckets from the max finds the one where the mass
  reaches top_p, every token before it is kept, and a quickselect on the mass (O(n) expected) picks, in that
  bucket only, the tokens the sorted walk would keep. exp in float32 of z - max as torch's softmax (Cephes'
  polynomial, written to vectorise: relaxspec/csrc/exp_nonpositive.h), sums in float64: probabilities may differ from
  torch's in the last bits.
* `sample`: the cdf in float64 in vocabulary order (the same sequential sums as torch's cumsum, so the same
  bits), index i with cdf[i-1] <= u * total < cdf[i], the target clamped strictly below the total (a
  zero-weight index is never returned): the same indices as the torch path.
* `first_rejection` and `finish`: the shared verify loop's bookkeeping (acceptance/verify.py), one call each: the
  acceptance tests up to each row's first rejection, then the emitted token (the residual, p where the residual has
  no mass, or the bonus, sampled as `sample` does) and the row of output tokens; the same results as the loop's torch
  ops, bit for bit (`loop_disabled()` sets these aside alone, the rules' libraries too, for tests and benchmarks).
  `verify_default` is both in one call for a rule that keeps strict's bonus and its residual (p - q)+ or takes argmax
  p (Rule.residual_argmax): it reads them from the blocks p and q itself (and strict's test too, for a rule that
  keeps it).
* `rule_library`: the same loop built with a rule's own math in C (`Rule.native_test`, `native_residual`,
  `native_bonus`: the rule's C file, csrc/rules/<rule>.c) in place of strict's, one library per rule: its whole
  verify step in one call
  when sampling (`verify.VerifyStep`); the rule's torch methods stay the reference (tests compare the two).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from relaxspec import native

CSRC = Path(__file__).resolve().parent / "csrc"  # the sampler's C: sampler.c, its core and loop, rule.c, rules/
KERNEL = native.Kernel("sampler", CSRC / "sampler.c", CSRC / "sampler.h")  # strict's test in the verify loop
_STRUCTS = native.structs(KERNEL.header)  # the loop kernels' arguments, filled by name (rule libraries share them)
_FIRST_REJECTION, _FINISH = _STRUCTS["rs_first_rejection_args"], _STRUCTS["rs_finish_args"]
_VERIFY_DEFAULT = _STRUCTS["rs_verify_default_args"]

_UNLOADED = object()
_lib = _UNLOADED  # the loaded library, None where it cannot be (tests set None to force the torch path)


def library():
    """The sampler's library (built on first use), or None (no compiler, RELAXSPEC_NATIVE=0)."""
    global _lib
    if _lib is _UNLOADED:
        _lib = native.load(KERNEL)
    return _lib


@contextlib.contextmanager
def disabled():
    """Inside the block, the torch path serves (the library set aside): for tests and benchmarks."""
    global _lib
    saved, _lib = library(), None
    try:
        yield
    finally:
        _lib = saved


_loop = True  # whether the verify loop's kernels (first_rejection, finish) serve; loop_disabled() sets it aside


@contextlib.contextmanager
def loop_disabled():
    """Inside the block, the verify loop's bookkeeping runs its torch ops, the other kernels still serve (the
    same probabilities, so results comparable bit for bit): for tests and benchmarks."""
    global _loop
    saved, _loop = _loop, False
    try:
        yield
    finally:
        _loop = saved


def serves_loop(*tensors: torch.Tensor) -> bool:
    """True where the verify loop's kernels take these tensors (each as `serves` says; not set aside)."""
    return _loop and all(serves(t) for t in tensors)


def serves(t: torch.Tensor) -> bool:
    """True where the kernels take `t`: a non-empty float32 CPU tensor that needs no gradient, library loaded."""
    return (t.dtype is torch.float32 and t.is_cpu and not t.requires_grad and t.numel() > 0
            and (_lib if _lib is not _UNLOADED else library()) is not None)


def process(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Processed probabilities of float32 CPU logits [..., V] (checked settings; not greedy)."""
    x = logits.contiguous()
    out = torch.empty_like(x)  # contiguous as x, on its device (cheaper than torch.empty)
    V = x.shape[-1]
    if _lib.rs_process(x.data_ptr(), out.data_ptr(), x.numel() // V, V, float(temperature),
                       0 if top_k is None else int(top_k), 1.0 if top_p is None else float(top_p)) != 0:
        raise MemoryError("relaxspec sampler: out of memory processing logits")
    return out


def sample(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[R] int64: one index per row of float32 CPU weights [R, V] by inverse CDF at CPU uniforms u [R]."""
    w, u = weights.contiguous(), _float64(u)
    index = torch.empty_like(u, dtype=torch.int64)
    if _lib.rs_sample(w.data_ptr(), u.data_ptr(), index.data_ptr(), w.shape[0], w.shape[-1]) != 0:
        raise MemoryError("relaxspec sampler: out of memory sampling")
    return index


def round_table(low, high, start, width: int, columns) -> torch.Tensor:
    """One round's uniforms [B, 3 * width + 1] float64 (CPU) from the host keys low / high (numpy uint32 [B, K]),
    the rows' next positions `start` (numpy int64 [B]) and the key columns of (ACCEPT 0, DRAFT 1, DRAFT 2,
    TOKEN 1, TOKEN 2) (numpy int64 [5]): random.CounterDraws' table, bit for bit."""
    low, high = np.ascontiguousarray(low, dtype=np.uint32), np.ascontiguousarray(high, dtype=np.uint32)
    start = np.ascontiguousarray(start, dtype=np.int64)
    out = torch.empty((low.shape[0], 3 * width + 1), dtype=torch.float64, device="cpu")  # (never the default device)
    _lib.rs_round_table(low.ctypes.data, high.ctypes.data, low.shape[1], start.ctypes.data, low.shape[0], width,
                        columns.ctypes.data, out.data_ptr())
    return out


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t with unit stride along its last dimension (its rows read in place through t.stride(0))."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _float64(u: torch.Tensor) -> torch.Tensor:
    """Uniforms u as the kernels read them: contiguous float64."""
    return u if u.dtype is torch.float64 and u.is_contiguous() else u.to(torch.float64).contiguous()


def _acceptance_uniforms(u: torch.Tensor) -> torch.Tensor:
    """Acceptance uniforms as the loop kernels read them: float64 (a float32 value converts exactly), unit stride along
    the drafts."""
    return _rows(u if u.dtype is torch.float64 else u.double())


def _test_outputs(B: int, N: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The buffers the kernels write a block's acceptance tests into: flags [3, B, N] bool (accepted, kept,
    relaxed_only) and n [B] int64."""
    return (torch.empty((3, B, N), dtype=torch.bool, device=device),
            torch.empty((B,), dtype=torch.int64, device=device))


def _flags(flags: torch.Tensor) -> dict:
    """The data pointers of `_test_outputs`' flags, by the kernels' field names: accepted, kept, relaxed."""
    ptr, size = flags.data_ptr(), flags[0].numel()
    return dict(accepted=ptr, kept=ptr + size, relaxed=ptr + 2 * size)


def _token_outputs(B: int, N: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The buffers the kernels write a block's output into: tokens [B, N+1] and last [B], int64."""
    return (torch.empty((B, N + 1), dtype=torch.int64, device=device),
            torch.empty((B,), dtype=torch.int64, device=device))


def _counts(num_drafts: torch.Tensor | None) -> torch.Tensor | None:
    """num_drafts [B] as the kernels read it: contiguous int64 (or None)."""
    return None if num_drafts is None else _rows(num_drafts if num_drafts.dtype is torch.int64 else num_drafts.long())


def first_rejection(u: torch.Tensor, accept_prob: torch.Tensor, strict_accept_prob: torch.Tensor | None,
                    num_drafts: torch.Tensor | None):
    """The verify loop's first rejection on float32 CPU accept_prob [B, N] (strict_accept_prob the same or None,
    num_drafts int64 [B] or None) and CPU uniforms u [B, N] (float32, or float64 holding float32 values: a counter
    stream's 24-bit ones): (accepted, kept, n, relaxed_only), as verify's torch path gives them."""
    u, accept_prob = _acceptance_uniforms(u), _rows(accept_prob)
    strict = None if strict_accept_prob is None else _rows(strict_accept_prob)
    num_drafts = _counts(num_drafts)  # (held here: the kernel reads its memory)
    B, N = accept_prob.shape
    flags, n = _test_outputs(B, N, accept_prob.device)
    _lib.rs_first_rejection(_FIRST_REJECTION(
        u=u.data_ptr(), su=u.stride(0), ap=accept_prob.data_ptr(), sa=accept_prob.stride(0),
        strict=None if strict is None else strict.data_ptr(), ss=0 if strict is None else strict.stride(0),
        num_drafts=None if num_drafts is None else num_drafts.data_ptr(), B=B, N=N, **_flags(flags), n=n.data_ptr()))
    accepted, kept, relaxed_only = flags.unbind(0)
    return accepted, kept, n, relaxed_only


def finish(n: torch.Tensor, num_drafts: torch.Tensor | None, residual: torch.Tensor, p: torch.Tensor,
           bonus: torch.Tensor, u: torch.Tensor, drafts: torch.Tensor):
    """The verify loop's finish (float32 CPU rows [B, V], CPU u float64 [B], drafts int64 [B, N]): (tokens
    [B, N+1], last [B]), as verify's torch path gives them (the same sample: `sample_row`, as `sample`)."""
    residual, p, bonus, drafts = _rows(residual), _rows(p), _rows(bonus), _rows(drafts)
    u = _float64(u)
    B, N = drafts.shape
    tokens, last = _token_outputs(B, N, drafts.device)
    num_drafts = _counts(num_drafts)
    if _lib.rs_finish(_FINISH(
            n=n.data_ptr(), num_drafts=None if num_drafts is None else num_drafts.data_ptr(), B=B, N=N,
            V=residual.shape[-1], residual=residual.data_ptr(), sr=residual.stride(0), p=p.data_ptr(), sp=p.stride(0),
            bonus=bonus.data_ptr(), sb=bonus.stride(0), u=u.data_ptr(), drafts=drafts.data_ptr(),
            sd=drafts.stride(0), tokens=tokens.data_ptr(), last=last.data_ptr())) != 0:
        raise MemoryError("relaxspec sampler: out of memory sampling")
    return tokens, last


def verify_default(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, accept_prob: torch.Tensor | None,
                   strict_accept_prob: torch.Tensor | None, u: torch.Tensor, u_token: torch.Tensor,
                   num_drafts: torch.Tensor | None, argmax: bool = False, kernel: RuleKernel | None = None,
                   z: torch.Tensor | None = None, zq: torch.Tensor | None = None, inp: torch.Tensor | None = None,
                   inp_range: tuple[float, float] | None = None):
    """The verify loop in one call for a rule that keeps strict's bonus and residual (or, argmax, takes
    Rule.residual_argmax, or the kernel's rule's own), read from the blocks p [B, N+1, V] and q [B, N, V] (float32
    CPU): `first_rejection` on accept_prob (None: the test computed here, strict's min(1, p(x)/q(x)) at the drafts, or
    `kernel`'s rule's own, from p, q, the raw logits of the verifier, z [B, N+1, V], and of the drafter, zq [B, N or
    N+1, V], and its input inp [B, N] float32 or None, whose values are checked first to lie in inp_range (given with
    inp), NaN refused: InputOutOfRange otherwise), then `finish` with the residual (p - q)+ (argmax: one-hot on
    argmax p; the kernel's rule's own) at each stopped row's position and the bonus (p, or the kernel's rule's own) at
    its bonus position, the token of row b drawn at u_token[b, n[b]] (float64 [B, N+1], or a column expanded: one
    uniform per row).
    (accept_prob, strict_accept_prob, accepted, kept, n, relaxed_only, tokens, last), as the loop's torch ops give them
    (strict_accept_prob: the one given, or with a kernel strict's test computed here, else None); None where the
    kernel's rule declined the block (its torch math serves it then); ValueError for a draft outside [0, V) when
    computing the test."""
    p, q, drafts = _rows(p), _rows(q), _rows(drafts)
    u = _acceptance_uniforms(u)
    u_token = u_token if u_token.dtype is torch.float64 else u_token.double()  # (read through its strides)
    B, N = drafts.shape
    out = strict_out = None
    if accept_prob is None and kernel is None:  # strict's test, computed here
        ap = torch.empty((B, N), dtype=torch.float32, device=drafts.device)
        out = ap.data_ptr()
    elif accept_prob is None:  # the rule's test and strict's beside it
        ap, strict_accept_prob = torch.empty((2, B, N), dtype=torch.float32, device=drafts.device).unbind(0)
        out, strict_out = ap.data_ptr(), strict_accept_prob.data_ptr()
    else:
        ap = _rows(accept_prob)
    strict = None if strict_accept_prob is None or strict_out else _rows(strict_accept_prob)
    flags, n = _test_outputs(B, N, drafts.device)
    tokens, last = _token_outputs(B, N, drafts.device)
    num_drafts = _counts(num_drafts)
    kernel_inputs = _NO_KERNEL_INPUTS if kernel is None else _kernel_inputs(z, zq, inp, inp_range)  # (held: C reads)
    status = (_lib if kernel is None else kernel.lib).rs_verify_default(_VERIFY_DEFAULT(
        p=p.data_ptr(), sp0=p.stride(0), sp1=p.stride(1), q=q.data_ptr(), sq0=q.stride(0), sq1=q.stride(1),
        **kernel_inputs[0], drafts=drafts.data_ptr(), sd=drafts.stride(0),
        num_drafts=None if num_drafts is None else num_drafts.data_ptr(), B=B, N=N, V=p.shape[-1],
        ap=None if out is not None else ap.data_ptr(), sa=ap.stride(0),
        strict=None if strict is None else strict.data_ptr(), ss=0 if strict is None else strict.stride(0),
        ap_out=out, strict_out=strict_out, prm=None if kernel is None else kernel.params.ctypes.data,
        ua=u.data_ptr(), sua=u.stride(0), ut=u_token.data_ptr(), st0=u_token.stride(0), st1=u_token.stride(1),
        argmax=int(argmax), **_flags(flags), n=n.data_ptr(), tokens=tokens.data_ptr(), last=last.data_ptr()))
    if status == -3:
        return None
    if status == -2:
        raise ValueError(f"a token lies outside the vocabulary [0, {p.shape[-1]})")
    if status == -4:
        raise InputOutOfRange(f"the rule's input must lie in [{inp_range[0]:g}, {inp_range[1]:g}] (NaN not allowed)")
    if status != 0:
        raise MemoryError("relaxspec sampler: out of memory sampling")
    accepted, kept, relaxed_only = flags.unbind(0)
    return ap, strict_accept_prob, accepted, kept, n, relaxed_only, tokens, last


def _kernel_inputs(z: torch.Tensor, zq: torch.Tensor, inp: torch.Tensor | None,
                   inp_range: tuple[float, float] | None) -> tuple[dict, tuple]:
    """(rs_verify_default's fields for a rule's own math: z and zq with their row strides and zq's rows, the rule's
    input with its row stride and range; the tensors they point into, unit stride along their last dimension)."""
    if inp is not None and inp_range is None:
        raise ValueError("verify_default: a rule input needs its range (inp_range)")
    z, zq, inp = _rows(z), _rows(zq), None if inp is None else _rows(inp)
    low, high = inp_range or (0.0, 0.0)
    return (dict(z=z.data_ptr(), sz0=z.stride(0), sz1=z.stride(1), zq=zq.data_ptr(), szq0=zq.stride(0),
                 szq1=zq.stride(1), zq_rows=zq.shape[1], inp=None if inp is None else inp.data_ptr(),
                 sinp=0 if inp is None else inp.stride(0), inp_low=low, inp_high=high), (z, zq, inp))


# (strict's test reads none of them)
_NO_KERNEL_INPUTS = (dict(z=None, sz0=0, sz1=0, zq=None, szq0=0, szq1=0, zq_rows=0, inp=None, sinp=0, inp_low=0.0,
                          inp_high=0.0), ())


class InputOutOfRange(ValueError):
    """`verify_default` found a value of the rule's input outside its range, or NaN (nothing was computed)."""


@dataclass(frozen=True)
class RuleKernel:
    """A rule's verify loop in C at one setting: its library (`rule_library`) and the C's prm: the rule's parameters
    (float64, in `Rule.params` order, a choice as its index in `choices`), then the temperature."""

    lib: ctypes.CDLL
    params: np.ndarray


def rule_library(name: str, test: str, residual: bool, bonus: bool) -> ctypes.CDLL | None:
    """The library of a rule's verify loop: the sampler's (`rs_verify_default`) with the rule's math in C (the file
    `test`, Rule.native_test, in csrc/rules/: its rule_test, and its rule_residual and rule_bonus where `residual`
    and `bonus`, Rule.native_residual and native_bonus, say so; strict's otherwise) in place of strict's; None where
    it cannot be built or the kernels are off (`disabled()` included: nothing is remembered from there;
    `native.load` keeps each library built)."""
    if library() is None:
        return None
    return native.load(rule_kernel(name, test, residual, bonus))


@functools.cache
def rule_kernel(name: str, test: str, residual: bool, bonus: bool) -> native.Kernel:
    """A rule library's kernel (csrc/rule.c with the rule's file), made once per rule."""
    defines = (("RULE_FILE", f'"rules/{test}"'), ("RULE_TEST", ""), *((("RULE_RESIDUAL", ""),) if residual else ()),
               *((("RULE_BONUS", ""),) if bonus else ()))
    return native.Kernel("rule-" + name, CSRC / "rule.c", CSRC / "sampler.h", defines=defines,
                         functions=("rs_verify_default",))


def at_tokens(probs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """probs [A, V] or [A, B, V] (float32 CPU, unit stride along V) at int64 CPU tokens x [A] or [A, B]: float32
    [A] or [A, B], what probs.gather(-1, x[..., None])[..., 0] gives; ValueError for a token outside [0, V)."""
    x, probs = x.contiguous(), _rows(probs)
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    two = probs.dim() == 3
    if _lib.rs_at_tokens(probs.data_ptr(), probs.stride(0), probs.stride(1) if two else 0, probs.shape[-1],
                         x.data_ptr(), x.shape[0], x.shape[1] if two else 1, out.data_ptr()) != 0:
        raise ValueError(f"a token lies outside the vocabulary [0, {probs.shape[-1]})")
    return out


def capped_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """processing.capped_ratio of float32 CPU tensors of one shape, in one call."""
    num, den = num.contiguous(), den.contiguous()
    out = torch.empty_like(num)
    _lib.rs_capped_ratio(num.data_ptr(), den.data_ptr(), out.data_ptr(), num.numel())
    return out


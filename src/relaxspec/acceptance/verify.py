"""The one shared verify step, batched (after vLLM's v1/sample/rejection_sampler.py).

Rules only give math (accept_prob, residual, bonus); this loop alone draws
randomness, from `random` (a `Draws`: per-sequence counter-based streams keyed by output
position, as the engine passes) or else from `generator`:

1. u ~ U[0, 1) per draft position; accept x_i iff u_i < accept_prob_i;
2. n = first rejected position (N if none); the drafts before it are kept;
3. token n is sampled from the normalised residual at position n (falling back
   to p there if the residual has no mass) or, if n == N, from the bonus.

Logits are upcast to float32 first (bf16 logits would move every rule's math). At a
greedy temperature (< 1e-5) p and q are one-hot; rules declaring `greedy_closed_form`
(strict), or every rule when the caller passes greedy="strict", are then computed as
argmax matching without uniforms (vLLM's greedy path; the reference sends every greedy
request there). The default greedy="rule" applies each rule to the one-hot p and q.

Only one residual row per sequence is ever needed, so the loop gathers row
(b, min(n_b, N-1)) and computes the rule's residual there: dense O(V) work per
position is left to rules whose *acceptance test* needs it. Shapes stay static
(no data-dependent branching), and there is no Python loop over the batch. On float32 CPU tensors the loop's
bookkeeping (steps 1-3 around the rule's math) is one C call before the residual and one after
(`fused.first_rejection`, `fused.finish`), and for a rule whose residual and bonus the blocks give (strict's, or
argmax p: `Rule.residual_argmax`) the whole loop is one call (`fused.verify_default`, strict's test included for
strict); the torch ops stay as the reference, with the same results bit for bit. A rule with its math in C
(`Rule.native_test`, and its residual and bonus there where they are its own) has its whole step in one call of its
own library when sampling (`fused.rule_library`), within float32 rounding of its torch methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from relaxspec.acceptance.base import ParamSpec, Rule, Targets, VerifyContext, get_rule
from relaxspec.acceptance import fused
from relaxspec.acceptance.checks import (
    _check_block,
    _check_draft_probs_mass,
    _check_masked_rows_unread,
    _check_num_drafts,
    _check_relax,
    _placeholder_rows,
    _without_masked_rows,
    check_block,
)
from relaxspec.acceptance.random import ACCEPT, TOKEN, CounterDraws, Draws, GeneratorDraws
from relaxspec.acceptance.processing import (
    as_float,
    capped_ratio,
    check_sampling_args,
    is_greedy,
    process_logits_unchecked,
)
from relaxspec.tensors import cached_arange

# verify's `greedy` settings: what a rule does at temperature 0.
GREEDY_MODES = ("rule", "strict")
STRICT = Rule()  # the base rule is strict: what `relax` falls back to


@dataclass
class VerifyResult:
    """Outcome of one verify call on a block of B sequences with N drafts each."""

    num_accepted: torch.Tensor  # long [B] in 0..N
    tokens: torch.Tensor  # long [B, N+1]: kept drafts, then the residual/bonus token, then -1
    accept_prob: torch.Tensor  # float [B, N]: the rule's acceptance probability
    strict_accept_prob: torch.Tensor  # float [B, N]: min(1, p(x)/q(x))
    accepted: torch.Tensor  # bool [B, N]: u < accept_prob, before the first-rejection cut
    relaxed_only: torch.Tensor  # bool [B, N]: kept, though the strict test (same u) rejects
    last_token: torch.Tensor  # long [B]: the residual / bonus token, tokens[b, num_accepted[b]]
    # bool [B]: the rows whose tensor inputs lie in range, for the caller to read (VerifyStep(defer_input_checks=True)
    # where the torch path checks them); None: checked already (an input out of range raised)
    inputs_ok: torch.Tensor | None = None
    # the rule's per-sequence state after the block (`Rule.state`: name -> float [B]); None for a rule without one
    state: dict | None = None


def build_context(
    target_logits, draft_logits, draft_tokens, *, temperature=1.0, top_k=None, top_p=None, draft_probs=None
) -> VerifyContext:
    """Validate the block, upcast half / bfloat16 inputs to float32, and process both distributions
    once (`draft_probs`, if given, are the drafter's already processed distributions [B, N, V],
    e.g. those its drafts were sampled from)."""
    check_sampling_args(temperature, top_k, top_p)
    check_block(target_logits, draft_logits, draft_tokens, draft_probs)
    return _context(target_logits, draft_logits, draft_tokens, draft_probs, temperature=temperature, top_k=top_k,
                    top_p=top_p)


def _context(target_logits, draft_logits, draft_tokens, draft_probs, **sampling) -> VerifyContext:
    """build_context without the checks."""
    N = draft_tokens.shape[1]
    target_logits, draft_logits = as_float(target_logits), as_float(draft_logits)
    if draft_probs is None:
        draft_probs = process_logits_unchecked(draft_logits[:, :N], **sampling)
    return VerifyContext(
        p=process_logits_unchecked(target_logits, **sampling),
        q=as_float(draft_probs),
        target_logits=target_logits,
        draft_logits=draft_logits,
        draft_tokens=draft_tokens if draft_tokens.dtype == torch.long else draft_tokens.long(),
        **sampling,
    )


def verify(
    method: str,
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    random: Draws | None = None,
    draft_probs: torch.Tensor | None = None,
    greedy: str = "rule",
    num_drafts: torch.Tensor | None = None,
    relax: torch.Tensor | None = None,
    **params,
) -> VerifyResult:
    """Verify a block of drafts with acceptance rule `method` (see `RULES`).

    The whole input contract (shapes, dtypes, ranges, padding, what is refused): docs/verify.md.
    target_logits [B, N+1, V] (N draft positions + bonus), draft_logits [B, N, V]
    (or [B, N+1, V] with the drafter's bonus-position row; required by rules with
    `extra_draft_passes`, ignored by the others): a row where every logit is -inf is allowed only where the
    step cannot read it (after a draft rejected for sure, past a row's last draft); draft_tokens int64 or
    int32 [B, N] in [0, V), or -1 (vLLM's placeholder: "no draft here"; a row's drafts end at its first -1,
    as num_drafts says); params are the rule's own. draft_probs [B, N, V]: the drafter's processed
    distributions, when the caller has them already (they are then not recomputed from draft_logits; they
    must be what `process_logits` gives on them: each row a draft is proposed at sums to 1 within 1e-3,
    1e-2 for half / bfloat16). greedy: at a greedy temperature, "rule" (default) applies the
    rule to one-hot p and q; "strict" makes every rule strict argmax matching (the reference's
    behaviour).
    random: where the acceptance uniforms and the residual/bonus sample come from (a `Draws`,
    e.g. `SequenceSeeds(...).at(start)` for per-sequence streams keyed by the output position of
    x_1); default: `generator` (or torch's global generator) in call order.
    num_drafts: long [B] in 0..N, how many of its drafts row b proposes (default: all N); its
    later columns are padding, and the token after its last draft comes from the rule's bonus at
    that position (so a row's result does not depend on the block width: the engine's ragged
    rounds near the length limit).
    relax: bool [B, N+1], where the rule decides (draft positions, then the bonus position); strict decides
    elsewhere (same uniforms). Phase-aware relaxation (relaxspec.engine.phase) passes it; None: the rule everywhere.

    Every argument is checked here; `VerifyStep` is the same computation for a caller (the engine)
    that checks its arguments once per call path instead of once per block.
    """
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    step = VerifyStep(method, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy, **{
        name: value for name, value in params.items() if name not in _per_block(get_rule(method))})
    block = _check_block(target_logits, draft_logits, draft_tokens, draft_probs, direct=True)
    N = block.num_drafts
    inputs = {name: value for name, value in params.items() if name in _per_block(step.rule)}
    step.rule.validate({**step.params, **inputs}, batch_shape=tuple(draft_tokens.shape),
                       draft_rows=draft_logits.shape[1])
    num_drafts = _check_num_drafts(num_drafts, draft_tokens, N)
    relax = _check_relax(relax, draft_tokens.shape[0], N, draft_tokens.device)
    if block.placeholder:
        draft_tokens, num_drafts = _placeholder_rows(draft_tokens, num_drafts)
    if draft_probs is not None:
        _check_draft_probs_mass(draft_probs, num_drafts)
    masked = block.masked_target is not None or block.masked_draft is not None
    if masked:
        target_logits = _without_masked_rows(target_logits, block.masked_target)
        draft_logits = _without_masked_rows(draft_logits, block.masked_draft)
    result = step(target_logits, draft_logits, draft_tokens.long(), generator=generator, random=random,
                  draft_probs=draft_probs, num_drafts=num_drafts, relax=relax, **inputs)
    if masked:
        _check_masked_rows_unread(result, block, num_drafts, step.rule.extra_draft_passes)
    return result


class _PlanKey(NamedTuple):
    """What a block's path depends on beyond its step's settings (`VerifyStep._plan_key`): a dictionary key (named
    fields; a tuple, built and hashed in a third of a frozen dataclass's time, on every block)."""

    everywhere: bool  # no `relax` given: the rule decides at every position
    random: type  # the random source's kind
    device: torch.device  # the block's
    target_logits: torch.dtype  # the dtypes of the logits and distributions, as the context holds them
    draft_logits: torch.dtype
    p: torch.dtype
    q: torch.dtype
    logits_grad: bool  # whether the logits need a gradient
    probs_grad: bool  # whether the distributions do
    inputs: tuple[tuple[torch.dtype, torch.device], ...]  # each tensor input's dtype and device
    loop: bool  # whether the loop's kernels serve (fused.serves_loop; fused.loop_disabled() sets them aside)
    library: bool  # whether the sampler's library is loaded (fused.disabled() sets it aside)


@dataclass(frozen=True)
class _Plan:
    """The path of one kind of block through a VerifyStep (`VerifyStep._plan`): `path`, one of its loops, called with
    the step; checks_inputs: the tensor inputs' values are checked by torch ops before it (else by the rule's C)."""

    path: Callable[..., VerifyResult]
    checks_inputs: bool = True


class VerifyStep:
    """`verify` with its rule, parameters and sampling settings checked once: calling it runs one block
    without re-checking the block (the caller guarantees what `check_block` checks: float logits
    without NaN / +inf, drafts in range, matching shapes and devices). Per-block tensor inputs (e.g.
    PAD's `pivot_prob`) are still checked on every call: they are new data each block (by the rule's C where it reads
    them; by torch ops otherwise, whose result is read on the host at once, unless `defer_input_checks`: then the
    result's `inputs_ok` says which rows' inputs were in range, for a caller that reads it with its own copy of the
    round, as the engine does, so that a GPU round needs no second device-to-host sync).

    Which path serves a block is settled once per configuration: strict's closed form at a greedy temperature, when
    the step is made; one C call with the rule's kernel, one C call reading the block's rows, or the torch math, once
    per kind of block (`_plan_key`: relax or not, dtypes, device, the random source's kind), at its first block."""

    def __init__(self, method: str, *, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, greedy: str = "rule", defer_input_checks: bool = False, **params):
        self.rule = get_rule(method)
        self.defer_input_checks = defer_input_checks
        if greedy not in GREEDY_MODES:
            raise ValueError(f"greedy must be one of {', '.join(GREEDY_MODES)}, got {greedy!r}")
        check_sampling_args(temperature, top_k, top_p)
        inputs = {name: params.pop(name) for name in list(params) if name in _per_block(self.rule)}
        if inputs:
            carried = " (a per-sequence state: the engine carries it from round to round)" if any(
                name in self.rule.state for name in inputs) else ""
            raise ValueError(f"rule {self.rule.name!r}: pass the input(s) {sorted(inputs)} per block, when "
                             f"calling{carried}")
        # Numeric and choice parameters; tensor inputs come with each block (placeholders stand in here).
        placeholders = {name: torch.full((), spec.low, device="cpu") for name, spec in self.rule.inputs.items()}
        checked = self.rule.validate({**params, **placeholders})
        self.params = {name: checked[name] for name in self.rule.params}
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        self.closed_form = is_greedy(temperature) and (self.rule.greedy_closed_form or greedy == "strict")
        # Whether a block needs uniforms: when sampling, or at T=0 for a rule whose greedy test still draws.
        self.draws = not is_greedy(temperature) or (not self.closed_form and self.rule.draws_at_greedy)
        # A rule that keeps strict's bonus and residual (whatever `relax` says, those are strict's), or takes argmax p
        # as its residual: on float32 CPU blocks the whole loop is one C call that reads them from p and q
        # (fused.verify_default). block_rows: "strict", "argmax" or None (the rule's own rows, computed).
        residual, default_bonus = type(self.rule).residual, type(self.rule).bonus is Rule.bonus
        self.block_rows = (None if not default_bonus else "strict" if residual is Rule.residual
                           else "argmax" if residual is Rule.residual_argmax else None)
        # A rule with its math in C (Rule.native_test): when sampling, its test, residual and all in one call too.
        self.kernel = None if is_greedy(temperature) else _rule_kernel(self.rule, self.params, temperature)
        # A rule that keeps the base (strict) test gives strict's probabilities: not computed twice.
        self.own_test = type(self.rule).accept_prob is not Rule.accept_prob
        # The path of each kind of block (`_plan_key`): chosen at its first block, looked up after that.
        self._plans: dict[_PlanKey, _Plan] = {}

    def __call__(self, target_logits, draft_logits, draft_tokens, *, generator=None, random: Draws | None = None,
                 draft_probs=None, num_drafts: torch.Tensor | None = None, relax: torch.Tensor | None = None,
                 **inputs) -> VerifyResult:
        """One block; `relax` [B, N+1] (bool, on the block's device): where the rule decides, strict elsewhere."""
        rule = self.rule
        params = dict(self.params)
        for name, spec in rule.inputs.items():  # (its values: below, or by the C, which reads them)
            params[name] = rule._check_input(spec, inputs.get(name), tuple(draft_tokens.shape), values=False)
        for name, spec in rule.state.items():  # (its values: by `verify`, or the engine, which made them)
            params[name] = rule._check_state(spec, inputs.get(name), tuple(draft_tokens.shape), draft_tokens.device,
                                             values=False)
        if self.closed_form:  # strict everywhere: nothing to relax
            result = self._greedy_strict(params, target_logits, draft_logits, draft_tokens, draft_probs, num_drafts)
            result.state = {name: params[name] for name in rule.state} if rule.state else None
            return result
        ctx = _context(target_logits, draft_logits, draft_tokens, draft_probs, **self.sampling)
        ctx.row_drafts = num_drafts
        key = self._plan_key(ctx, random, relax, params)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(key, random)
        inputs_ok = self._inputs_in_range(params) if plan.checks_inputs else None
        if random is None:
            random = GeneratorDraws(generator, ctx.batch_size, ctx.p.device)
        if rule.reads_uniforms and self.draws:  # drawn before the test, which reads them (Rule.reads_uniforms)
            ctx.uniforms = random.uniform(ACCEPT, ctx.num_drafts, dtype=_acceptance_dtype(random, ctx.p))
        result = plan.path(self, ctx, params, random, num_drafts, relax, inputs_ok)
        if rule.state:
            result.state = rule.next_state(ctx.drafts(), result.relaxed_only, **params)
        return result

    def _plan_key(self, ctx: VerifyContext, random: Draws | None, relax, params: dict) -> _PlanKey:
        """What a block's path depends on beyond the step's settings (`_PlanKey`)."""
        return _PlanKey(everywhere=relax is None, random=type(random), device=ctx.p.device,
                        target_logits=ctx.target_logits.dtype, draft_logits=ctx.draft_logits.dtype, p=ctx.p.dtype,
                        q=ctx.q.dtype, logits_grad=ctx.target_logits.requires_grad or ctx.draft_logits.requires_grad,
                        probs_grad=ctx.p.requires_grad or ctx.q.requires_grad,
                        inputs=tuple((params[name].dtype, params[name].device) for name in self.rule.inputs),
                        loop=fused.serves_loop(), library=fused.library() is not None)

    def _plan(self, key: _PlanKey, random: Draws | None) -> _Plan:
        """The path of the blocks of kind `key` (`_plan_key`; `random`: one block's source). On float32 CPU blocks
        (the kernels' own, when they serve) the whole loop is one C call where the rule's math is in C and it decides
        everywhere (`kernel`, when sampling), or where the block gives its residual and bonus (`block_rows`: strict's
        anywhere, argmax p only where the rule decides everywhere: `relax` asks for strict's elsewhere), and the
        random source gives its token uniforms up front; the torch math serves every other block."""
        served = key.loop and key.library and key.device.type == "cpu"  # (fused.serves_loop)
        kernel = (self.kernel is not None and key.everywhere and served and not key.logits_grad
                  and key.target_logits is torch.float32 and key.draft_logits is torch.float32)
        rows = self.block_rows is not None and (key.everywhere or self.block_rows == "strict")
        if not ((kernel or rows) and _draws_token_table(random) and served and not key.probs_grad
                and key.p is torch.float32 and key.q is torch.float32):
            return _Plan(VerifyStep._torch_loop)
        if kernel:  # a tensor input is checked by the C where it reads it as given (float32 on the block's device)
            in_c = all(dtype is torch.float32 and where == key.device for dtype, where in key.inputs)
            return _Plan(VerifyStep._kernel_loop, checks_inputs=not in_c)
        return _Plan(VerifyStep._rows_loop)

    def _greedy_strict(self, params, target_logits, draft_logits, draft_tokens, draft_probs,
                       num_drafts) -> VerifyResult:
        """Strict at a greedy temperature: argmax matching (`_verify_greedy_strict`), no uniforms."""
        inputs_ok = self._inputs_in_range(params)
        result = _verify_greedy_strict(as_float(target_logits), draft_logits, draft_tokens, draft_probs, num_drafts)
        result.inputs_ok = inputs_ok
        return result

    def _kernel_loop(self, ctx, params, random, num_drafts, relax, inputs_ok) -> VerifyResult:
        """The whole loop in one call of the rule's own library: its test, residual and bonus in C."""
        return self._one_call(ctx, params, random, num_drafts, relax, inputs_ok, None, None, self.kernel)

    def _rows_loop(self, ctx, params, random, num_drafts, relax, inputs_ok) -> VerifyResult:
        """The whole loop in one C call reading the residual and bonus from the block, the test too for a rule that
        keeps strict's; a rule's own test by its torch math first (then the torch loop where that gives other than
        float32 CPU tensors)."""
        if not self.own_test:
            return self._one_call(ctx, params, random, num_drafts, relax, inputs_ok, None, None, None)
        tests = self._tests(ctx, params, relax, True)
        if not fused.serves_loop(*tests):
            return self._torch_loop(ctx, params, random, num_drafts, relax, inputs_ok, tests)
        return self._one_call(ctx, params, random, num_drafts, relax, inputs_ok, *tests, None)

    def _one_call(self, ctx, params, random, num_drafts, relax, inputs_ok, accept_prob, strict_accept_prob,
                  kernel) -> VerifyResult:
        """The loop in one C call (fused.verify_default; accept_prob None: the test is the call's); where the rule's C
        declines the block (e.g. scores that overflow), its torch math serves it with the same uniforms (and says
        why)."""
        N = ctx.num_drafts
        u = ctx.uniforms if ctx.uniforms is not None else random.uniform(
            ACCEPT, N, dtype=_acceptance_dtype(random, ctx.p if accept_prob is None else accept_prob))
        # (the rule's one tensor input, if it has one, as its C reads it: float32 on the block's device)
        name, spec = next(iter(self.rule.inputs.items())) if kernel and self.rule.inputs else (None, None)
        inp = None if name is None else params[name].to(ctx.p.device, torch.float32)
        try:
            out = fused.verify_default(
                ctx.p, ctx.q, ctx.draft_tokens, accept_prob, strict_accept_prob, u, random.token_uniforms(N),
                num_drafts, argmax=self.block_rows == "argmax", kernel=kernel, z=ctx.target_logits,
                zq=ctx.draft_logits, inp=inp, inp_range=None if spec is None else (spec.low, spec.high))
        except fused.InputOutOfRange:
            raise self.input_error(**params) from None  # (the rule's own message)
        if out is None:
            tests = self._tests(ctx, params, relax, self.own_test)
            return self._torch_loop(ctx, params, random, num_drafts, relax, inputs_ok, tests, u)
        accept_prob, strict, accepted, kept, n, relaxed_only, tokens, last = out
        return VerifyResult(num_accepted=n, tokens=tokens, accept_prob=accept_prob,
                            strict_accept_prob=accept_prob if strict is None else strict, accepted=accepted,
                            relaxed_only=relaxed_only, last_token=last, inputs_ok=inputs_ok)

    def _torch_loop(self, ctx, params, random, num_drafts, relax, inputs_ok, tests=None, u=None) -> VerifyResult:
        """The loop by torch math (the reference): the rule's test (`tests`, if computed already), the first rejection,
        the rule's residual and bonus, the token (both stretches of bookkeeping in C on float32 CPU tensors:
        `_first_rejection`, `_finish`); `u`: the acceptance uniforms, if drawn already."""
        rule, B, N = self.rule, ctx.batch_size, ctx.num_drafts
        accept_prob, strict_accept_prob = self._tests(ctx, params, relax, self.own_test) if tests is None else tests
        if u is None:
            u = ctx.uniforms if ctx.uniforms is not None else random.uniform(
                ACCEPT, N, dtype=_acceptance_dtype(random, accept_prob))
        # The drafts before the first rejection are kept; n counts them (N, or the row's num_drafts, if
        # every draft passed).
        accepted, kept, n, relaxed_only = _first_rejection(
            u, accept_prob, strict_accept_prob if self.own_test else None, num_drafts)
        # One residual row per sequence, at its first rejection (row N-1 is a placeholder for fully
        # accepted sequences, which take the bonus instead). Weights need not be normalised to be
        # sampled; a residual without mass falls back to p at that position.
        # (One sequence on the CPU: its n is on the host, and its row is read in place.)
        at_row = (ctx.row(min(int(n), N - 1)) if B == 1 and n.is_cpu
                  else ctx.rows(cached_arange(B, n.device), n.clamp(max=N - 1)))
        residual = rule.residual(at_row, **params)
        bonus_ctx = ctx if num_drafts is None else _at_bonus(ctx, num_drafts)
        bonus = rule.bonus(bonus_ctx, **params)
        if relax is not None:  # strict's residual / bonus where the rule may not relax
            at_bonus = torch.full_like(n, N) if num_drafts is None else num_drafts
            residual = torch.where(relax.gather(1, n.unsqueeze(1)), residual, STRICT.residual(at_row))
            bonus = torch.where(relax.gather(1, at_bonus.unsqueeze(1)), bonus, STRICT.bonus(bonus_ctx))
        tokens, last = _finish(random, n, kept, num_drafts, residual, at_row.p, bonus, ctx.draft_tokens)

        return VerifyResult(
            num_accepted=n,
            tokens=tokens,
            accept_prob=accept_prob,
            strict_accept_prob=strict_accept_prob,
            accepted=accepted,
            relaxed_only=relaxed_only,
            last_token=last,
            inputs_ok=inputs_ok,
        )

    def _inputs_in_range(self, params: dict) -> torch.Tensor | None:
        """The rule's tensor inputs' values (Rule._check_input_values): a ValueError now, or with
        `defer_input_checks` the rows whose inputs lie in range (bool [B], not read here; None without inputs)."""
        if not self.defer_input_checks:
            self._check_input_values(params)
            return None
        ok = None
        for name, spec in self.rule.inputs.items():
            in_range = self.rule._input_in_range(spec, params[name]).all(dim=-1)
            ok = in_range if ok is None else ok & in_range
        return ok

    def input_error(self, **inputs) -> ValueError:
        """The error for tensor inputs (given as to the call) of which one lies out of range, with the rule's own
        message: for a caller that found `inputs_ok` False."""
        try:
            self._check_input_values(inputs)
        except ValueError as error:
            return error
        return ValueError(f"rule {self.rule.name!r}: an input lies outside its range")

    def _check_input_values(self, inputs: dict) -> None:
        """A ValueError, with the rule's message, for the first tensor input of `inputs` with a value out of range."""
        for name, spec in self.rule.inputs.items():
            self.rule._check_input_values(spec, inputs[name])

    def _tests(self, ctx: VerifyContext, params: dict, relax, own_test: bool):
        """(accept_prob, strict_accept_prob) [B, N] by the rule's torch math: strict's where `relax` leaves a
        position to strict; strict_accept_prob is accept_prob itself for a rule that keeps strict's test. A block
        larger than `chunk_elements` is tested a few sequences at a time (each position's test reads its own
        row only: the same values)."""
        rows = max(1, chunk_elements(ctx.p.device) // (ctx.num_drafts * ctx.p.shape[-1]))
        if rows < ctx.batch_size:
            parts = [self._tests(ctx.select(b, b + rows), {name: value[b:b + rows] if name in _per_block(self.rule)
                                                            else value for name, value in params.items()},
                                 None, own_test) for b in range(0, ctx.batch_size, rows)]
            accept_prob, strict_accept_prob = (torch.cat(part) for part in zip(*parts))
        else:
            drafts = ctx.drafts()
            accept_prob = self.rule.accept_prob(drafts, **params)
            strict_accept_prob = capped_ratio(drafts.p_x, drafts.q_x) if own_test else accept_prob
        if relax is not None:  # phase-aware: strict where the rule may not relax
            accept_prob = torch.where(relax[:, :ctx.num_drafts], accept_prob, strict_accept_prob)
        return accept_prob, strict_accept_prob


# The loop's two stretches of bookkeeping: one C call each for float32 CPU tensors (acceptance/fused.py), the torch
# ops otherwise (the reference: other devices and dtypes, fused.disabled() / loop_disabled()); the same results, bit
# for bit.


def _per_block(rule: Rule) -> dict:
    """The rule's per-block tensors, by name: its inputs ([B, N]) and its per-sequence state ([B])."""
    return {**rule.inputs, **rule.state}


def _acceptance_dtype(random: Draws, accept_prob: torch.Tensor) -> torch.dtype:
    """The dtype of the acceptance uniforms: accept_prob's, or float64 from counter streams where the kernel takes
    them (their 24-bit values are exact in both: the same comparisons, the round's float64 table read, not copied)."""
    return torch.float64 if isinstance(random, CounterDraws) and fused.serves_loop(accept_prob) else accept_prob.dtype


def _first_rejection(u, accept_prob, strict_accept_prob, num_drafts):
    """(accepted [B, N]: u < accept_prob in the columns each row proposes (num_drafts), kept: the accepted drafts
    before the first rejection, n [B]: their count, relaxed_only: kept though u < strict_accept_prob fails, all
    False where strict_accept_prob is None)."""
    if u.is_cpu and fused.serves_loop(accept_prob, *(() if strict_accept_prob is None else (strict_accept_prob,))):
        return fused.first_rejection(u, accept_prob, strict_accept_prob, num_drafts)
    accepted = u < accept_prob
    if num_drafts is not None:  # a row's padding columns are never proposed
        accepted &= cached_arange(accepted.shape[1], accepted.device) < num_drafts.unsqueeze(1)
    kept = accepted.cumprod(dim=1).bool()  # [B, N]
    relaxed_only = (torch.zeros_like(accepted) if strict_accept_prob is None
                    else accepted & kept & ~(u < strict_accept_prob))
    return accepted, kept, kept.sum(dim=1), relaxed_only


def _finish(random: Draws, n, kept, num_drafts, residual, p, bonus, drafts):
    """(tokens [B, N+1]: the kept drafts, the emitted token at position n, then -1; last [B]: the emitted token,
    drawn for output position start + n from the residual where the row stopped at a rejection (p there where the
    residual has no mass: weights need not be normalised to be sampled), else from the bonus)."""
    if fused.serves_loop(residual, p, bonus):
        u = _token_uniform(random, n)
        if u is not None:
            return fused.finish(n, num_drafts, residual, p, bonus, u, drafts)
    N = drafts.shape[1]
    at = n.unsqueeze(1)
    stopped = at < (N if num_drafts is None else num_drafts.unsqueeze(1))
    has_mass = residual.sum(dim=-1, keepdim=True) > 0
    final = torch.where(stopped, torch.where(has_mass, residual, p), bonus)
    last = random.sample(final, TOKEN, offset=n)  # [B], drawn for output position start + n
    tokens = torch.nn.functional.pad(torch.where(kept, drafts, -1), (0, 1), value=-1)
    tokens.scatter_(1, at, last.unsqueeze(1))  # the kept drafts, then `last` at position n, then -1
    return tokens, last


def _rule_kernel(rule: Rule, params: dict, temperature: float) -> fused.RuleKernel | None:
    """`rule`'s verify loop in C at its checked `params`, or None: no test in C (`Rule.native_test`), a residual or a
    bonus of its own that is not in C (`Rule.native_residual`, `native_bonus`), more than one tensor input, or no
    library."""
    if rule.native_test is None or (not rule.native_bonus and type(rule).bonus is not Rule.bonus) or (
            not rule.native_residual and type(rule).residual not in (Rule.residual, Rule.residual_argmax)) or (
            len(rule.inputs) > 1):
        return None
    lib = fused.rule_library(rule.name, rule.native_test, rule.native_residual, rule.native_bonus)
    values = [float(params[name]) if isinstance(spec, ParamSpec) else float(spec.choices.index(params[name]))
              for name, spec in rule.params.items()]
    return None if lib is None else fused.RuleKernel(lib, np.array(values + [temperature], dtype=np.float64))


def _draws_token_table(random: Draws | None) -> bool:
    """Whether `random` (None: a generator's draws) gives the round's token uniforms up front (`Draws.token_uniforms`)
    and samples with them as `Draws.sample` does: the verify loop can then be one C call (`fused.verify_default`)."""
    return random is None or (type(random).sample is Draws.sample
                              and type(random).token_uniforms is not Draws.token_uniforms)


def _token_uniform(random: Draws, n: torch.Tensor) -> torch.Tensor | None:
    """The float64 CPU uniforms [B] that `random.sample(weights, TOKEN, offset=n)` draws (the same call: a
    generator advances alike), or None (the torch path) for a source with a `sample` of its own."""
    if type(random).sample is not Draws.sample:
        return None
    u = random.uniform53(TOKEN, int(n) if n.numel() == 1 else n)  # (one row: its column, not a gather)
    return u if u.dtype is torch.float64 and u.is_cpu else None


def _at_bonus(ctx: VerifyContext, num_drafts: torch.Tensor) -> VerifyContext:
    """The block seen from each row's own bonus position num_drafts[b]: a context whose last row
    (what `Rule.bonus` reads) is row num_drafts[b] of p, the target logits and the drafter's logits
    (clamped to the rows the drafter gave: a rule without an extra drafter pass does not read it)."""
    rows = cached_arange(ctx.batch_size, num_drafts.device)
    drafter_row = num_drafts.clamp(max=ctx.draft_logits.shape[1] - 1)
    return VerifyContext(p=ctx.p[rows, num_drafts].unsqueeze(1), q=ctx.q,
                         target_logits=ctx.target_logits[rows, num_drafts].unsqueeze(1),
                         draft_logits=ctx.draft_logits[rows, drafter_row].unsqueeze(1),
                         draft_tokens=ctx.draft_tokens, temperature=ctx.temperature, top_k=ctx.top_k, top_p=ctx.top_p)


def _verify_greedy_strict(target_logits, draft_logits, draft_tokens, draft_probs, num_drafts=None) -> VerifyResult:
    """Strict at temperature 0 in closed form (vLLM's greedy path): p is one-hot on the verifier's
    argmax, so min(1, p(x)/q(x)) is 1 exactly where the draft is that argmax and q(x) > 0 (q one-hot
    on the drafter's argmax, or draft_probs where given), 0 elsewhere; the residual (p - q)+, or p
    where it has no mass, is that argmax again. Same result as the shared loop (tested against
    rules at their strict setting), without one-hot rows or uniforms."""
    N = draft_tokens.shape[1]
    best = target_logits.argmax(dim=-1)  # [B, N+1], first index on ties as one_hot_argmax
    if draft_probs is None:
        drafter_rows = draft_logits if draft_logits.shape[1] == N else draft_logits[:, :N]  # (no bonus-position row)
        proposable = draft_tokens == drafter_rows.argmax(dim=-1)
    else:
        proposable = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1) > 0
    match = (draft_tokens == best[:, :N]) & proposable
    if num_drafts is not None:
        match &= cached_arange(N, match.device) < num_drafts.unsqueeze(1)
    n = match.cumprod(dim=1).sum(dim=1)
    at = n.unsqueeze(1)
    # The kept drafts are the verifier's argmax, and so is the token after them: `best` up to position n, then -1.
    tokens = torch.where(cached_arange(N + 1, best.device) <= at, best, -1)
    accept_prob = match.to(target_logits.dtype)
    return VerifyResult(num_accepted=n, tokens=tokens, accept_prob=accept_prob, strict_accept_prob=accept_prob,
                        accepted=match, relaxed_only=torch.zeros_like(match), last_token=best.gather(1, at).squeeze(1))


def chunk_elements(device: torch.device) -> int:
    """How many block elements (positions x vocabulary) a rule's torch test reads at once at most (`VerifyStep._tests`):
    a rule's dense intermediates (p~, masks, products: a dozen [sequences, N, V] tensors for spec-casc-tok) stay
    bounded. On a CPU 2^22 (16 MB a float32 tensor, under glibc's largest mmap threshold, so they are reused from the
    heap, not mapped and faulted in afresh: spec-casc-tok's step at T = 0 on a block of 55 sequences x 10 drafts x
    151,936 tokens peaks 1.34 GB above its inputs at 490 ms a block whole, 0.82 GB at 235 ms in parts); elsewhere
    2^28."""
    return 1 << 22 if device.type == "cpu" else 1 << 28


def relaxed_targets(
    method: str,
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    **params,
) -> Targets:
    """A rule's dense targets on a block, without sampling (same inputs as `verify`)."""
    rule = get_rule(method)
    ctx = build_context(
        target_logits, draft_logits, draft_tokens, temperature=temperature, top_k=top_k, top_p=top_p
    )
    return rule.targets(ctx, **params)

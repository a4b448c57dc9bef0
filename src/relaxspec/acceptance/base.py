"""What every acceptance rule is made of, and the registry of rules.

A rule is pure math on processed distributions. It gives three things
(docs/design.md, "The unified verify step"):

* `accept_prob`: the probability of accepting draft x_i at each draft position;
* `residual`: unnormalised weights to sample from at the first rejection;
* `bonus`: the distribution of the extra token when all N drafts are accepted.

The defaults below are strict speculative sampling; a rule overrides only what
it changes. The shared loop in `verify.py` draws the uniforms and samples.

A rule also declares what it needs from the engine (class attributes on `Rule`:
`extra_draft_passes`, `reads_q`, `inputs`, `greedy_closed_form`) and how it behaves
with a one-hot q (`valid_with_one_hot_q`, `one_hot_q`) and at temperature 0
(`at_greedy`), so that no layer above `acceptance` needs to know rule names.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

from relaxspec.acceptance.processing import at_tokens, capped_ratio, normalize_or, one_hot_argmax


# ---------------------------------------------------------------- parameters


@dataclass(frozen=True)
class ParamSpec:
    """A scalar hyper-parameter of a rule: default, valid range, strict setting, paper grid.

    low / high of None mean unbounded (and then ±inf itself is allowed only if
    the matching *_inclusive flag is True). strict_value is the setting at which
    the rule is exactly strict speculative sampling, or None if there is none.
    """

    name: str
    default: float
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True
    strict_value: float | None = None
    grid: tuple[float, ...] = ()
    doc: str = ""
    integer: bool = False  # a count (e.g. a top-k): whole numbers only, still given as a float

    def range_str(self) -> str:
        lo = "-inf" if self.low is None else _fmt(self.low)
        hi = "inf" if self.high is None else _fmt(self.high)
        if self.low in (None, -math.inf) and self.high in (None, math.inf):
            if self.low_inclusive and self.high_inclusive:
                return "any float (including ±inf)"
        interval = f"{'[' if self.low_inclusive else '('}{lo}, {hi}{']' if self.high_inclusive else ')'}"
        return "an integer in " + interval if self.integer else interval

    def check(self, value, rule: str) -> float:
        """The value as a float, or ValueError naming the rule, parameter and range."""
        where = f"rule {rule!r}: parameter {self.name!r}"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{where} must be {'' if self.integer else 'a number in '}{self.range_str()}, got {value!r}")
        v = float(value)
        lo = -math.inf if self.low is None else self.low
        hi = math.inf if self.high is None else self.high
        ok_lo = v >= lo if self.low_inclusive else v > lo
        ok_hi = v <= hi if self.high_inclusive else v < hi
        if math.isnan(v) or not (ok_lo and ok_hi) or (self.integer and math.isfinite(v) and v != int(v)):
            raise ValueError(f"{where} must be {'' if self.integer else 'in '}{self.range_str()}, got {value!r}")
        return v


def _fmt(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class ChoiceSpec:
    """A parameter that names one of a few behaviours (e.g. PAD's `floor`): default, choices,
    the choice at which the rule can be strict (or None). Not a grid axis."""

    name: str
    default: str
    choices: tuple[str, ...]
    strict_value: str | None = None
    grid: tuple[str, ...] = ()
    doc: str = ""

    def range_str(self) -> str:
        return "one of " + ", ".join(self.choices)

    def check(self, value, rule: str) -> str:
        """The value, or ValueError naming the rule, parameter and choices."""
        if not isinstance(value, str) or value not in self.choices:
            raise ValueError(f"rule {rule!r}: parameter {self.name!r} must be {self.range_str()}, got {value!r}")
        return value


@dataclass(frozen=True)
class TensorInput:
    """A per-draft-position tensor a rule needs (e.g. PAD's classifier output)."""

    name: str
    low: float
    high: float
    doc: str = ""


@dataclass(frozen=True)
class StateSpec:
    """A per-sequence value a rule carries from block to block (e.g. the regret budget a request has spent): a float
    tensor [B] the rule reads at each block and returns updated (`Rule.next_state`), starting at `initial`. The engine
    keeps it per sequence across rounds; a direct `verify` call without it starts from `initial` (a fresh request)."""

    name: str
    initial: float
    low: float
    high: float
    doc: str = ""


# ---------------------------------------------------------------- targets and context


@dataclass
class Targets:
    """A rule's relaxed targets on a block: accept_prob [B, N], residual [B, N, V]
    (normalised; zero-mass rows fall back to p) and bonus [B, V] (normalised)."""

    accept_prob: torch.Tensor
    residual: torch.Tensor
    bonus: torch.Tensor


class _lazy:
    """functools.cached_property without its lock (Python < 3.12 takes one per read, which costs more than the
    small tensor ops of a batch-1 verify): computed on first read, then a plain instance attribute."""

    def __init__(self, compute):
        self.compute, self.name = compute, compute.__name__

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


class Positions:
    """The quantities a rule sees at a set of draft positions, any leading shape.

    Either the whole draft block ([B, N, ...], `VerifyContext.drafts`) or one
    gathered row per sequence ([B, ...], `VerifyContext.rows`), so the same rule
    code serves the dense targets and the shared loop's residual. Rows are
    gathered lazily: a [B, V] copy is only made for what the rule reads.

    p, q: [..., V] processed verifier / drafter probabilities; z_p, z_q: [..., V]
    raw logits (before temperature); x: [...] draft tokens; p_x, q_x: [...];
    p_tilde: [..., V] verifier at temperature 1 without top-k / top-p.
    On the drafts only (`VerifyContext.drafts`, [B, N]), for a rule whose test at a position reads other positions
    of its row: u, the block's acceptance uniforms [B, N] where the loop drew them before the test (a rule declaring
    `reads_uniforms`, when sampling; None otherwise), and `row_ends` [B], how many drafts each row proposes.
    """

    def __init__(self, sources: dict, select, temperature: float, top_k, top_p, parent=None, u=None,
                 num_drafts=None):
        self._sources = sources  # name -> tensor over the whole block
        self._select = select  # block tensor -> these positions
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.u = u
        self._num_drafts = num_drafts
        # The positions these are selected from (a row: the drafts; the drafts: the block), held as they are: a callable
        # bound to the context would make a reference cycle, and each block's tensors would then wait for the cyclic
        # garbage collector (at a 55 x 11 x 151,936 block, 0.37 GB more every block, until the machine ran out)
        self._parent = parent
        self._shared: dict = {}  # key -> what `shared` computed (or selected) for these positions

    def shared(self, key, compute, whole_block: bool = False):
        """compute(positions): a tensor or a tuple of tensors over these positions, computed once per key and block;
        positions selected from others (a row of the drafts, the drafts of the whole block) select their part of
        what those computed (the shared loop's residual row reads its row of the rule's accept_prob work instead of
        computing it again). whole_block: computed over every position of the block, the bonus position included
        (compute then reads p, z_p and z_q only: q and the drafts have N rows), for work a rule's bonus shares
        (`VerifyContext.whole`). The key names the quantity and every parameter it depends on; the results are
        read-only."""
        done = self._find(key)
        if done is None:
            at = self
            while whole_block and at._parent is not None:
                at = at._parent
            at._shared[key] = compute(at)
            done = self._find(key)
        return done

    def _find(self, key):
        if key in self._shared:
            return self._shared[key]
        done = None if self._parent is None else self._parent._find(key)
        if done is not None:
            done = tuple(map(self._select, done)) if isinstance(done, tuple) else self._select(done)
            self._shared[key] = done
        return done

    @_lazy
    def p(self) -> torch.Tensor:
        return self._select(self._sources["p"])

    @_lazy
    def q(self) -> torch.Tensor:
        return self._select(self._sources["q"])

    @_lazy
    def z_p(self) -> torch.Tensor:
        return self._select(self._sources["z_p"])

    @_lazy
    def z_q(self) -> torch.Tensor:
        return self._select(self._sources["z_q"])

    @_lazy
    def x(self) -> torch.Tensor:
        return self._select(self._sources["x"])

    @_lazy
    def p_x(self) -> torch.Tensor:
        return at_tokens(self.p, self.x)

    @_lazy
    def q_x(self) -> torch.Tensor:
        return at_tokens(self.q, self.x)

    @_lazy
    def p_tilde(self) -> torch.Tensor:
        return self.z_p.softmax(dim=-1)

    @_lazy
    def row_ends(self) -> torch.Tensor:
        """long [B]: the drafts each row proposes (the block's `num_drafts`, else every column of x [B, N]); later
        columns are padding, never proposed."""
        if self._num_drafts is not None:
            return self._num_drafts
        return torch.full(self.x.shape[:1], self.x.shape[1], dtype=torch.long, device=self.x.device)


@dataclass
class VerifyContext:
    """One verify block, validated and processed once.

    p [B, N+1, V] and q [B, N, V] are processed; target_logits [B, N+1, V] and
    draft_logits ([B, N, V] or [B, N+1, V]) are raw; draft_tokens [B, N].
    """

    p: torch.Tensor
    q: torch.Tensor
    target_logits: torch.Tensor
    draft_logits: torch.Tensor
    draft_tokens: torch.Tensor
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    row_drafts: torch.Tensor | None = None  # long [B]: the drafts each row proposes (verify's num_drafts; None: all N)
    uniforms: torch.Tensor | None = None  # [B, N]: the acceptance uniforms, drawn before the test (`reads_uniforms`)
    _drafts: Positions | None = field(default=None, repr=False)
    _whole: Positions | None = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return self.draft_tokens.shape[0]

    @property
    def num_drafts(self) -> int:
        return self.draft_tokens.shape[1]

    @property
    def p_x(self) -> torch.Tensor:
        return self.drafts().p_x

    @property
    def q_x(self) -> torch.Tensor:
        return self.drafts().q_x

    @property
    def p_tilde(self) -> torch.Tensor:
        return self.drafts().p_tilde

    def drafts(self) -> Positions:
        """All N draft positions, [B, N, ...] (cached, so p_x etc. are computed once)."""
        if self._drafts is None:
            n = self.num_drafts  # (q, the drafts and a drafter's N rows have n rows already: read as they are)
            self._drafts = self._positions(lambda t: t if t.shape[1] == n else t[:, :n], self.whole(),
                                           u=self.uniforms, num_drafts=self.row_drafts)
        return self._drafts

    def whole(self) -> Positions:
        """Every position of the block, [B, N+1, ...], the bonus position last: p, z_p and z_q only (q and the
        drafts have N rows), for work a rule shares between its draft positions and its bonus (`Positions.shared`)."""
        if self._whole is None:
            self._whole = self._positions(lambda t: t)
        return self._whole

    def rows(self, b: torch.Tensor, i: torch.Tensor) -> Positions:
        """Draft position i[r] of sequence b[r] for each r: [R, ...]."""
        return self._positions(lambda t: t[b, i], self.drafts())

    def select(self, start: int, stop: int) -> VerifyContext:
        """Sequences start..stop-1 of the block (views: no copy)."""
        part = (lambda t: None if t is None else t[start:stop])
        return VerifyContext(p=self.p[start:stop], q=self.q[start:stop], target_logits=self.target_logits[start:stop],
                             draft_logits=self.draft_logits[start:stop], draft_tokens=self.draft_tokens[start:stop],
                             temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                             row_drafts=part(self.row_drafts), uniforms=part(self.uniforms))

    def row(self, i: int) -> Positions:
        """Draft position i of every sequence: [B, ...], views of the block (no copy: rules never write into what
        they read)."""
        return self._positions(lambda t: t[:, i], self.drafts())

    def _positions(self, select, parent=None, **block) -> Positions:
        sources = dict(p=self.p, q=self.q, z_p=self.target_logits, z_q=self.draft_logits,
                       x=self.draft_tokens)
        return Positions(sources, select, self.temperature, self.top_k, self.top_p, parent, **block)


# ---------------------------------------------------------------- rules


class Rule:
    """Base class: strict speculative sampling. Subclasses override what differs.

    What a rule needs, read by the engine and the bench instead of rule names:

    * `extra_draft_passes`: drafter forward passes per round beyond the N drafting ones. 1 means
      the rule reads the drafter's row at the bonus position, so `verify` requires draft_logits
      [B, N+1, V] (spec-cont-dec's relaxed bonus). A modelled round costs N + this drafter passes.
    * `reads_q`: whether the rule reads the drafter's distribution q (or its logits) at all; a
      rule with False (typical) gives the same result whatever q is.
    * `inputs`: per-draft-position tensors the caller must pass (e.g. PAD's `pivot_prob`).
    * `greedy_closed_form`: at temperature 0, `verify` computes the rule as argmax matching
      (vLLM's greedy path) without uniforms; for any other rule it runs the shared loop on
      one-hot p and q, unless the caller asks `greedy="strict"`.
    * `valid_with_one_hot_q` / `one_hot_q`: a drafter that gives no distribution (prompt lookup,
      fixed drafts) is verified with q one-hot on its draft, the exact law of a deterministic
      proposal. `one_hot_q` says what the rule becomes then; a rule whose acceptance would no
      longer be controlled by the verifier is refused by `check_one_hot_q`.
    * `at_greedy`: what the rule does at temperature 0 (p and q one-hot), for the listing.
    * `relaxes_at_greedy` / `greedy_point(params)`: whether a point of the rule can emit other tokens than strict's
      (which are AR greedy's) at temperature 0, and which point stands for it there (a search at T = 0 runs only
      those, once each: tune.space).
    * `draws_at_greedy`: at temperature 0 its test still keeps some drafts with a probability strictly between 0
      and 1 (ensemble's 1-w), so a caller must give it seeded uniforms there too (the engine does).
    * `reads_uniforms`: its test at a position reads the strict test's outcome at other positions of the row (FLy's
      window of later drafts, a budget spent by earlier ones), so the loop draws the block's acceptance uniforms
      before the test and gives them as `Positions.u` on the drafts (when sampling; at temperature 0 the strict
      test's outcomes are 0 or 1 and u is None). Still only the loop draws.
    * `state`: per-sequence values it carries from block to block (`StateSpec`; a request's spent budget): `verify`
      takes each as a float tensor [B] (default: its initial value) and returns them updated in
      `VerifyResult.state` (`next_state`); the engine keeps them per sequence across rounds and reports them in
      `GenerationStats.rule_state`.

    What a rule's acceptance test trusts, read by the findings report (study.findings) to group rules:

    * `trusts_q`: the rule can accept a draft on the drafter's word alone: at some setting it accepts, with
      positive probability, a drafted token the verifier gives probability 0 (a divergence gate, a cascade
      deferral, a mixture with q). The investigation's "rules that trust q".
    * `accepts_at_least_strict`: at every setting of its numeric parameters (choice parameters at their
      defaults) it accepts every draft at least as often as strict, min(1, p(x)/q(x)): it only loosens
      strict's test.
    """

    name: str = ""
    description: str = ""
    params: dict[str, ParamSpec | ChoiceSpec] = {}
    inputs: dict[str, TensorInput] = {}
    state: dict[str, StateSpec] = {}
    reads_uniforms: bool = False
    extra_draft_passes: int = 0
    reads_q: bool = True
    greedy_closed_form: bool = False
    valid_with_one_hot_q: bool = True
    one_hot_q: str = "accept min(1, p(x)): lossless for a deterministic drafter"
    at_greedy: str = "argmax matching: exactly strict"
    draws_at_greedy: bool = False
    relaxes_at_greedy: bool = False
    trusts_q: bool = False
    accepts_at_least_strict: bool = False

    # The rule's math in C, for the shared loop's one call on float32 CPU blocks when sampling (acceptance/fused.py,
    # `rule_library`; the torch methods below stay the reference, and serve every other case: a test compares the
    # two). native_test names the rule's C file, csrc/rules/<module>.c (one per rule), which defines one function of
    # a position for each piece of math in C (declared in csrc/rule.h), and may call the sampler's C helpers (capped,
    # sum, max, exp_nonpositive, neg_entropy, jsd, total_variation, accept_or_strict, top_candidate_test): p, q the
    # processed rows there, z, zq the verifier's and the drafter's raw logits there, prm the parameters in `params`
    # order (a choice as its index in `choices`), then the temperature.
    # rule_test: `static inline float rule_test(const float *p, const float *q, const float *z, const float *zq,
    # int64_t V, int64_t x, const double *prm, float in)`, accept_prob of the draft x (in: the rule's one tensor input
    # there, e.g. PAD's pivot_prob; 0 for a rule without); NaN declines the block (the torch path serves it).
    # native_residual (True: the file defines it): `static int rule_residual(p, q, z, zq, V, x, prm, float *out)`,
    # the residual's V weights at the first rejection (x the rejected draft), for a rule whose residual is its own
    # (False: strict's, or argmax p by `residual_argmax`). native_bonus (True: the file defines it): `static int
    # rule_bonus(const float *p, const float *z, const float *zq, int64_t V, const double *prm, float *out)`, the
    # bonus's V weights at the bonus position, for a rule whose bonus is its own (False: p). Those two return 0, or
    # nonzero to decline the block.
    native_test: str | None = None
    native_residual: bool = False
    native_bonus: bool = False

    # --- the math (pure; no sampling) ---

    def accept_prob(self, pos: Positions, **params) -> torch.Tensor:
        """[...] probability of accepting pos.x. Default: min(1, p(x)/q(x))."""
        return capped_ratio(pos.p_x, pos.q_x)

    def residual(self, pos: Positions, **params) -> torch.Tensor:
        """[..., V] unnormalised residual weights. Default: (p - q)+."""
        return (pos.p - pos.q).clamp_min_(0.0)

    def bonus(self, ctx: VerifyContext, **params) -> torch.Tensor:
        """[B, V] bonus distribution. Default: p at the bonus position."""
        return ctx.p[:, -1]

    def next_state(self, pos: Positions, relaxed: torch.Tensor, **params) -> dict[str, torch.Tensor]:
        """The rule's `state` after a block: each value [B] from the one it had (in params, by name), the drafts
        (pos, [B, N]) and `relaxed` (bool [B, N]: the drafts kept though the strict test, with the same uniform,
        rejects them). Default: no state."""
        return {}

    def initial_state(self, batch_size: int, device) -> dict[str, torch.Tensor]:
        """Each `state` value at the start of a request, float32 [B] on `device`."""
        return {name: torch.full((batch_size,), spec.initial, dtype=torch.float32, device=device)
                for name, spec in self.state.items()}

    def residual_argmax(self, pos: Positions, **params) -> torch.Tensor:
        """A residual a rule may take as its own (`residual = Rule.residual_argmax`, typical's): one-hot on the
        argmax of p (first index on ties): a rejection emits the verifier's most likely token. With the default
        bonus, `verify` reads it from the block p itself (as strict's residual from p and q: one C call on a CPU)."""
        return one_hot_argmax(pos.p)

    def targets(self, ctx: VerifyContext, **params) -> Targets:
        """Dense targets on the whole block (for inspection; verify only gathers rows)."""
        params = self.validate(params, batch_shape=tuple(ctx.draft_tokens.shape),
                               draft_rows=ctx.draft_logits.shape[1])
        params.update({name: value for name, value in self.initial_state(ctx.batch_size, ctx.p.device).items()
                       if params[name] is None})
        pos = ctx.drafts()
        return Targets(
            accept_prob=self.accept_prob(pos, **params),
            residual=normalize_or(self.residual(pos, **params), pos.p),
            bonus=normalize_or(self.bonus(ctx, **params), ctx.p[:, -1]),
        )

    def greedy_point(self, params: dict) -> dict | None:
        """At temperature 0: None where the point `params` emits strict's tokens (a rule that keeps no draft but the
        verifier's argmax: AR greedy's tokens), else the parameters of the point that stands for every point of the
        rule emitting the same tokens there (`params` itself unless a rule says more). Default: `relaxes_at_greedy`."""
        return dict(params) if self.relaxes_at_greedy else None

    # --- parameters ---

    def strict_params(self) -> dict[str, float] | None:
        """Parameter values at which this rule is exactly strict, or None if it has none."""
        if not self.params:
            return {}
        strict = {n: s.strict_value for n, s in self.params.items() if s.strict_value is not None}
        return strict or None

    def validate(self, params: dict, batch_shape: tuple[int, int] | None = None,
                 draft_rows: int | None = None) -> dict:
        """Defaults filled in; ValueError for unknown names, wrong types, out-of-range
        values, missing / malformed tensor inputs (shape checked if batch_shape [B, N] is given),
        and a missing bonus-position drafter row for a rule with `extra_draft_passes` (checked
        if draft_rows, the number of draft_logits rows, is given with batch_shape)."""
        known = {**self.params, **self.inputs, **self.state}
        for name in params:
            if name not in known:
                valid = ", ".join(known) or "none"
                hint = _owner_hint(name)
                raise ValueError(
                    f"rule {self.name!r} has no parameter {name!r} (its parameters: {valid}){hint}"
                )
        out = {}
        for name, spec in self.params.items():
            out[name] = spec.check(params.get(name, spec.default), self.name)
        for name, spec in self.inputs.items():
            out[name] = self._check_input(spec, params.get(name), batch_shape)
        for name, spec in self.state.items():  # (None: the initial value, on the block's device, filled by the caller)
            out[name] = None if params.get(name) is None else self._check_state(spec, params[name], batch_shape)
        if self.extra_draft_passes and draft_rows is not None and draft_rows != batch_shape[1] + 1:
            raise ValueError(
                f"rule {self.name!r} needs the drafter's row at the bonus position (one extra drafter pass): "
                f"draft_logits must have N+1 = {batch_shape[1] + 1} rows per sequence, got {draft_rows}"
            )
        return out

    def _check_input(self, spec: TensorInput, value, batch_shape, values: bool = True) -> torch.Tensor:
        """The input's type and shape, and (`values`) its values (`_check_input_values`)."""
        where = f"rule {self.name!r}: input {spec.name!r}"
        if value is None:
            raise ValueError(f"{where} is required ({spec.doc})")
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ValueError(f"{where} must be a floating-point torch.Tensor ({spec.doc})")
        if batch_shape is not None and tuple(value.shape) != tuple(batch_shape):
            raise ValueError(
                f"{where} must have shape [B, N] = {list(batch_shape)}, got {list(value.shape)}"
            )
        if values:
            self._check_input_values(spec, value)
        return value

    def _check_state(self, spec: StateSpec, value, batch_shape, device=None, values: bool = True) -> torch.Tensor:
        """A state value as given: a float tensor [B] (shape checked if batch_shape [B, N] is given), its values
        (`values`) in [spec.low, spec.high]; None: the initial value (batch_shape and device needed)."""
        where = f"rule {self.name!r}: state {spec.name!r}"
        if value is None:
            return torch.full(batch_shape[:1], spec.initial, dtype=torch.float32, device=device)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ValueError(f"{where} must be a floating-point torch.Tensor [B] ({spec.doc})")
        if batch_shape is not None and tuple(value.shape) != tuple(batch_shape[:1]):
            raise ValueError(f"{where} must have shape [B] = [{batch_shape[0]}], got {list(value.shape)}")
        if values and value.numel() and not bool(((value >= spec.low) & (value <= spec.high)).all()):
            raise ValueError(f"{where} must lie in [{spec.low:g}, {spec.high:g}] (NaN not allowed)")
        return value

    @staticmethod
    def _input_in_range(spec: TensorInput, value: torch.Tensor) -> torch.Tensor:
        """Where `value` lies in [spec.low, spec.high] (NaN: False), compared in the tensor's dtype."""
        return (value >= spec.low) & (value <= spec.high)

    def _check_input_values(self, spec: TensorInput, value: torch.Tensor) -> None:
        """Every value in [spec.low, spec.high], no NaN (compared in the tensor's dtype). The verify loop's C does
        the same where it reads the input as given (fused.verify_default's `inp_range`)."""
        if value.numel() and not bool(self._input_in_range(spec, value).all()):
            raise ValueError(f"rule {self.name!r}: input {spec.name!r} must lie in [{spec.low:g}, {spec.high:g}] "
                             "(NaN not allowed)")

    def needs_text(self) -> str:
        """One line: what the engine must give this rule (for `relaxspec methods`)."""
        needs = [f"{self.extra_draft_passes} extra drafter pass(es) per round (the bonus-position row)"
                 if self.extra_draft_passes else "no extra drafter pass",
                 "reads q" if self.reads_q else "does not read q"]
        needs += [f"input {name}" for name in self.inputs]
        needs += [f"per-sequence state {name}" for name in self.state]
        if self.reads_uniforms:
            needs.append("reads the block's acceptance uniforms")
        if self.greedy_closed_form:
            needs.append("greedy closed form")
        return "; ".join(needs)

    def __repr__(self) -> str:
        ps = ", ".join(f"{n}={s.default}" for n, s in self.params.items())
        return f"<Rule {self.name}({ps})>"


# ---------------------------------------------------------------- registry

RULES: dict[str, Rule] = {}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: one instance per rule, keyed by its name, in import order."""
    rule = cls()
    if rule.name in RULES:
        raise RuntimeError(f"acceptance rule {rule.name!r} registered twice")
    RULES[rule.name] = rule
    return cls


def get_rule(name) -> Rule:
    try:
        return RULES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown acceptance method {name!r}; known methods: {', '.join(RULES)}"
        ) from None


def check_one_hot_q(rule: Rule | str) -> None:
    """ValueError unless the rule stays meaningful with a one-hot q (a drafter that gives no
    distribution, e.g. prompt lookup); the engine calls it for such drafters."""
    rule = get_rule(rule) if isinstance(rule, str) else rule
    if not rule.valid_with_one_hot_q:
        raise ValueError(
            f"rule {rule.name!r} needs a drafter that gives its distribution q; this drafter gives none "
            f"(q would be one-hot on its draft, and then {rule.one_hot_q})"
        )


def _owner_hint(name: str) -> str:
    owners = [r.name for r in RULES.values() if name in r.params or name in r.inputs or name in r.state]
    if not owners:
        return ""
    return f"; {name!r} is a parameter of: {', '.join(owners)}"

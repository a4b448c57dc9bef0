"""A pre-registered search / confirm protocol (`relaxspec tune --protocol NAME`): for each drafter, temperature and
utility budget, tune searches on one band of problems and confirms its one choice on another band it never read.

The task is `mix:SEARCH/CONFIRM` (tasks.mix): the search band's parts interleaved, then the confirmation band's;
tune's search prompts are exactly the search band and its held-out prompts exactly the confirmation band, so the
race reads only search problems and the confirmation only the others. For each arm (drafter, temperature) and each
budget (max drop vs strict, upper 95 % bound) one tune run: the race at that budget, then the confirmation of its
choice against strict at the same N on the whole confirmation band (one test per budget, at 95 %). Every run shares
one bench store, so a cell (a configuration's samples) is run once whatever budgets or arms read it, and an
interrupted protocol resumes where it stopped (`--protocol NAME` again). At T = 0 strict's tokens are AR greedy's,
so a relaxed configuration's drop is measured against AR's cell (tune.cells.reference) and only the points that can
differ from strict are searched; a budget below the bound that identical outputs reach on the last rung's samples is
searched with strict alone (its answer is strict). The search is bounded by its rungs and caps, not by a clock, so
its cost can be priced before it starts (`price`: by the cells still to run, at each drafter's cost) and a resumed
search runs the rungs an uninterrupted one would; a run in parts (`hours`) stops before samples that would not fit
(between cells, or between a cell's generate calls, each stored as it ends). Every part runs on one kind of machine
(`machine_kind`, recorded in OUT/machine.txt by the first part): its speed constants decide the search, and an int4
model's numbers follow the kernel the CPU runs; a part elsewhere is refused in one line (`any_machine` overrides).

The report: per arm and budget, the choice, its held-out drop vs strict with its interval, whether the bound held
(else the answer is strict, and by how much the candidate missed), its modelled speed-up over AR (the objective,
length-adjusted and block-aware) and its measured batch-1 speed-up on held-out prompts, next to the fastest strict's.
"""

from __future__ import annotations

import csv
import math
import platform
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from relaxspec.acceptance import is_greedy
from relaxspec.bench import Costs, stats
from relaxspec.names import AR, STRICT
from relaxspec.tune.racing import ALPHA, default_caps
from relaxspec.tune.run import STRICT_SPEED_JOBS, TuneConfig, TuneResult, least_drop_bound, run_tune
from relaxspec.tune.space import Config, search_space

PART_HOURS = 2.5  # the longest part of a protocol run the plan proposes (`--hours`)


@dataclass(frozen=True)
class Protocol:
    name: str
    about: str
    verifier: str | None  # None: the built-in verifier
    drafters: tuple[str, ...]
    temperatures: tuple[float, ...]
    budgets: tuple[float, ...]  # max drops vs strict at the same N (upper 95 % bound)
    search: str  # a band of tasks.mix: "TASK[a:b],TASK[a:b]"
    confirm: str
    heldout_repeats: dict  # temperature -> samples per confirmation problem (T = 0: 1; sampled: several)
    costs: Costs  # what a sample costs, for the price: a batched AR answer, a cell's ratio per drafter, a run's start
    top_p: float | None = 0.95  # at T > 0
    max_new_tokens: int = 160
    methods: tuple[str, ...] | None = None  # None: every rule the drafter serves
    draft_lengths: tuple = (2, 3, 4, 5, "auto")
    sizes: tuple = (6, 24, 72, 240)  # the race's rungs
    caps: tuple | None = None  # configurations going on after each rung but the last (None: racing.default_caps)
    dtype: str | None = None
    batch_size: int | None = None  # samples per generate call (None: a cell's missing samples at once)
    speed_prompts: int = 10  # batch-1 timing prompts of a confirmation cell (the bench's timing)
    seed: int = 0

    @property
    def task(self) -> str:
        return f"mix:{self.search}/{self.confirm}"

    def arms(self) -> list[tuple[str, float]]:
        return [(d, t) for d in self.drafters for t in self.temperatures]

    def bands(self) -> tuple[int, int]:
        """(search, confirmation) band sizes (loads the parts)."""
        from relaxspec.tasks import get_task

        search, confirm = get_task(self.task).meta["bands"]
        return search, confirm

    def rung_caps(self) -> tuple:
        return self.caps if self.caps is not None else default_caps(self.sizes)

    def serves(self, drafter: str, method: str) -> bool:
        """Whether the drafter's kind can serve the rule `method` (Drafter.refusal: known before any model loads)."""
        from relaxspec.acceptance import get_rule
        from relaxspec.drafters import drafter_class

        return drafter_class(drafter).refusal(get_rule(method.split(":", 1)[0]), drafter) is None

    def methods_of(self, drafter: str) -> list[str] | None:
        """The rules an arm searches: `methods` less those the drafter cannot serve (None: every rule it serves, as
        tune decides)."""
        return None if self.methods is None else [m for m in self.methods if self.serves(drafter, m)]

    def decidable(self, budget: float) -> bool:
        """Whether the search's last rung can show a drop within `budget` (run.least_drop_bound): a budget it cannot
        searches strict alone, so its answer is strict."""
        return budget >= least_drop_bound(self.sizes[-1])

    def space(self, drafter: str, temperature: float) -> list[Config]:
        """The configurations an arm's races start with (no model loads; with every rule, PAD left out: no
        classifier is assumed to fit the pair; at T = 0 only the points that can differ from strict)."""
        return [c for c in search_space(self.methods_of(drafter), self.draft_lengths, greedy=is_greedy(temperature))
                if self.serves(drafter, c.method)]

    def cell_seconds(self, method: str, drafter: str | None, samples: int) -> float:
        """Seconds of `samples` batched samples of a cell (bench.Costs: AR's answer, times the drafter's ratio for a
        speculative cell)."""
        return samples * self.costs.sample_s * self.costs.batch_ratio(method, drafter or "")

    def tune_config(self, drafter: str, temperature: float, budget: float, out: str) -> TuneConfig:
        search, confirm = self.bands()
        methods = self.methods_of(drafter) if self.decidable(budget) else [STRICT]
        return TuneConfig(verifier=self.verifier, drafter=drafter, task=self.task, max_drop=budget, methods=methods,
                          draft_lengths=list(self.draft_lengths), budget_minutes=math.inf, search_prompts=search,
                          heldout_prompts=confirm, heldout_repeats=self.heldout_repeats.get(temperature, 1),
                          sizes=self.sizes, caps=self.caps, seed=self.seed, temperature=temperature,
                          top_p=self.top_p if temperature > 0 else None, max_new_tokens=self.max_new_tokens, out=out,
                          dtype=self.dtype, confirm_timing=True, batch_size=self.batch_size, fixed_bands=True,
                          speed_prompts=self.speed_prompts)


PROTOCOLS = {p.name: p for p in (
    Protocol("qwen-coder", "Qwen2.5-Coder-1.5B-Instruct verifying (int4): search on half of MBPP and GSM8K's first "
             "250, confirm on HumanEval and the next 118 of MBPP and of GSM8K (400 problems)",
             "qwen2.5-coder-1.5b", ("qwen2.5-coder-0.5b", "ngram"), (0.0, 0.7), (0.01, 0.03, 0.05),
             "mbpp-instruct[0:250],gsm8k[0:250]", "humaneval-instruct,mbpp-instruct[250:368],gsm8k[250:368]",
             {0.0: 1, 0.7: 1},
             # measured on the search band (2026-12-07 21:18-21:55, a quiet 2-core machine, batches of 24, up to 512
             # tokens, T = 0.7, 160 samples each): AR 4.8 s a batched answer (221 tokens on average), strict with the
             # 0.5B at N = 3 6.5 s (1.37x AR's); a batch lasts as long as its longest answer
             Costs(batch_answer_s=4.8, batch_spec_ratio=1.37), max_new_tokens=512,
             # the last rung's 160 samples let a configuration identical to strict pass 0.03 (its bound: 0.023; 0.01
             # is searched with strict alone); N = 3 alone (the 0.5B's fastest at batch 1, prompt lookup within 7 % of
             # its fastest: docs/results/real-pair-peer-t2-vnni.csv) and two, then one configurations on: the price
             draft_lengths=(3,), sizes=(8, 32, 160), caps=(2, 1), dtype="int4", batch_size=24),
    Protocol("builtin", "the built-in verifier and drafter-weak: search on arithmetic and sorting's first 60 each, "
             "confirm on the next 40 each", None, ("drafter-weak",), (0.0, 0.7), (0.01, 0.03, 0.05),
             "arithmetic[0:60],sorting[0:60]", "arithmetic[60:100],sorting[60:100]", {0.0: 1, 0.7: 2},
             # a guess for the tiny pair: 0.05 s a batched answer, 0.1 s one alone, 10 s to start a run
             Costs(ar_s_per_token=0.002, batch_ar_s_per_token=0.001, tokens_per_answer=50, overhead_s=10.0),
             sizes=(6, 24, 160), draft_lengths=(3, 5)),  # 160 samples: 0.03 and 0.05 can be shown, as qwen-coder's
)}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


# ---------------------------------------------------------------- the price


def search_samples(space: list[Config], runs: int, sizes, caps, references: bool = True, strict_race: bool = False,
                   stored: dict | None = None) -> tuple[int, int]:
    """(speculative samples, AR samples) that one arm's races may still run, at most: `runs` races over `space` and,
    with `strict_race`, one over its strict configurations alone (a budget the last rung cannot decide). Races of one
    arm share their cells (a cell's samples run once), so: every configuration at the first rung; at a later rung at
    most `runs` x its cap configurations, and strict at each N where it is a live configuration's reference
    (`references`; at T = 0 AR is, and strict goes on as the race's lossless fallback, one a race); AR at every
    rung. `stored`: configuration (None: AR) -> the indices j of its stored search samples (sample j: the j-th a race
    reads), subtracted: exactly at the first rung, from the bound at the others."""
    if not runs and not strict_race:
        return 0, 0
    stored = stored or {}

    def have(config, lo: int, hi: int) -> int:
        return sum(lo <= j < hi for j in stored.get(config, ()))

    first = space if runs else [c for c in space if c.is_strict]
    stricts = sum(c.is_strict for c in space)
    go_on = stricts if references or strict_race else min(stricts, runs)
    spec = sum(sizes[0] - have(c, 0, sizes[0]) for c in first)
    for rung in range(1, len(sizes)):
        lo, hi = sizes[rung - 1], sizes[rung]
        bound = min(len(first), runs * caps[rung - 1] + go_on) * (hi - lo)
        spec += max(0, bound - sum(have(c, lo, hi) for c in first))
    return spec, sizes[-1] - have(None, 0, sizes[-1])


def confirmation_cells(relaxed: int, strict_only: int, lengths: int, references: bool = True) -> tuple[int, int]:
    """(relaxed cells, strict cells) the held-out confirmations of an arm's budgets still to decide may read, AR's
    aside, at most: `relaxed` budgets each a choice of its own, its reference (strict at the choice's N, where
    `references`: at T = 0 AR is) and the fastest strict of its search; `strict_only` budgets (strict searched alone)
    the fastest strict; strict cells at most one per draft length searched (`lengths`)."""
    return relaxed, min(lengths, relaxed * (2 if references else 1) + strict_only)


@dataclass(frozen=True)
class ArmPrice:
    drafter: str
    temperature: float
    configs: int  # configurations its races start with
    search_s: float  # at most: search samples its races may still run
    confirm_cells: int  # held-out cells still to run (AR's counted with the first arm of its temperature)
    confirm_s: float  # at most: their samples, and the batch-1 timing of each new speculative one
    start_s: float  # loading the pair and measuring its speed constants, once a run still to go

    @property
    def total_s(self) -> float:
        return self.search_s + self.confirm_s + self.start_s

    @property
    def parts(self) -> int:
        """Parts of at most PART_HOURS it runs in (`--hours`)."""
        return math.ceil(self.total_s / (PART_HOURS * 3600))


def price(protocol: Protocol, out: str | Path | None = None, drafters=None, temperatures=None) -> list[ArmPrice]:
    """What each arm (of the named drafters / temperatures) still costs, at most, on the machine `protocol.costs`
    describes (a cell's samples at its drafter's cost, Costs.batch_ratio): its races' search samples
    (search_samples), its confirmations' held-out cells (confirmation_cells) on the whole confirmation band with the
    batch-1 timing of each, AR's held-out cell once a temperature, and each tune run's start. With `out`, what its
    store holds is subtracted and the budgets decided in out/protocol.csv cost nothing."""
    _, confirm_n = protocol.bands()
    decided = decided_budgets(out)
    store = _open_store(out)
    prices, ar_counted = [], set()
    try:
        for drafter, t in protocol.arms():
            if (drafters and drafter not in drafters) or (temperatures and t not in temperatures):
                continue
            space = protocol.space(drafter, t)
            left = [b for b in protocol.budgets if (drafter, t, b) not in decided]
            runs = sum(map(protocol.decidable, left))
            references = not is_greedy(t)
            stored = _Stored(protocol, drafter, t, out, store) if store is not None and left else None
            spec, ar = search_samples(space, runs, protocol.sizes, protocol.rung_caps(), references,
                                      runs < len(left), stored.search(space) if stored else None)
            with_ar = bool(left) and t not in ar_counted  # AR's cells serve every drafter: counted once a temperature
            ar_counted.update([t] if with_ar else [])
            search_s = protocol.cell_seconds(STRICT, drafter, spec) + protocol.cell_seconds(AR, None, ar * with_ar)
            lengths = len(dict.fromkeys(c.draft_length for c in space))
            samples = confirm_n * protocol.heldout_repeats.get(t, 1)
            ar_left = max(0, samples - stored.heldout(None)) if stored and with_ar else samples * with_ar
            relaxed, strict = confirmation_cells(runs, len(left) - runs, lengths, references)
            strict_samples = samples if references else min(samples, STRICT_SPEED_JOBS)  # (run.confirmation_jobs)
            timing_s = protocol.speed_prompts * protocol.costs.ar_s_per_token * protocol.costs.tokens_per_answer
            confirm_s = relaxed * (protocol.cell_seconds(STRICT, drafter, samples) + timing_s) + \
                strict * (protocol.cell_seconds(STRICT, drafter, strict_samples) + timing_s) + \
                protocol.cell_seconds(AR, None, ar_left)
            prices.append(ArmPrice(drafter, t, len(space), search_s, relaxed + strict + bool(ar_left), confirm_s,
                                   len(left) * protocol.costs.overhead_s))
    finally:
        if store is not None:
            store.close()
    return prices


class _Stored:
    """The stored samples of an arm's cells (keys as tune's cells make them; no model loads)."""

    def __init__(self, protocol: Protocol, drafter: str, temperature: float, out, store):
        from relaxspec.bench import Workbench

        self.config = protocol.tune_config(drafter, temperature, protocol.budgets[0], str(out))
        bench = self.config.bench_config(self.config.search_prompts + self.config.heldout_prompts)
        self.verifier, self.drafter = bench.verifiers[0], bench.drafters[0]
        self.workbench, self.store = Workbench(bench, store=store), store

    def _have(self, config: Config | None, heldout: bool) -> dict:
        from relaxspec.tune.cells import band, cell_spec

        spec = cell_spec(self.config, self.verifier, self.drafter, config)
        return self.store.utilities(self.workbench.key(spec, **band(self.config, heldout)))

    def search(self, space: list[Config]) -> dict:
        """configuration (None: AR) -> the indices of its stored search samples (run.search_jobs' order)."""
        L = self.config.search_prompts
        return {c: {p + r * L for p, r in self._have(c, False)} for c in [*space, None]}

    def heldout(self, config: Config | None) -> int:
        return len(self._have(config, True))


def _open_store(out):
    """The bench store under `out`, None if it has none (nothing stored yet)."""
    from relaxspec.bench import Store

    try:
        return Store.open_existing(out) if out is not None else None
    except FileNotFoundError:
        return None


def decided_budgets(out) -> set:
    """{(drafter, temperature, budget)} of the decisions in out/protocol.csv."""
    path = Path(out) / REPORT if out is not None else None
    if path is None or not path.exists():
        return set()
    with open(path, newline="") as f:
        return {(r["drafter"], float(r["temperature"]), float(r["budget"])) for r in csv.DictReader(f)}


class OutOfTime(Exception):
    """A part of the protocol stopped before samples that would not fit its hours; the same command goes on."""


class Pace:
    """A part of at most `hours`: before a cell runs and between its generate calls (tune's cells call it with
    [(spec, samples it lacks)]), stop (OutOfTime) if the price of what it lacks would take the part past its hours;
    every finished call is stored. The part's first call always runs."""

    clock = staticmethod(time.monotonic)

    def __init__(self, protocol: Protocol, hours: float):
        if not hours > 0:
            raise ValueError(f"tune --protocol: hours must be > 0, got {hours}")
        self.protocol, self.hours, self.start, self.started = protocol, hours, self.clock(), False

    def __call__(self, lacking) -> None:
        cost = sum(self.protocol.cell_seconds(spec.method, spec.drafter, n) for spec, n in lacking)
        if self.started and self.clock() - self.start + cost > self.hours * 3600:
            raise OutOfTime(f"stopped before ~{cost / 60:.0f} min of a cell's samples that would take this part "
                            f"past {self.hours:g} h; every finished generate call is stored: the same command goes "
                            "on")
        self.started = True


@dataclass
class Decision:
    drafter: str
    temperature: float
    budget: float
    result: TuneResult
    files: dict = field(default_factory=dict)

    @property
    def confirmation(self):
        return self.result.confirmation

    def row(self) -> dict:
        """The report's row (see the module doc)."""
        c = self.confirmation
        row = {"drafter": self.drafter, "temperature": self.temperature, "budget": self.budget,
               "search_choice": self.result.choice.label if self.result.choice else "none"}
        if c is None:
            return {**row, "answer": "strict", "held": False}
        diff = c.choice.diff(1 - ALPHA)
        strict = c.strict_best or (c.choice if c.choice.config.is_strict else None)
        speed, strict_speed = c.choice.speed(1 - ALPHA), strict.speed(1 - ALPHA) if strict else None
        held = c.drop_held
        answer = self.result.choice.label if held else (strict.config.label if strict else "strict")
        return {**row, "answer": answer, "held": held, "samples": c.samples,
                "drop": -diff.mean, "drop_low": -diff.high, "drop_high": -diff.low,
                "missed_by": 0.0 if held else max(0.0, -diff.low - self.budget),
                "identical_to_strict": c.choice.identical(),
                "modelled": speed.mean, "modelled_low": speed.low, "modelled_high": speed.high,
                "measured_b1": c.choice.batch1, "strict_label": strict.config.label if strict else "",
                "strict_modelled": strict_speed.mean if strict_speed else math.nan,
                "strict_measured_b1": strict.batch1 if strict else None}


def run_protocol(protocol: Protocol, out: str | Path, progress: bool = True, drafters=None, temperatures=None,
                 executor=None, on_decision=None, hours: float | None = None,
                 any_machine: bool = False) -> list[Decision]:
    """Every run of the protocol (or of the named drafters / temperatures), in order, into one store under `out`;
    each run's choice written to `out/choices/`, each decision to out/protocol.csv as it lands. `on_decision(decision)`
    after each run (the CLI prints it). `hours`: a part of at most that long (Pace): OutOfTime once the next samples
    would not fit, every finished generate call stored; the same call goes on from there. A ValueError before
    anything runs where `out` was begun on another kind of machine (`check_machine`; `any_machine`: go on)."""
    from relaxspec.tune.report import write_outputs

    out = Path(out)
    check_machine(out, any_machine)
    pace = Pace(protocol, hours) if hours is not None else None
    decisions = []
    for drafter, t in protocol.arms():
        if (drafters and drafter not in drafters) or (temperatures and t not in temperatures):
            continue
        for budget in protocol.budgets:
            config = protocol.tune_config(drafter, t, budget, str(out))
            result = run_tune(config, progress=progress, executor=executor, pace=pace)
            stem = f"choices/{_safe(drafter)}-T{t:g}-drop{budget:g}"
            (out / "choices").mkdir(parents=True, exist_ok=True)
            write_outputs(result, plots=True, stem=stem)
            decision = Decision(drafter, t, budget, result, {"toml": result.toml_path, "plot": result.plot_path})
            decisions.append(decision)
            write_report(protocol, decisions, out)
            if on_decision is not None:
                on_decision(decision)
    return decisions


MACHINE = "machine.txt"


def machine_kind() -> str:
    """The kind of machine a protocol's parts must share: the CPU's architecture and the int4 kernel it runs, by
    instruction set and layout (e.g. "x86_64, int4 kernel avx512 / vnni"; "x86_64, int4 kernel avx2 / vnni": the
    same numbers, other costs; "none / aten": aten's kernel, other numbers). The speed constants each part measures
    (c_rel, c_block) decide the search and price the choices, and they differ between these kinds by 2x and more."""
    from relaxspec.models import int4_block
    from relaxspec.models.quant import int4_layout

    layout = int4_layout()
    return f"{platform.machine()}, int4 kernel {int4_block.isa() if layout != 'aten' else 'none'} / {layout}"


def check_machine(out: str | Path, any_machine: bool = False) -> str:
    """This machine's kind (`machine_kind`), recorded in OUT/machine.txt where the store has none yet; a one-line
    ValueError where it records another kind, unless `any_machine` (then the record is kept as it is)."""
    path, kind = Path(out) / MACHINE, machine_kind()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(kind + "\n")
        return kind
    recorded = path.read_text().strip()
    if recorded != kind and not any_machine:
        raise ValueError(f"{out} was begun on a machine of another kind ({recorded}); this one is {kind}: its speed "
                         "constants would decide the search on other costs. Run the parts on one kind of machine, or "
                         "pass --any-machine to go on anyway")
    return kind


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


COLUMNS = ["drafter", "temperature", "budget", "search_choice", "answer", "held", "samples", "drop", "drop_low",
           "drop_high", "missed_by", "identical_to_strict", "modelled", "modelled_low", "modelled_high", "measured_b1",
           "strict_label", "strict_modelled", "strict_measured_b1"]


REPORT = "protocol.csv"


def write_report(protocol: Protocol, decisions: list[Decision], out: Path) -> Path:
    """out/protocol.csv: one row per decision (COLUMNS), in the protocol's order; the rows of decisions made by
    earlier runs (other parts) are kept unless one of `decisions` replaces them."""
    path = Path(out) / REPORT
    rows = {}
    if path.exists():
        with open(path, newline="") as f:
            rows = {(r["drafter"], float(r["temperature"]), float(r["budget"])): r for r in csv.DictReader(f)}
    rows.update({(d.drafter, d.temperature, d.budget): d.row() for d in decisions})
    order = [(d, t, b) for d, t in protocol.arms() for b in protocol.budgets]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        w.writeheader()
        for key in sorted(rows, key=lambda k: order.index(k) if k in order else len(order)):
            w.writerow(rows[key])
    return path


def _num(x, fmt="{:.3f}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def format_decision(d: Decision) -> str:
    """One line: the decision for an arm and a budget (one test: the held-out drop's upper bound vs the budget)."""
    r = d.row()
    head = f"{d.drafter}, T = {d.temperature:g}, budget {d.budget:g}:"
    if "drop" not in r:
        return f"{head} nothing chosen in the search; answer: strict"
    drop = (f"held-out drop {stats.format_interval((r['drop'], r['drop_low'], r['drop_high']))} on {r['samples']} "
            "samples")
    speed = (f"modelled x{stats.format_interval((r['modelled'], r['modelled_low'], r['modelled_high']), '{:.2f}')}, "
             f"measured x b1 {_num(r['measured_b1'], '{:.2f}')} (fastest strict "
             f"{r['strict_label'] or '-'}: x{_num(r['strict_modelled'], '{:.2f}')}, b1 "
             f"{_num(r['strict_measured_b1'], '{:.2f}')})")
    if r["held"]:
        return f"{head} {r['search_choice']} confirmed: {drop}, bound {_num(r['drop_high'])} <= {d.budget:g}; {speed}"
    return (f"{head} {r['search_choice']} NOT confirmed: {drop}, bound {_num(r['drop_high'])} > {d.budget:g} "
            f"(missed by {_num(r['missed_by'])}); answer: {r['answer']}")


def format_plan(protocol: Protocol, drafters=None, temperatures=None, out: str | Path | None = None) -> str:
    """The bands, the search's rungs and the price of each arm, with the parts of at most PART_HOURS it runs in
    (price; `out`: what its store and protocol.csv hold is subtracted)."""
    search, confirm = protocol.bands()
    p = replace(protocol, drafters=tuple(d for d in protocol.drafters if not drafters or d in drafters),
                temperatures=tuple(t for t in protocol.temperatures if not temperatures or t in temperatures))
    arms = price(p, out)
    c = p.costs
    strict_only = [b for b in p.budgets if not p.decidable(b)]
    lines = [f"protocol {p.name}: {p.about}",
             f"  verifier {p.verifier or 'built-in'}; drafters {', '.join(p.drafters)}; temperatures "
             f"{', '.join(f'{t:g}' for t in p.temperatures)}; budgets {', '.join(f'{b:g}' for b in p.budgets)} "
             f"(one test each, upper 95 % bound of the held-out drop vs strict at the same N)",
             f"  search band: {search} problems ({p.search}); confirmation band: {confirm} problems ({p.confirm}), "
             f"never read by the search",
             f"  search: rungs of {', '.join(map(str, p.sizes))} samples a configuration, then "
             f"{', '.join(map(str, p.rung_caps()))} configurations on (no clock: the rungs bound it)"
             + (f"; {', '.join(f'{b:g}' for b in strict_only)}: below the bound identical outputs reach on "
                f"{p.sizes[-1]} samples ({least_drop_bound(p.sizes[-1]):.3f}), strict searched alone"
                if strict_only else ""),
             "  at T = 0 strict's tokens are AR's: AR's cell is each relaxed configuration's reference, only the "
             f"points that can differ from strict are searched, and strict is held out on {STRICT_SPEED_JOBS} answers "
             "for its speed",
             f"  price, at most ({c.sample_s:.2g} s a batched AR answer; a speculative cell's "
             + ", ".join(f"{c.batch_ratio(STRICT, d):.2g}x with {d}" for d in p.drafters)
             + f"; {c.overhead_s / 60:.2g} min to start each run):"]
    for a in arms:
        lines.append(f"    {a.drafter}, T = {a.temperature:g}: search {a.search_s / 3600:.1f} h ({a.configs} "
                     f"configurations), confirmation {a.confirm_s / 3600:.1f} h ({a.confirm_cells} cells), starts "
                     f"{a.start_s / 3600:.2f} h: {a.total_s / 3600:.1f} h"
                     + (f" {_parts(a.parts)}" if a.parts > 1 else ""))
    total = [sum(getattr(a, name) for a in arms) / 3600 for name in ("search_s", "confirm_s", "start_s", "total_s")]
    lines.append(f"  in all: at most {total[3]:.1f} h (search {total[0]:.1f} h, confirmation {total[1]:.1f} h, starts "
                 f"{total[2]:.1f} h), " + ("less what OUT holds" if out is not None else "before anything is stored")
                 + f"; {_parts(math.ceil(total[3] / PART_HOURS))} of at most {PART_HOURS:g} h: `relaxspec tune "
                 f"--protocol {p.name} --hours {PART_HOURS:g}` (--drafter / --temperature: one arm), the same command "
                 "until every decision is made")
    return "\n".join(lines)


def _parts(n: int) -> str:
    return f"in {n} part{'s' if n != 1 else ''}"

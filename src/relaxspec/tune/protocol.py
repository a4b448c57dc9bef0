"""A pre-registered search / confirm protocol (`relaxspec tune --protocol NAME`): for each drafter, temperature and
utility budget, tune searches on one band of problems and confirms its one choice on another band it never read.

The task is `mix:SEARCH/CONFIRM` (tasks.mix): the search band's parts interleaved, then the confirmation band's;
tune's search prompts are exactly the search band and its held-out prompts exactly the confirmation band, so the
race reads only search problems and the confirmation only the others. For each arm (drafter, temperature) and each
budget (max drop vs strict, upper 95 % bound) one tune run: the race at that budget, then the confirmation of its
choice against strict at the same N on the whole confirmation band (one test per budget, at 95 %). Every run shares
one bench store, so a cell (a configuration's samples) is run once whatever budgets or arms read it, and an
interrupted protocol resumes where it stopped (`--protocol NAME` again).

The report: per arm and budget, the choice, its held-out drop vs strict with its interval, whether the bound held
(else the answer is strict, and by how much the candidate missed), its modelled speed-up over AR (the objective,
length-adjusted and block-aware) and its measured batch-1 speed-up on held-out prompts, next to the fastest strict's.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from relaxspec.tune.racing import ALPHA
from relaxspec.tune.run import TuneConfig, TuneResult, run_tune


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
    top_p: float | None = 0.95  # at T > 0
    max_new_tokens: int = 160
    methods: tuple[str, ...] | None = None  # None: every rule the drafter serves
    draft_lengths: tuple = (2, 3, 4, 5, "auto")
    sizes: tuple = (6, 24, 72, 240)  # the race's rungs
    search_minutes: float = 30.0  # each run's search budget (later rungs start only if they fit)
    dtype: str | None = None
    batch_size: int | None = None  # samples per generate call (None: a cell's missing samples at once)
    speed_prompts: int = 10  # batch-1 timing prompts of a confirmation cell (the bench's timing)
    seed: int = 0
    sample_s: float = 0.05  # seconds of one batched AR answer, for the price (protocol_price)
    spec_ratio: float = 1.3  # a speculative cell's batched sample / AR's

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

    def tune_config(self, drafter: str, temperature: float, budget: float, out: str) -> TuneConfig:
        search, confirm = self.bands()
        return TuneConfig(verifier=self.verifier, drafter=drafter, task=self.task, max_drop=budget,
                          methods=list(self.methods) if self.methods else None, draft_lengths=list(self.draft_lengths),
                          budget_minutes=self.search_minutes, search_prompts=search, heldout_prompts=confirm,
                          heldout_repeats=self.heldout_repeats.get(temperature, 1), sizes=self.sizes, seed=self.seed,
                          temperature=temperature, top_p=self.top_p if temperature > 0 else None,
                          max_new_tokens=self.max_new_tokens, out=out, dtype=self.dtype, confirm_timing=True,
                          batch_size=self.batch_size, fixed_bands=True, speed_prompts=self.speed_prompts)


PROTOCOLS = {p.name: p for p in (
    Protocol("qwen-coder", "Qwen2.5-Coder-1.5B-Instruct verifying (int4): search on half of MBPP and GSM8K's first "
             "250, confirm on HumanEval, the other half of MBPP and the next 150 of GSM8K (564 problems)",
             "qwen2.5-coder-1.5b", ("qwen2.5-coder-0.5b", "ngram"), (0.0, 0.7), (0.01, 0.03, 0.05),
             "mbpp-instruct[0:250],gsm8k[0:250]", "humaneval-instruct,mbpp-instruct[250:500],gsm8k[250:400]",
             {0.0: 1, 0.7: 1}, max_new_tokens=512, draft_lengths=(3, 5, "auto"), sizes=(8, 32, 96),
             search_minutes=20.0, dtype="int4", batch_size=24,
             sample_s=3.9),  # bench.presets.Costs: 18.4 ms an answer's token in a batch of 16, 210 tokens
    Protocol("builtin", "the built-in verifier and drafter-weak: search on arithmetic and sorting's first 60 each, "
             "confirm on the next 40 each", None, ("drafter-weak",), (0.0, 0.7), (0.01, 0.03, 0.05),
             "arithmetic[0:60],sorting[0:60]", "arithmetic[60:100],sorting[60:100]", {0.0: 1, 0.7: 2},
             sizes=(6, 24, 72), search_minutes=3.0, draft_lengths=(3, 5), sample_s=0.05),
)}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def price(protocol: Protocol, confirm: int) -> tuple[float, float]:
    """(search hours at most: every run's search budget; confirmation hours, estimated: per arm each budget's
    choice, strict at the choices' N and the fastest strict, and AR once per temperature (the AR cell does not depend
    on the drafter), on the whole confirmation band at the protocol's seconds per batched sample)."""
    runs = len(protocol.arms()) * len(protocol.budgets)
    search_h = runs * protocol.search_minutes / 60
    confirm_s = 0.0
    for drafter, t in protocol.arms():
        samples = confirm * protocol.heldout_repeats.get(t, 1)
        cells = len(protocol.budgets) + 2
        confirm_s += samples * protocol.sample_s * protocol.spec_ratio * cells
    confirm_s += sum(confirm * protocol.heldout_repeats.get(t, 1) * protocol.sample_s for t in protocol.temperatures)
    return search_h, confirm_s / 3600


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
                 executor=None, on_decision=None) -> list[Decision]:
    """Every run of the protocol (or of the named drafters / temperatures), in order, into one store under `out`;
    each run's choice written to `out/choices/`. `on_decision(decision)` after each run (the CLI prints it)."""
    from relaxspec.tune.report import write_outputs

    out = Path(out)
    decisions = []
    for drafter, t in protocol.arms():
        if (drafters and drafter not in drafters) or (temperatures and t not in temperatures):
            continue
        for budget in protocol.budgets:
            config = protocol.tune_config(drafter, t, budget, str(out))
            result = run_tune(config, progress=progress, executor=executor)
            stem = f"choices/{_safe(drafter)}-T{t:g}-drop{budget:g}"
            (out / "choices").mkdir(parents=True, exist_ok=True)
            write_outputs(result, plots=True, stem=stem)
            decision = Decision(drafter, t, budget, result, {"toml": result.toml_path, "plot": result.plot_path})
            decisions.append(decision)
            if on_decision is not None:
                on_decision(decision)
    write_report(protocol, decisions, out)
    return decisions


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


COLUMNS = ["drafter", "temperature", "budget", "search_choice", "answer", "held", "samples", "drop", "drop_low",
           "drop_high", "missed_by", "identical_to_strict", "modelled", "modelled_low", "modelled_high", "measured_b1",
           "strict_label", "strict_modelled", "strict_measured_b1"]


def write_report(protocol: Protocol, decisions: list[Decision], out: Path) -> Path:
    """out/protocol.csv: one row per decision (COLUMNS)."""
    path = Path(out) / "protocol.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        w.writeheader()
        for d in decisions:
            w.writerow(d.row())
    return path


def _num(x, fmt="{:.3f}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def format_decision(d: Decision) -> str:
    """One line: the decision for an arm and a budget (one test: the held-out drop's upper bound vs the budget)."""
    r = d.row()
    head = f"{d.drafter}, T = {d.temperature:g}, budget {d.budget:g}:"
    if "drop" not in r:
        return f"{head} nothing chosen in the search; answer: strict"
    drop = f"held-out drop {_num(r['drop'])} [{_num(r['drop_low'])}, {_num(r['drop_high'])}] on {r['samples']} samples"
    speed = (f"modelled x{_num(r['modelled'], '{:.2f}')} [{_num(r['modelled_low'], '{:.2f}')}, "
             f"{_num(r['modelled_high'], '{:.2f}')}], measured x b1 {_num(r['measured_b1'], '{:.2f}')} (fastest strict "
             f"{r['strict_label'] or '-'}: x{_num(r['strict_modelled'], '{:.2f}')}, b1 "
             f"{_num(r['strict_measured_b1'], '{:.2f}')})")
    if r["held"]:
        return f"{head} {r['search_choice']} confirmed: {drop}, bound {_num(r['drop_high'])} <= {d.budget:g}; {speed}"
    return (f"{head} {r['search_choice']} NOT confirmed: {drop}, bound {_num(r['drop_high'])} > {d.budget:g} "
            f"(missed by {_num(r['missed_by'])}); answer: {r['answer']}")


def format_plan(protocol: Protocol, drafters=None, temperatures=None) -> str:
    search, confirm = protocol.bands()
    p = replace(protocol, drafters=tuple(d for d in protocol.drafters if not drafters or d in drafters),
                temperatures=tuple(t for t in protocol.temperatures if not temperatures or t in temperatures))
    search_h, confirm_h = price(p, confirm)
    return (f"protocol {p.name}: {p.about}\n"
            f"  verifier {p.verifier or 'built-in'}; drafters {', '.join(p.drafters)}; temperatures "
            f"{', '.join(f'{t:g}' for t in p.temperatures)}; budgets {', '.join(f'{b:g}' for b in p.budgets)} "
            f"(one test each, upper 95 % bound of the held-out drop vs strict at the same N)\n"
            f"  search band: {search} problems ({p.search}); confirmation band: {confirm} problems ({p.confirm}), "
            f"never read by the search\n"
            f"  price: at most {search_h:.1f} h of search ({len(p.arms()) * len(p.budgets)} runs x "
            f"{p.search_minutes:g} min) + about {confirm_h:.1f} h of confirmation "
            f"({p.sample_s:g} s a batched answer); stored cells are reused, so a resumed or repeated run costs less")

"""`relaxspec bench --preset qwen-coder`: the Qwen2.5-Coder pair on humaneval-instruct, in stages, within 3 hours.

A bench run has one sampling setting, so this preset is four bench runs (stages) into one store, one after the
other; each stage is an ordinary grid (resumable cell by cell: a re-run skips every stored cell) and the report at
the end covers all of them (`relaxspec report DIR --all`).

  greedy   T = 0: AR, strict, and only the rules that still relax at T = 0 (on one-hot p and q the others are
           exactly strict and would repeat strict's tokens): topk-delta 0.6 (TensorRT-LLM's setting), topk-ratio
           0.3, spec-casc-tok 0.35 (the drafter's argmax inside the verifier's top set), ensemble 0.95 and
           spec-casc-opt 0 (they mix or compare the two models' distributions), FLy (entropy threshold 0.3, window
           2) and the regret budget (2 logits a request), at N = 3.
  sampled  T = 0.7, top-p 0.95: AR, strict, and every rule the pair can run at the strengths the built-in
           default run found within its 0.03 budget plus the next one beyond (README, "Default run"): cactus 0.1
           / 0.25, mentored 0.3 / 0.7, spec-casc-tok 0 / 0.35 / 0.8, typical (its one point), topk-delta 0.3 /
           0.6, topk-ratio 0.3 / 0.1, fuzzy 0.05 / 0.2, r-fuzzy 0.05, threshold single 0.01, ensemble 0.95,
           spec-casc-opt -0.1 / 0, spec-cont-dec 0.5 / 1, FLy 0.3 / 0.6 (window 2), regret budget 2 / 8, at N = 3.
  lengths  T = 0.7: strict at N = 5 and auto (AR shared with the sampled stage): the speed of longer drafts and
           strict's check against AR at each N. No relaxed rule here: at T = 0.7 55 paired samples decide none
           (the sampled stage's 21 rules all stayed open on the pair); the next stage runs one greedy instead.
  greedy-lengths  T = 0: strict and spec-casc-tok 0.35 (the greedy stage's rule within budget) at N = 5 and auto
           (AR shared with the greedy stage), where a greedy run can decide them.

Cells run one at a time in this process (WORKERS) on every core (`--threads`), the batch-1 timing too.

Drafter: the pair's own 0.5B (`qwen2.5-coder-0.5b`), both models int4 (the fastest format on a CPU). Measured on
this CPU (benchmarks/real_pair_peer.py, greedy, batch 1): its step costs 0.36 of the verifier's and it is accepted
0.71 of the time at N = 3 (tau 3.10), so strict runs 1.34x AR, where prompt lookup (`--drafter ngram`) accepts 0.21
(tau 1.62) and its one-hot drafts leave out the rules that read the drafter's logits. PAD has no classifier for
this pair: left out. Every cell is one batch of all its problems (`batch_size` = problems x repeats), one look (the
budget goes into the first look); then SPEED_PROMPTS prompts of each speculative cell are timed alone (batch 1,
beside AR), which gives the measured speed-ups next to the modelled ones at the measured c_rel and c_block.

Problems: the estimate (`estimate`) prices each cell from the measured costs below; `fit_problems` gives every
cell the same first problems, as many as fit the 3-hour budget (164 = all of HumanEval when they do; more
samples per problem after that, for the sampled stages only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from relaxspec.bench.names import AR, AUTO

QWEN_CODER = "qwen-coder"
VERIFIER = "qwen2.5-coder-1.5b"
DRAFTER = "qwen2.5-coder-0.5b"
DTYPE = "int4"  # the fastest format on a CPU (docs/real-pair.md)
SPEED_PROMPTS = 4  # prompts timed at batch 1 per cell (4: the report also gives the first and last half)
TASK = "humaneval-instruct"
PROBLEMS = 164  # HumanEval
BUDGET_S = 3 * 3600.0
AUTO_AS = 5  # draft length that prices N = auto (the schedule starts at 5)
TAU_N = 3  # the draft length Costs.tau was measured at
WORKERS = 1  # cells in this process, on every core: a cell of 55 problems holds ~8-10 GB at its peak (the prompts'
# prefill, then KV caches to 512 new tokens), and two worker processes beside the driver's models ran a 24 GB machine
# out of memory

STAGES = {
    "greedy": {"temperature": 0.0, "top_p": None, "draft_lengths": [3],
               "methods": ["ar", "strict", "topk-delta:delta=0.6", "topk-ratio:ratio=0.3", "spec-casc-tok:alpha=0.35",
                           "ensemble:weight=0.95", "spec-casc-opt:alpha=0", "fly:fly_entropy_threshold=0.3",
                           "regret-budget:budget=2"]},
    "sampled": {"temperature": 0.7, "top_p": 0.95, "draft_lengths": [3],
                "methods": ["ar", "strict", "cactus:delta=0.1/0.25", "mentored:alpha=0.3/0.7",
                            "spec-casc-tok:alpha=0/0.35/0.8", "typical", "topk-delta:delta=0.3/0.6",
                            "topk-ratio:ratio=0.3/0.1", "fuzzy:threshold=0.05/0.2", "r-fuzzy:threshold=0.05",
                            "threshold:single=0.01", "ensemble:weight=0.95", "spec-casc-opt:alpha=-0.1/0",
                            "spec-cont-dec:beta=0.5/1", "fly:fly_entropy_threshold=0.3/0.6",
                            "regret-budget:budget=2/8"]},
    "lengths": {"temperature": 0.7, "top_p": 0.95, "draft_lengths": [5, AUTO], "methods": ["ar", "strict"]},
    "greedy-lengths": {"temperature": 0.0, "top_p": None, "draft_lengths": [5, AUTO],
                       "methods": ["ar", "strict", "spec-casc-tok:alpha=0.35"]},
}


# What the preset fixes: each stage's sampling, rules and N (STAGES) and its task; a flag or --sampling for one of them
# is refused (it would change every stage alike: a temperature would make the greedy stages sample)
FIXED = ("tasks", "methods", "draft_lengths", "temperature", "top_p", "top_k", "sampling")


def check_flags(explicit: dict) -> None:
    """ValueError naming the flags in `explicit` (BenchConfig fields from flags, and "sampling") the preset fixes."""
    fixed = [f"--{name.replace('_', '-')}" for name in FIXED if name in explicit]
    if fixed:
        raise ValueError(f"bench --preset {QWEN_CODER} fixes {', '.join(fixed)} itself (its stages run {TASK} at "
                         "T = 0 and T = 0.7 with top-p 0.95, each with its own rules and N: docs/bench.md); drop "
                         f"{'them' if len(fixed) > 1 else 'it'}, or run a plain `relaxspec bench` for other settings")


def priced(verifier: str, drafter: str, dtype: str | None) -> bool:
    """Whether Costs price this pair: the preset's verifier in int4 with its drafter or prompt lookup."""
    return verifier == VERIFIER and dtype == DTYPE and (drafter == DRAFTER or drafter_kind(drafter) == "ngram")


def drafter_kind(drafter: str) -> str:
    """"ngram" for prompt lookup (its spec may carry options after a colon), else "lm"."""
    return "ngram" if drafter.split(":")[0] == "ngram" else "lm"


@dataclass(frozen=True)
class Costs:
    """What a sample costs on this project's 2-core machine (AMD EPYC with AVX-512 VNNI, 2 threads, int4, quiet;
    2026-12-06, `python benchmarks/preset_costs.py --batch 16`, 128 new tokens; docs/real-answer.md). Batch 1 (the
    timing): our AR of the 1.5B ~41 ms a token, prefill included (41.7 / 40.5 at T = 0 / 0.7); a verifier block of
    N + 1 tokens 1 + 0.1 N steps; a drafter step 0.39 (the 0.5B) or ~0 (prompt lookup) of a verifier step; tau
    (tokens per round) 3.7 for the 0.5B at N = 3 on code (3.75 / 3.69 at T = 0 / 0.7), 1.6 for prompt lookup. In one
    batch of the problems (the cells' samples): AR ~18.4 ms an answer's token and a speculative cell 1.3x that (16
    problems: AR 20.1 / 16.6 ms at T = 0 / 0.7, strict N = 3 with the 0.5B 24.7 / 23.3 ms: batching helps AR more
    than it helps the rounds). Answers: 210 tokens (the 1.5B's mean over HumanEval's 164 is 209; an answer runs on
    after its code block to the end of the turn)."""
    ar_s_per_token: float = 0.041
    batch_ar_s_per_token: float = 0.0184
    batch_spec_ratio: float = 1.3
    tokens_per_answer: int = 210
    c_block_per_draft: float = 0.1
    drafter_step: dict = field(default_factory=lambda: {"ngram": 0.003, "lm": 0.39})
    tau: dict = field(default_factory=lambda: {"ngram": 1.6, "lm": 3.7})
    overhead_s: float = 180.0  # per stage: loading the pair (GGUF int4 ~40 s a process), speed constants, report
    # a batched AR answer's seconds as measured on the task itself, where a batch's longest answer sets its length
    # (None: the per-token cost times tokens_per_answer)
    batch_answer_s: float | None = None

    @property
    def sample_s(self) -> float:
        """Seconds of one AR answer in a batch of the problems."""
        if self.batch_answer_s is not None:
            return self.batch_answer_s
        return self.batch_ar_s_per_token * self.tokens_per_answer

    def batch_ratio(self, method: str, drafter: str = DRAFTER) -> float:
        """A cell's cost per batched sample relative to AR's: the LM drafter's measured (batch_spec_ratio); prompt
        lookup's from a batch's compute, which bounds a batch on this CPU: a round computes N + 1 verifier tokens
        (N = 3, as tau) for tau tokens, its drafts free, so (3 + 1) / 1.6 = 2.5 (the same count gives the LM drafter
        (4 + 3 x 0.32) / 3.7 = 1.34 with its 0.5B / 1.5B parameters, against 1.23-1.40 measured)."""
        if method == AR:
            return 1.0
        if drafter_kind(drafter) == "ngram":
            return (TAU_N + 1) / self.tau["ngram"]
        return self.batch_spec_ratio

    def ratio(self, method: str, n, drafter: str) -> float:
        """A cell's cost per answer at batch 1 relative to AR's."""
        if method == AR:
            return 1.0
        kind = drafter_kind(drafter)
        n = AUTO_AS if n == AUTO else n
        return (1 + self.c_block_per_draft * n + n * self.drafter_step[kind]) / self.tau[kind]


def stage_cells(stage: dict, drafter: str = DRAFTER) -> list[tuple[str, dict, object]]:
    """(method, params, N) of a stage's cells (N 0 for AR), as the bench plans them."""
    from relaxspec.bench.methods import parse_method
    specs = [spec for item in stage["methods"] for spec in parse_method(item)]
    cells = [(AR, {}, 0)] if any(m == AR for m, _ in specs) else []
    return cells + [(m, p, n) for n in stage["draft_lengths"] for m, p in specs if m != AR]


def grid(drafter: str = DRAFTER) -> dict[str, list[tuple[str, dict, object]]]:
    """Every stage's cells; AR once a temperature (the lengths stages share the greedy and sampled stages' AR)."""
    out, seen = {}, set()
    for name, stage in STAGES.items():
        cells = []
        for m, p, n in stage_cells(stage, drafter):
            key = (m, stage["temperature"]) if m == AR else (m, tuple(sorted(p.items())), n, stage["temperature"])
            if key not in seen:
                seen.add(key)
                cells.append((m, p, n))
        out[name] = cells
    return out


def timing_s(cells, costs: Costs = Costs(), drafter: str = DRAFTER, prompts: int = SPEED_PROMPTS) -> float:
    """Seconds of a stage's batch-1 timing: `prompts` answers of every speculative cell alone, and one of AR
    before every BATCH1_CELLS_PER_AR of them (bench.cell.time_batch1_cells), at batch 1's cost (no batch gain)."""
    from relaxspec.bench.cell import BATCH1_CELLS_PER_AR
    spec = [costs.ratio(m, n, drafter) for m, _, n in cells if m != AR]
    return prompts * (sum(spec) + math.ceil(len(spec) / BATCH1_CELLS_PER_AR)) * costs.ar_s_per_token * \
        costs.tokens_per_answer


def estimate(problems: int, repeats: int = 1, costs: Costs = Costs(), drafter: str = DRAFTER) -> dict:
    """{stage: seconds} and "total" for `problems` problems x `repeats` samples (sampled stages; greedy: 1)."""
    out = {}
    for name, cells in grid(drafter).items():
        reps = 1 if STAGES[name]["temperature"] == 0 else repeats
        out[name] = costs.overhead_s + sum(costs.batch_ratio(m, drafter) for m, _, _ in cells) * problems * reps * \
            costs.sample_s + timing_s(cells, costs, drafter)
    out["total"] = sum(out.values())
    return out


def fit_problems(budget_s: float = BUDGET_S, costs: Costs = Costs(), drafter: str = DRAFTER,
                 pool: int = PROBLEMS) -> tuple[int, int]:
    """(problems, repeats): the most problems (<= pool) whose estimate fits the budget, then, with all of them,
    the most repeats of the sampled stages. ValueError when not even one problem fits."""
    if estimate(1, 1, costs, drafter)["total"] > budget_s:
        raise ValueError(f"bench --preset {QWEN_CODER}: not even one problem fits {budget_s / 3600:g} h")
    lo, hi = 1, pool
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if estimate(mid, 1, costs, drafter)["total"] <= budget_s else (lo, mid - 1)
    repeats = 1
    while lo == pool and estimate(pool, repeats + 1, costs, drafter)["total"] <= budget_s:
        repeats += 1
    return lo, repeats


def stage_configs(explicit: dict, costs: Costs = Costs()) -> list[tuple[str, "BenchConfig"]]:
    """(stage, BenchConfig) in run order: the preset's settings, `explicit` (BenchConfig fields from flags) over
    them. Problems and repeats from fit_problems unless `limit` / `repeats` are given."""
    import warnings

    from relaxspec.bench.config import BenchConfig
    check_flags(explicit)
    drafter = (explicit.get("drafters") or [DRAFTER])[0]
    problems, repeats = fit_problems(costs=costs, drafter=drafter)
    problems, repeats = explicit.get("limit", problems), explicit.get("repeats", repeats)
    if isinstance(problems, int) and problems > PROBLEMS:
        warnings.warn(f"bench --preset {QWEN_CODER}: --limit {problems} is more than {TASK}'s {PROBLEMS} problems; "
                      f"running all {PROBLEMS}", stacklevel=2)
        problems = PROBLEMS
    configs = []
    for name, stage in STAGES.items():
        reps = 1 if stage["temperature"] == 0 else repeats  # greedy repeats would repeat the same answers
        settings = {"verifiers": [VERIFIER], "drafters": [DRAFTER], "tasks": [TASK], "dtype": DTYPE, "looks": 1,
                    "speed_prompts": SPEED_PROMPTS, "workers": WORKERS,
                    "max_new_tokens": 512, "batch_size": problems * reps, "time_budget_s": BUDGET_S, "max_drop": 0.03,
                    **stage, **explicit, "limit": problems, "repeats": reps}
        configs.append((name, BenchConfig(**settings)))
    return configs


def describe(configs, costs: Costs = Costs()) -> str:
    """The stages, their cells and the estimate, as printed before the run."""
    first = configs[0][1]
    drafter, verifier = first.drafters[0], first.verifiers[0]
    problems = first.limit
    repeats = max(c.repeats for _, c in configs)
    est = estimate(problems, repeats, costs, drafter) if priced(verifier, drafter, first.dtype) else None
    cells = grid(drafter)
    lines = [f"bench --preset {QWEN_CODER}: {sum(len(c) for c in cells.values())} cells on the first {problems} of "
             f"{PROBLEMS} problems ({repeats} sample(s) a problem when sampling), verifier {verifier}, drafter "
             f"{drafter}:"]
    width = max(len(name) for name, _ in configs)
    for name, config in configs:
        lines.append(f"  {name:<{width}} T={config.temperature:g}: {len(cells[name])} cells"
                     + (f", about {est[name] / 60:.0f} min" if est else ""))
    if est is None:
        lines.append(f"  time not estimated: the preset's costs are {VERIFIER}'s in {DTYPE} with {DRAFTER} or "
                     "prompt lookup; a re-run resumes cell by cell")
        return "\n".join(lines)
    lines.append(f"  about {est['total'] / 3600:.1f} h in all at {VERIFIER}'s int4 costs on 2 CPU cores "
                 f"({costs.ar_s_per_token * 1000:.0f} ms/token AR, {costs.tokens_per_answer} tokens an answer, "
                 f"tau {costs.tau[drafter_kind(drafter)]:g} at N = 3, "
                 f"{SPEED_PROMPTS} prompts a cell timed at batch 1); "
                 "a re-run resumes cell by cell")
    return "\n".join(lines)


__all__ = ["QWEN_CODER", "STAGES", "FIXED", "Costs", "check_flags", "priced", "grid", "estimate", "fit_problems", "stage_configs", "describe"]

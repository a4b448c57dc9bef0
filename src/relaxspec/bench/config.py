"""Bench configuration: its settings, their defaults and presets, and the time estimate.

A bench is a grid verifier x drafter x task x (method, params) x draft length N x seed. Every cell draws
its samples (prompt i, repeat r) with the per-sequence seed derive_seed(seed, i, r), the same for every
method, so cells are coupled sample by sample (see docs/design.md, "Coupled randomness").

Sampling is adaptive with a fixed maximum number of looks: look 1 runs `repeats` repeats of `limit` prompts
in every cell; each later look doubles the samples of the relaxed cells (and of strict at their N) whose
interval of the utility difference vs strict is still undecided (see stats.decision), as long as the
time budget allows: new prompts while the task has them, then repeats (bench.sampling).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields

from relaxspec.acceptance.random import check_seed
from relaxspec.bench.methods import DEFAULT_PAD_THRESHOLDS, method_specs
from relaxspec.bench.names import AUTO
from relaxspec.bench.settings import (check_draft_confidence_setting, check_out_dir, check_phase_setting,
                                      check_sampling_setting, check_settings_types)

DEFAULT_OUT = "relaxspec-results"
DEFAULT_LIMIT = 160  # independent prompts: 160 x 1 costs what 80 x 2 did, and counts for more
DEFAULT_REPEATS = 1
DEFAULT_LOOKS = 3
DEFAULT_MAX_NEW_TOKENS = 160
DEFAULT_BATCH_SIZE = 200
DEFAULT_MAX_DROP = 0.03
DEFAULT_TIME_BUDGET_S = 840.0  # 15 minutes less a minute for the report and plots
# The lean loop (issue 27) timed 74 cells x 8 prompts in 31 s, x 16 in 56 s; at 16 a cell's x b1 / S_blk still spread
# by sd 0.026-0.039 across cells of one run (mostly noise): 32 cut it by ~30% for about a minute more.
DEFAULT_SPEED_PROMPTS = 32
DEFAULT_WORKERS = 2  # the bench uses both cores of a 2-core machine
SAMPLING_PRESETS = {"paper": {"temperature": 0.6, "top_k": 20, "top_p": 0.95}}  # the seed investigation's
# Run presets (`--preset NAME`, `preset = "NAME"` in a TOML config): whole bench settings by name, a sampling
# preset among them; a config's keys and explicit flags override them. "paper": the investigation's drafter
# kinds x the default grid (AR, strict, every training-free rule at its paper grid, PAD where its classifier
# fits) x N in {3, 5, 10} x two tasks: 15-26 min on 2 CPU cores as measured (see estimate_minutes). A third
# look would not help the findings: after the second, no cell is left OPEN (wide and straddling the budget).
RUN_PRESETS = {
    "paper": {"drafters": ["drafter-mtp", "drafter-strong", "drafter-weak"], "tasks": ["arithmetic", "sorting"],
              "draft_lengths": [3, 5, 10], "methods": None, "sampling": "paper", "limit": 80, "repeats": 1,
              "looks": 2, "speed_prompts": 0, "time_budget_s": 3600.0,
              "max_drop": 0.1},  # the budget the findings are checked at (study.findings.DEFAULT_MAX_DROP)
}
# Measured on this project's 2-core machine with the built-in family (the default bench: 6.1 min for 63 cells on
# 2026-12-03, 5.5 min for 75 cells on 2026-12-06, the lean loop, AVX-512 VNNI): one sample of a batched cell
# (prompts x repeats, <= 160 new tokens) and one prompt timed at batch 1 (the method's run and AR's).
SECONDS_PER_SAMPLE = 0.04
SLOW_MACHINE = 2.0  # machines of one kind differ: the same 75-cell main job took 5.5 and 12.1 min on two 2-core EPYCs
SECONDS_PER_TIMED_PROMPT = 0.1  # (2026-12-05, the lean loop: 74 cells x 32 prompts in 116 s, AR shared by 6 cells)
# --compile: compiling a model's steps before its first cell. Measured on the 2-core machine (2026-12-06) with
# `relaxspec bench --limit 2 --max-new-tokens 4 --speed-prompts 0 --workers 1 --looks 1 --no-plots --methods
# ar,strict --draft-lengths 3 [--compile]`: 151 s compiled vs 13 s eager beside other work (42 s compiled on a
# quiet machine): about 40 s a model (the verifier and the drafter).
SECONDS_TO_COMPILE_A_MODEL = 40.0


@dataclass
class BenchConfig:
    verifiers: list[str] = field(default_factory=lambda: [_default_model("DEFAULT_VERIFIER")])
    drafters: list[str] = field(default_factory=lambda: [_default_model("DEFAULT_DRAFTER")])
    tasks: list[str] = field(default_factory=lambda: ["arithmetic"])
    methods: list[str] | None = None  # None: the default grid (see methods.default_methods)
    draft_lengths: list[int | str] = field(default_factory=lambda: [3, 5])  # "auto": the engine's +2/-1 schedule
    # a sequence stops drafting after a draft its drafter gave probability < this (None: off; engine.generate)
    draft_confidence: float | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    limit: int | None = DEFAULT_LIMIT  # prompts per task
    repeats: int = DEFAULT_REPEATS  # samples per prompt (more only when a later look runs out of prompts)
    looks: int = DEFAULT_LOOKS  # maximum number of looks (each later one doubles the samples of undecided cells)
    # prompts later looks skip after the first look's (bench.sampling): the band `relaxspec tune` holds out for its
    # confirmation by default (its --heldout-prompts) when its search cells are these cells
    heldout_band: int = 240
    max_drop: float = DEFAULT_MAX_DROP  # utility drop vs strict allowed ('best rule' and the decisions)
    time_budget_s: float = DEFAULT_TIME_BUDGET_S  # later looks start only while they fit in this wall time
    speed_prompts: int = DEFAULT_SPEED_PROMPTS  # prompts timed one at a time (batch 1) per speculative cell
    workers: int = DEFAULT_WORKERS  # processes running cells (the driver alone writes the store)
    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = 0.95
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    batch_size: int = DEFAULT_BATCH_SIZE  # sequences per generate() call
    device: str | None = None  # passed to load_model when set
    dtype: str | None = None  # passed to load_model when set
    compile: bool = False  # load_model(compile=True): compiled steps (models/compiled.py)
    chat_template: str = "auto"  # passed to generate
    system: str | None = None  # system prompt, passed to generate
    pad_thresholds: list[float] = field(default_factory=lambda: list(DEFAULT_PAD_THRESHOLDS))
    pad_classifier: str | None = None  # None: the built-in classifier, if one ships
    phase: str | None = None  # relax only inside a span (bench.settings): None, "task", "think" or "BEGIN..END"
    out: str = DEFAULT_OUT

    def validate(self) -> None:
        for name in ("verifiers", "drafters", "tasks", "draft_lengths", "seeds"):
            if not getattr(self, name):
                raise ValueError(f"bench: {name.replace('_', ' ')} must not be empty")
        check_settings_types(self, "bench", {**{name: str for name in ("verifiers", "drafters", "tasks", "methods")},
                                             "seeds": int, "draft_lengths": (int, str), "pad_thresholds": float},
                             {**{name: float for name in ("max_drop", "time_budget_s", "temperature", "top_p",
                                                          "draft_confidence")},
                              **{name: int for name in ("max_new_tokens", "top_k")},
                              **{name: str for name in ("device", "dtype", "phase", "pad_classifier", "system",
                                                        "chat_template")}})
        for name in ("verifiers", "drafters", "tasks", "draft_lengths", "seeds", "pad_thresholds"):
            setattr(self, name, list(dict.fromkeys(getattr(self, name))))  # a repeated value: one cell, not two
        for seed in self.seeds:
            check_seed(seed, "bench: a seed")
        for n in self.draft_lengths:
            if n != AUTO and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise ValueError(f"bench: draft lengths must be integers >= 1 or {AUTO!r}, got {n!r}")
        check_draft_confidence_setting(self.draft_confidence, "bench")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"bench: limit must be a positive integer, got {self.limit!r}")
        if isinstance(self.heldout_band, bool) or not isinstance(self.heldout_band, int) or self.heldout_band < 0:
            raise ValueError(f"bench: held-out band must be an integer >= 0, got {self.heldout_band!r}")
        for name in ("repeats", "looks", "batch_size", "workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"bench: {name.replace('_', ' ')} must be a positive integer, got {value!r}")
        if not isinstance(self.speed_prompts, int) or self.speed_prompts < 0:
            raise ValueError(f"bench: speed prompts must be an integer >= 0, got {self.speed_prompts!r}")
        check_sampling_setting(self, "bench")
        if self.max_new_tokens < 1:
            raise ValueError(f"bench: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.max_drop < 1:
            raise ValueError(f"bench: max drop must lie in [0, 1), got {self.max_drop}")
        if self.time_budget_s <= 0:
            raise ValueError(f"bench: time budget must be > 0 seconds, got {self.time_budget_s}")
        if self.repeats > 1 and self.temperature == 0:
            warnings.warn("bench: repeats > 1 at temperature 0 (greedy) repeat the same responses", stacklevel=2)
        self.method_specs()  # parsing raises on unknown rules / parameters
        check_out_dir(self.out, "--out")
        check_phase_setting(self.phase, self.tasks)

    def method_specs(self) -> list[tuple[str, dict]]:
        return method_specs(self.methods, self.pad_thresholds)

    @classmethod
    def from_dict(cls, data: dict) -> "BenchConfig":
        """Settings by name (TOML keys). 'preset = "paper"' applies a run preset and 'sampling = "paper"' a
        sampling preset (over the run preset's); explicit keys override both."""
        aliases = {"verifier": "verifiers", "drafter": "drafters", "task": "tasks", "draft_length": "draft_lengths",
                   "seed": "seeds", "method": "methods"}
        known = {f.name for f in fields(cls)}
        data = dict(data)
        kwargs = run_preset(data.pop("preset")) if "preset" in data else {}
        kwargs.update(sampling_preset(data.pop("sampling")) if "sampling" in data else {})
        for key, value in data.items():
            name = aliases.get(key, key).replace("-", "_")
            if name not in known:
                raise ValueError(f"bench config: unknown setting {key!r}; known: {', '.join(sorted(known))}, "
                                 "preset, sampling")
            if name in ("verifiers", "drafters", "tasks", "draft_lengths", "seeds", "methods", "pad_thresholds") \
                    and not isinstance(value, list):
                value = [value]
            kwargs[name] = value
        return cls(**kwargs)


def sampling_preset(name: str) -> dict:
    if name not in SAMPLING_PRESETS:
        raise ValueError(f"unknown sampling preset {name!r}; known: {', '.join(SAMPLING_PRESETS)}")
    return dict(SAMPLING_PRESETS[name])


def run_preset(name: str) -> dict:
    """A run preset's settings as BenchConfig fields (its sampling preset expanded)."""
    if name not in RUN_PRESETS:
        raise ValueError(f"unknown run preset {name!r}; known: {', '.join(RUN_PRESETS)}")
    settings = dict(RUN_PRESETS[name])
    return {**sampling_preset(settings.pop("sampling")), **settings} if "sampling" in settings else settings


def estimate_minutes(config: "BenchConfig", cells: int) -> float:
    """Minutes of the first look of `cells` cells on the project's 2-core machine with the built-in family
    (SECONDS_PER_SAMPLE over the workers; the batch-1 timing, one process before the look, AR shared by a few
    cells: about half of SECONDS_PER_TIMED_PROMPT per cell; with compile, SECONDS_TO_COMPILE_A_MODEL per model); later
    looks run while config.time_budget_s allows."""
    samples = (config.limit or DEFAULT_LIMIT) * config.repeats * SECONDS_PER_SAMPLE / min(config.workers, 2)
    compiling = SECONDS_TO_COMPILE_A_MODEL * (len(config.verifiers) + len(config.drafters)) if config.compile else 0
    return (cells * (samples + config.speed_prompts * SECONDS_PER_TIMED_PROMPT / 2) + compiling) / 60


def estimate_text(minutes: float) -> str:
    """'about 12 min', or seconds below a minute ('about 0 min' said nothing)."""
    return f"about {minutes:.0f} min" if minutes >= 1 else f"about {max(1, round(minutes * 60))} s"


def _default_model(attr: str) -> str:
    import relaxspec.models.family as family
    return getattr(family, attr)

"""The bench grid: verifier x drafter x task x (method, params) x draft length N x seed.

Every cell runs all its prompts x repeats through `relaxspec.engine.generate`
(batched), scores each response with the task's utility, and is written to the
store in one transaction as soon as it finishes. A re-run skips every cell whose
key (hash of its full configuration, code and model versions) is already
stored, so an interrupted bench loses at most the cell in flight.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
import uuid
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from relaxspec.bench.speedup import C_REL_GRID, mean_ci, modelled_speedup
from relaxspec.bench.store import Row, Store, cell_key

AR = "ar"
PAD = "pad"
DEFAULT_OUT = "relaxspec-results"
DEFAULT_PAD_THRESHOLDS = (0.3, 0.5, 0.7)
# Sized for the default grid (55 cells, 61 with a PAD classifier) to finish within ~15 minutes on
# 2 CPU cores with the built-in pair: measured ~15-19 CPU-s per 200-sample cell (one thread), so
# 80 prompts x 2 repeats = 160 samples, ~12-13 CPU-s per cell. On a machine shared with other jobs
# the wall time grows with the load.
DEFAULT_LIMIT = 80
DEFAULT_REPEATS = 2
DEFAULT_MAX_NEW_TOKENS = 160
DEFAULT_BATCH_SIZE = 200


@dataclass
class BenchConfig:
    verifiers: list[str] = field(default_factory=lambda: [_default_model("DEFAULT_VERIFIER")])
    drafters: list[str] = field(default_factory=lambda: [_default_model("DEFAULT_DRAFTER")])
    tasks: list[str] = field(default_factory=lambda: ["arithmetic"])
    methods: list[str] | None = None  # None: the default grid (see default_methods)
    draft_lengths: list[int] = field(default_factory=lambda: [3, 5])
    seeds: list[int] = field(default_factory=lambda: [0])
    limit: int | None = DEFAULT_LIMIT  # prompts per task
    repeats: int = DEFAULT_REPEATS  # samples per prompt
    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = 0.95
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    batch_size: int = DEFAULT_BATCH_SIZE  # sequences per generate() call
    pad_thresholds: list[float] = field(default_factory=lambda: list(DEFAULT_PAD_THRESHOLDS))
    pad_classifier: str | None = None  # None: the built-in classifier, if one ships
    out: str = DEFAULT_OUT

    def validate(self) -> None:
        for name in ("verifiers", "drafters", "tasks", "draft_lengths", "seeds"):
            if not getattr(self, name):
                raise ValueError(f"bench: {name.replace('_', ' ')} must not be empty")
        for n in self.draft_lengths:
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"bench: draft lengths must be integers >= 1, got {n!r}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"bench: limit must be a positive integer, got {self.limit!r}")
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"bench: repeats must be a positive integer, got {self.repeats!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"bench: batch size must be a positive integer, got {self.batch_size!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"bench: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.repeats > 1 and self.temperature == 0:
            warnings.warn("bench: repeats > 1 at temperature 0 (greedy) repeat the same responses", stacklevel=2)
        self.method_specs()  # parsing raises on unknown rules / parameters

    def method_specs(self) -> list[tuple[str, dict]]:
        if self.methods is None:
            return default_methods(self.pad_thresholds)
        out = []
        for item in self.methods:
            out.extend(parse_method(item, self.pad_thresholds))
        seen, unique = set(), []
        for name, params in out:
            sig = (name, json.dumps(params, sort_keys=True))
            if sig not in seen:
                seen.add(sig)
                unique.append((name, params))
        return unique

    @classmethod
    def from_dict(cls, data: dict) -> "BenchConfig":
        aliases = {"verifier": "verifiers", "drafter": "drafters", "task": "tasks", "draft_length": "draft_lengths",
                   "seed": "seeds", "method": "methods"}
        known = {f.name for f in fields(cls)}
        kwargs = {}
        for key, value in data.items():
            name = aliases.get(key, key).replace("-", "_")
            if name not in known:
                raise ValueError(f"bench config: unknown setting {key!r}; known: {', '.join(sorted(known))}")
            if name in ("verifiers", "drafters", "tasks", "draft_lengths", "seeds", "methods", "pad_thresholds") \
                    and not isinstance(value, list):
                value = [value]
            kwargs[name] = value
        return cls(**kwargs)


def _default_model(attr: str) -> str:
    import relaxspec.models.family as family
    return getattr(family, attr)


def load_toml(path: str | Path) -> dict:
    import tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"bench config {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"bench config {path}: invalid TOML ({e})") from None


# ---------------------------------------------------------------------------------------------
# Methods

def _rules():
    from relaxspec.acceptance import RULES
    return RULES


def _paper_points(name: str, pad_thresholds) -> list[dict]:
    """The rule's paper grid: the product of each parameter's grid (parameters without one stay default)."""
    rule = _rules()[name]
    if name == PAD:
        return [{"threshold": float(t)} for t in pad_thresholds]
    axes = [(p, list(spec.grid)) for p, spec in rule.params.items() if spec.grid]
    if not axes:
        return [{}]
    return [dict(zip([a for a, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]


def default_methods(pad_thresholds=DEFAULT_PAD_THRESHOLDS) -> list[tuple[str, dict]]:
    """AR; strict; every other rule at each point of its paper grid; pad at `pad_thresholds`."""
    out = [(AR, {}), ("strict", {})]
    for name in _rules():
        if name in ("strict", PAD):
            continue
        out.extend((name, p) for p in _paper_points(name, pad_thresholds))
    out.extend((PAD, p) for p in _paper_points(PAD, pad_thresholds))
    return out


def parse_method(item: str, pad_thresholds=DEFAULT_PAD_THRESHOLDS) -> list[tuple[str, dict]]:
    """'NAME' (its paper grid), or 'NAME:PARAM=V1/V2[;PARAM=V...]' (the product of the values given;
    parameters not given stay at the rule's default)."""
    item = item.strip()
    name, _, rest = item.partition(":")
    name = name.strip()
    rules = _rules()
    if name == AR:
        if rest:
            raise ValueError(f"method 'ar' takes no parameters, got {rest!r}")
        return [(AR, {})]
    if name not in rules:
        raise ValueError(f"unknown method {name!r}; known: ar, {', '.join(rules)}")
    if not rest:
        return [(name, p) for p in _paper_points(name, pad_thresholds)]
    rule = rules[name]
    axes = []
    for part in rest.split(";"):
        pname, eq, values = part.partition("=")
        pname = pname.strip()
        if not eq or not values.strip():
            raise ValueError(f"method {item!r}: expected PARAM=VALUE[/VALUE...], got {part!r}")
        if pname not in rule.params:
            raise ValueError(f"method {item!r}: rule {name!r} has no parameter {pname!r}; "
                             f"it has: {', '.join(rule.params) or 'none'}")
        try:
            vals = [float(v) for v in values.split("/")]
        except ValueError:
            raise ValueError(f"method {item!r}: values of {pname!r} must be numbers, got {values!r}") from None
        axes.append((pname, vals))
    return [(name, dict(zip([a for a, _ in axes], combo))) for combo in itertools.product(*[v for _, v in axes])]


def method_label(method: str, params: dict) -> str:
    if not params:
        return method
    return method + "(" + ",".join(f"{k}={_fmt(v)}" for k, v in params.items()) + ")"


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


# ---------------------------------------------------------------------------------------------
# Versions that enter a cell's key

_CODE_PACKAGES = ("acceptance", "engine", "models", "tasks", "pivot")


def code_version() -> str:
    """relaxspec version + hash of the sources that decide a cell's results (acceptance, engine, models,
    tasks, pivot). RELAXSPEC_CODE_VERSION, when set, replaces it: e.g. to keep reusing stored cells
    across an edit known not to change results."""
    import os

    import relaxspec
    if os.environ.get("RELAXSPEC_CODE_VERSION"):
        return os.environ["RELAXSPEC_CODE_VERSION"]
    root = Path(relaxspec.__file__).parent
    h = hashlib.sha256(relaxspec.__version__.encode())
    for pkg in _CODE_PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return f"{relaxspec.__version__}+{h.hexdigest()[:12]}"


def file_version(path: str | Path) -> str:
    """Hash of a model directory's weights (or of a file)."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file() and x.suffix in
                                           (".safetensors", ".bin", ".pt", ".json", ".gguf"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:12]


def model_version(name: str) -> str:
    from relaxspec.models import builtin_path, is_builtin
    path = builtin_path(name) if is_builtin(name) else Path(name)
    return file_version(path) if path.exists() else name  # hub ids: the name is all we know


# ---------------------------------------------------------------------------------------------
# Cells

@dataclass
class CellSpec:
    verifier: str
    drafter: str | None  # None for AR
    task: str
    method: str
    params: dict
    draft_length: int  # 0 for AR
    seed: int

    @property
    def label(self) -> str:
        n = f" N={self.draft_length}" if self.method != AR else ""
        return f"{self.task} {method_label(self.method, self.params)}{n} seed={self.seed}"


def plan(config: BenchConfig) -> list[CellSpec]:
    """All cells in run order: per (verifier, task, seed), AR first, then each drafter's cells."""
    specs = config.method_specs()
    cells = []
    for verifier, task, seed in itertools.product(config.verifiers, config.tasks, config.seeds):
        if any(m == AR for m, _ in specs):
            cells.append(CellSpec(verifier, None, task, AR, {}, 0, seed))
        for drafter in config.drafters:
            for n in config.draft_lengths:
                for m, params in specs:
                    if m != AR:
                        cells.append(CellSpec(verifier, drafter, task, m, dict(params), n, seed))
    return cells


def cell_config(spec: CellSpec, config: BenchConfig, versions: dict) -> dict:
    """Everything that decides a cell's results; its hash is the cell's key."""
    return {
        "verifier": spec.verifier, "verifier_version": versions[spec.verifier],
        "drafter": spec.drafter, "drafter_version": versions.get(spec.drafter) if spec.drafter else None,
        "task": spec.task, "method": spec.method, "params": spec.params,
        "draft_length": spec.draft_length, "seed": spec.seed,
        "limit": config.limit, "repeats": config.repeats,
        "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens, "batch_size": config.batch_size,
        "pad_classifier": versions.get("pad_classifier") if spec.method == PAD else None,
        "code_version": versions["code"],
    }


def _repeat_seed(seed: int, repeat: int, chunk: int) -> int:
    return (seed * 1_000_003 + repeat * 7919 + chunk) % (2**63)


def _merge_stats(parts: list[dict], draft_length: int) -> dict:
    """Engine stats of several generate() calls as one. Per-sequence verify rounds are recovered as
    drafts_proposed / N (the engine's verifier_calls counts batched forwards)."""
    total = {k: sum(p.get(k, 0) for p in parts) for k in
             ("drafts_proposed", "drafts_accepted", "verifier_calls", "drafter_calls", "generated_tokens",
              "time_draft_s", "time_verify_s", "time_total_s")}
    if draft_length == 0:
        total.update(acceptance_rate=0.0, acceptance_rate_per_position=[], mean_acceptance_length=1.0,
                     verify_rounds=total["generated_tokens"])
        return total
    rounds = [p.get("sequence_rounds", p["drafts_proposed"] / draft_length) for p in parts]
    n_rounds = sum(rounds)
    per_pos = [0.0] * draft_length
    for p, r in zip(parts, rounds):
        for i, rate in enumerate(p.get("acceptance_rate_per_position", [])[:draft_length]):
            per_pos[i] += rate * r
    total["verify_rounds"] = n_rounds
    total["acceptance_rate"] = total["drafts_accepted"] / total["drafts_proposed"] if total["drafts_proposed"] else 0.0
    total["acceptance_rate_per_position"] = [x / n_rounds if n_rounds else 0.0 for x in per_pos]
    total["mean_acceptance_length"] = (n_rounds + total["drafts_accepted"]) / n_rounds if n_rounds else 0.0
    return total


def run_cell(spec: CellSpec, task, verifier, drafter, config: BenchConfig, pivot_fn=None):
    """Generate every prompt x repeat of a cell; (rows, engine stats)."""
    from relaxspec.engine import generate

    jobs = [(i, r) for r in range(config.repeats) for i in range(len(task.examples))]
    rows, parts = [], []
    extra = {}
    if spec.method == PAD:
        extra["pivot_fn"] = pivot_fn
    for chunk_index, start in enumerate(range(0, len(jobs), config.batch_size)):
        chunk = jobs[start:start + config.batch_size]
        out = generate(verifier, drafter if spec.method != AR else None, [task.examples[i].prompt for i, _ in chunk],
                       method=spec.method, draft_length=spec.draft_length if spec.method != AR else 1,
                       max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                       top_k=config.top_k, top_p=config.top_p,
                       seed=_repeat_seed(spec.seed, chunk[0][1], chunk_index), **extra, **spec.params)
        parts.append(out.stats)
        for (i, r), res in zip(chunk, out.results):
            ex = task.examples[i]
            rows.append(Row(prompt_index=i, repeat=r, prompt=ex.prompt, reference=ex.reference, response=res.text,
                            utility=task.score(res.text, ex.reference), tokens=len(res.token_ids),
                            stats={"mean_acceptance_length": res.stats.get("mean_acceptance_length"),
                                   "acceptance_rate": res.stats.get("acceptance_rate"),
                                   "truncated": len(res.token_ids) >= config.max_new_tokens}))
    return rows, _merge_stats(parts, spec.draft_length)


def cell_metrics(spec: CellSpec, rows: list[Row], stats: dict, c_rel: float | None, latencies: dict,
                 run_id: str) -> dict:
    ci = mean_ci([r.utility for r in rows])
    lengths = [r.tokens for r in rows]
    tau = 1.0 if spec.method == AR else stats["mean_acceptance_length"]
    n = spec.draft_length
    metrics = {
        "n_prompts": len({r.prompt_index for r in rows}), "n_samples": len(rows),
        "utility": ci.mean, "utility_ci_low": ci.low, "utility_ci_high": ci.high,
        "mean_response_length": sum(lengths) / len(lengths) if lengths else float("nan"),
        "truncated_fraction": sum(r.stats.get("truncated", False) for r in rows) / len(rows) if rows else 0.0,
        "c_rel_measured": c_rel, **latencies,
        "modelled_speedup_measured_c_rel": modelled_speedup(tau, n, c_rel) if c_rel is not None else
        (1.0 if spec.method == AR else None),
        **{f"modelled_speedup_c{c:g}": modelled_speedup(tau, n, c) for c in C_REL_GRID},
        "run_id": run_id,
        **stats,
    }
    if spec.method == AR:
        metrics["mean_acceptance_length"] = 1.0
    return metrics


def _vs_ar(metrics: dict, rows: list[Row], ar_cell, ar_utilities: dict) -> dict:
    """Comparison with the AR cell, as known when the cell finishes (the report recomputes it)."""
    from relaxspec.bench.speedup import length_adjusted_speedup, paired_diff_ci
    diff = paired_diff_ci({(r.prompt_index, r.repeat): r.utility for r in rows}, ar_utilities)
    l_ar = ar_cell.metrics["mean_response_length"]
    out = {"ar_key": ar_cell.key, "utility_diff_vs_ar": diff.mean, "utility_diff_ci_low": diff.low,
           "utility_diff_ci_high": diff.high,
           "measured_speedup": ar_cell.metrics["time_total_s"] / metrics["time_total_s"]
           if metrics["time_total_s"] else None}
    for c in C_REL_GRID:
        out[f"length_adjusted_speedup_c{c:g}"] = length_adjusted_speedup(
            metrics[f"modelled_speedup_c{c:g}"], l_ar, metrics["mean_response_length"])
    if metrics.get("modelled_speedup_measured_c_rel") is not None:
        out["length_adjusted_speedup_measured_c_rel"] = length_adjusted_speedup(
            metrics["modelled_speedup_measured_c_rel"], l_ar, metrics["mean_response_length"])
    return out


@dataclass
class RunSummary:
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)  # labels of cells that could not run (e.g. no PAD classifier)
    wall_s: float = 0.0
    out: str = ""


def _pad_classifier(config: BenchConfig):
    """(pivot_fn, version, spec) or (None, reason, None)."""
    try:
        import relaxspec.pivot as pivot
        path = config.pad_classifier or pivot.builtin_classifier_path()
        clf = pivot.load_classifier(path)
        return clf.pivot_fn(), file_version(path), dict(getattr(clf, "spec", {}) or {})
    except (ImportError, AttributeError, FileNotFoundError, OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}", None


def _pad_applies(cell: CellSpec, spec: dict, explicit: bool) -> bool:
    """The built-in classifier was trained for one pair: use it only there. An explicit one is used as given."""
    if explicit:
        return True
    return all(spec.get(k) in (None, getattr(cell, k)) for k in ("verifier", "drafter"))


def run_grid(config: BenchConfig, on_cell=None, progress: bool = True, log=print) -> RunSummary:
    """Run every unfinished cell of the grid, writing each to the store as it finishes.

    `on_cell(index, spec, key, metrics)` is called after each newly stored cell (e.g. to stop early);
    KeyboardInterrupt anywhere loses only the cell in flight."""
    import torch
    from tqdm import tqdm

    from relaxspec.models import load_model, measure_step_latency
    from relaxspec.tasks import get_task

    config.validate()
    t_start = time.perf_counter()
    summary = RunSummary(out=str(config.out))
    cells = plan(config)
    versions = {"code": code_version()}
    models = {}
    for name in dict.fromkeys([*config.verifiers, *config.drafters]):
        models[name] = load_model(name)  # loaded next to hashing its weights, so the two agree
        versions[name] = model_version(name)
    pivot_fn = None
    if any(c.method == PAD for c in cells):
        pivot_fn, info, clf_spec = _pad_classifier(config)
        if pivot_fn is None:
            skipped = [c for c in cells if c.method == PAD]
            reason = f"no PAD classifier available ({info})"
        else:
            versions["pad_classifier"] = info
            skipped = [c for c in cells if c.method == PAD and not _pad_applies(c, clf_spec, bool(config.pad_classifier))]
            reason = (f"the built-in PAD classifier is for verifier {clf_spec.get('verifier')!r} + drafter "
                      f"{clf_spec.get('drafter')!r}; pass --pad-classifier for other pairs")
        if skipped:
            warnings.warn(f"bench: skipping {len(skipped)} pad cells: {reason}", stacklevel=2)
            summary.unavailable = [c.label for c in skipped]
            cells = [c for c in cells if all(c is not s for s in skipped)]
    store = Store(config.out)
    run_id = uuid.uuid4().hex[:12]
    tasks, c_rels = {}, {}

    def model(name):
        if name not in models:
            models[name] = load_model(name)
        return models[name]

    def c_rel_of(verifier, drafter):
        if (verifier, drafter) not in c_rels:
            lat_v = measure_step_latency(model(verifier))
            lat_d = measure_step_latency(model(drafter))
            c_rels[(verifier, drafter)] = (lat_d / lat_v, {"latency_verifier_s": lat_v, "latency_drafter_s": lat_d})
        return c_rels[(verifier, drafter)]

    keyed = [(c, cell_key(cell_config(c, config, versions))) for c in cells]
    # the AR cell each speculative cell is compared with (also when it was stored by an earlier run)
    ar_keys = {(c.verifier, c.task, c.seed): k for c, k in keyed if c.method == AR}
    todo = [(c, k) for c, k in keyed if not store.has(k)]
    summary.skipped = [k for c, k in keyed if store.has(k)]
    if summary.skipped:
        log(f"bench: {len(summary.skipped)} of {len(keyed)} cells already in {store.path}; running the other "
            f"{len(todo)}")
    bar = tqdm(todo, desc="bench", unit="cell", disable=not progress, dynamic_ncols=True)
    try:
        for index, (spec, key) in enumerate(bar):
            bar.set_postfix_str(spec.label, refresh=True)
            if spec.task not in tasks:
                tasks[spec.task] = get_task(spec.task, limit=config.limit)
            verifier = model(spec.verifier)
            drafter = model(spec.drafter) if spec.drafter else None
            c_rel, lat = c_rel_of(spec.verifier, spec.drafter) if spec.drafter else (None, {})
            cpu0, wall0 = time.process_time(), time.perf_counter()
            with torch.inference_mode():
                rows, stats = run_cell(spec, tasks[spec.task], verifier, drafter, config,
                                       pivot_fn=pivot_fn if spec.method == PAD else None)
            metrics = cell_metrics(spec, rows, stats, c_rel, lat, run_id)
            # CPU seconds of this process (incl. scoring): what the cell costs on an otherwise idle core
            metrics.update(cell_cpu_s=time.process_time() - cpu0, cell_wall_s=time.perf_counter() - wall0)
            ar_key = ar_keys.get((spec.verifier, spec.task, spec.seed))
            if spec.method == AR:
                ar_keys[(spec.verifier, spec.task, spec.seed)] = key
            elif ar_key is not None and store.has(ar_key):
                metrics["vs_ar"] = _vs_ar(metrics, rows, store.get(ar_key), store.utilities(ar_key))
            store.put(key, cell_config(spec, config, versions), metrics, rows)
            summary.ran.append(key)
            if on_cell is not None:
                on_cell(index, spec, key, metrics)
    finally:
        bar.close()
        summary.wall_s = time.perf_counter() - t_start
        store.close()
    return summary


def config_as_dict(config: BenchConfig) -> dict:
    return asdict(config)


__all__ = ["BenchConfig", "CellSpec", "RunSummary", "run_grid", "plan", "default_methods", "parse_method",
           "method_label", "load_toml", "code_version", "cell_config", "DEFAULT_OUT"]

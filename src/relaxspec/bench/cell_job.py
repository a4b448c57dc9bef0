"""One look of one bench cell as an executor job (see bench.executors): what a worker computes.

A worker runs the cell's samples for repeats [start, stop), its batch-1 timing (first look of a speculative
cell) and the models' step latencies, and returns them; the driver turns them into the cell's metrics and
stores them (runner._Grid.record). Each sample is a function of its own per-sequence seed, so the rows do not
depend on which worker ran the cell; timings do.

The worker's cache keeps the loaded models of the pair it last ran (and any the driver seeded it with), the
tasks, the PAD classifier and the measured latencies. A worker checks that its code and the weights it loads
hash to the versions in the cell's key: a cluster node with other code or other weights fails the cell
instead of storing results under the wrong key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from relaxspec.bench.config import BenchConfig, needs_classifier
from relaxspec.bench.names import AR
from relaxspec.bench.runner import CellSpec, _pad_classifier, model_options, run_samples, time_batch1
from relaxspec.bench.store import Row


@dataclass
class CellResult:
    rows: list[Row]
    parts: list[dict]  # engine stats of each generate call, as dicts
    batch1: dict  # batch-1 timing ({} unless the job asked for it)
    speed: dict  # c_rel / c_block measured on the worker and the latencies they come from
    sample_wall_s: float


@dataclass
class CellJob:
    spec: CellSpec
    key: str
    config: BenchConfig
    versions: dict  # the versions in the cell's key (code, models, PAD classifier)
    start: int  # first repeat to run
    stop: int  # repeats done after this job
    batch1: bool  # time batch 1 (the cell's first look)

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def affinity(self) -> tuple:
        return self.spec.verifier, self.spec.drafter

    def run(self, cache: dict) -> CellResult:
        import torch
        _check(cache, "code", self.versions["code"], "relaxspec code")
        spec = self.spec
        verifier = _model(cache, spec.verifier, self)
        drafter = _model(cache, spec.drafter, self) if spec.drafter else None
        task = _task(cache, spec.task, self.config)
        pivot_fn = _pivot_fn(cache, self) if needs_classifier(spec.method) else None
        t0 = time.perf_counter()
        with torch.inference_mode():
            rows, parts = run_samples(spec, task, range(self.start, self.stop), verifier, drafter, self.config,
                                      pivot_fn)
            sample_wall = time.perf_counter() - t0
            batch1 = time_batch1(spec, task, verifier, drafter, self.config, pivot_fn) if self.batch1 else {}
            speed = _speed(cache, spec)
        return CellResult(rows, parts, batch1, speed, sample_wall)


def _check(cache: dict, what: str, expected: str, name: str) -> None:
    """Compare a version found on this worker with the one in the cell's key (once per worker and name)."""
    checked = cache.setdefault("checked", {})
    if what not in checked:
        from relaxspec.bench.versions import code_version, model_version
        checked[what] = code_version() if what == "code" else model_version(what)
    if checked[what] != expected:
        raise ValueError(f"{name} on this worker has version {checked[what]}, the driver's has {expected} "
                         "(install the same relaxspec and model files on every node)")


def _model(cache: dict, name: str, job: CellJob):
    """The loaded model `name`; loading it first drops the models the job does not use (unless seeded)."""
    from relaxspec.models import load_model
    models, pinned = cache.setdefault("models", {}), cache.setdefault("pinned", set())
    if name not in models:
        for other in [m for m in models if m not in pinned and m not in job.affinity]:
            del models[other]
        _check(cache, name, job.versions[name], f"model {name}")
        models[name] = load_model(name, **model_options(job.config))
    return models[name]


def _task(cache: dict, name: str, config: BenchConfig):
    from relaxspec.tasks import get_task
    tasks = cache.setdefault("tasks", {})
    if (name, config.limit) not in tasks:
        tasks[(name, config.limit)] = get_task(name, limit=config.limit)
    return tasks[(name, config.limit)]


def _pivot_fn(cache: dict, job: CellJob):
    if "pivot_fn" not in cache:
        pivot_fn, info, _ = _pad_classifier(job.config)
        if pivot_fn is None:
            raise ValueError(f"no PAD classifier on this worker ({info})")
        cache["pivot_fn"], cache["pivot_version"] = pivot_fn, info
    if cache.get("pivot_version", job.versions.get("pad_classifier")) != job.versions.get("pad_classifier"):
        raise ValueError(f"PAD classifier on this worker has version {cache['pivot_version']}, the driver's has "
                         f"{job.versions.get('pad_classifier')}")
    return cache["pivot_fn"]


def _latency(cache: dict, name: str, block: int) -> float:
    from relaxspec.models import measure_step_latency
    latency = cache.setdefault("latency", {})
    if (name, block) not in latency:
        latency[(name, block)] = measure_step_latency(cache["models"][name], block=block)
    return latency[(name, block)]


def _speed(cache: dict, spec: CellSpec) -> dict:
    """c_rel (drafter / verifier one-token step) and c_block (verifier (N+1)-token block / one-token step)."""
    if spec.method == AR:
        return {}
    lat_v, lat_d = _latency(cache, spec.verifier, 1), _latency(cache, spec.drafter, 1)
    return {"c_rel_measured": lat_d / lat_v,
            "c_block_measured": _latency(cache, spec.verifier, spec.draft_length + 1) / lat_v,
            "latency_verifier_s": lat_v, "latency_drafter_s": lat_d}


def seeded_cache(models: dict, pivot_fn=None, pad_version: str | None = None) -> dict:
    """A local worker cache holding the models the driver already loaded (kept for the whole run)."""
    cache = {"models": dict(models), "pinned": set(models)}
    if pivot_fn is not None:
        cache["pivot_fn"], cache["pivot_version"] = pivot_fn, pad_version
    return cache


__all__ = ["CellJob", "CellResult", "seeded_cache"]

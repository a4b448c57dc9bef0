"""Bench cells as executor jobs (see bench.executors), for `relaxspec bench --executor ray`.

A CellJob is one look of one cell, the runner's job tuple (spec, key, repeats done, target repeats) plus what a
fresh worker needs: the bench config and the versions in the cells' keys. On its first job for a config a Ray
worker sets itself up exactly like a local pool worker (runner._init_worker: models, tasks, PAD classifier,
kept in the worker process across its cells) after checking that its code and model files hash to the
driver's versions (a node with other code or weights fails its cells instead of storing them under the wrong
key); then it runs the cell like a pool worker (runner._run_in_worker). Each sample is a function of its own
per-sequence seed, so the rows do not depend on the worker; the driver alone stores them.
"""

from __future__ import annotations

from dataclasses import dataclass

from relaxspec.bench.config import BenchConfig
from relaxspec.bench.runner import CellSpec


class SpecJob:
    """What the executors read of a job about one cell (`self.spec`): its label, and its model pair, so a
    worker that has the pair loaded gets it."""

    spec: CellSpec

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def affinity(self) -> tuple:
        return self.spec.verifier, self.spec.drafter


@dataclass
class CellJob(SpecJob):
    spec: CellSpec
    key: str
    done: int  # repeats already stored
    target: int  # repeats after this look
    config: BenchConfig
    versions: dict  # code and model versions in the cells' keys

    def run(self, cache: dict) -> dict:
        import torch

        from relaxspec.bench import runner
        if cache.get("config") != repr(self.config):
            check_versions(self.versions, self.config)
            runner._init_worker(self.config, torch.get_num_threads())
            cache["config"] = repr(self.config)
        return runner._run_in_worker((self.spec, self.key, self.done, self.target))[2]


def check_versions(versions: dict, config: BenchConfig) -> None:
    from relaxspec.bench.versions import code_version, model_version
    found = {"code": code_version(), **{m: model_version(m) for m in dict.fromkeys([*config.verifiers,
                                                                                   *config.drafters])}}
    for name, version in found.items():
        if version != versions.get(name):
            what = "relaxspec code" if name == "code" else f"model {name}"
            raise ValueError(f"{what} on this worker has version {version}, the driver's has {versions.get(name)} "
                             "(install the same relaxspec and model files on every node)")


def ray_results(pool, jobs: list[tuple], config: BenchConfig, versions: dict, failed: list[str]):
    """(spec, key, result) of each job as it finishes on `pool` (a bench.executors executor); a job that failed is
    appended to `failed` as 'label: error' instead."""
    for done in pool.run(CellJob(spec, key, d, t, config, versions) for spec, key, d, t in jobs):
        if done.error is not None:
            failed.append(f"{done.job.label}: {done.error}")
        else:
            yield done.job.spec, done.job.key, done.result


__all__ = ["CellJob", "SpecJob", "check_versions", "ray_results"]

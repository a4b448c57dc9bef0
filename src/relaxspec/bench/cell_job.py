"""Bench cells as executor jobs (see bench.executors), for `relaxspec bench --executor ray`.

A CellJob is one look of one cell, the runner's job tuple (spec, key, repeats done, target repeats) plus what a
fresh worker needs: the bench config and the versions in the cells' keys. A Ray worker runs it exactly like a
local pool worker, through bench.cell.run_cell: on its first job for a config it loads its models, tasks and
PAD classifier (kept in the worker process across its cells) after checking that its code and model files
hash to the driver's versions (a node with other code or weights fails its cells instead of storing them
under the wrong key). Each sample is a function of its own
per-sequence seed, so the rows do not depend on the worker; the driver alone stores them.
"""

from __future__ import annotations

from dataclasses import dataclass

from relaxspec.bench.cell import CellSpec, check_versions, run_cell
from relaxspec.bench.config import BenchConfig


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
        return run_cell((self.spec, self.key, self.done, self.target), self.config, cache, self.versions)[2]


def ray_results(pool, jobs: list[tuple], config: BenchConfig, versions: dict, failed: list[str]):
    """(spec, key, result) of each job as it finishes on `pool` (a bench.executors executor); a job that failed is
    appended to `failed` as 'label: error' instead."""
    for done in pool.run(CellJob(spec, key, d, t, config, versions) for spec, key, d, t in jobs):
        if done.error is not None:
            failed.append(f"{done.job.label}: {done.error}")
        else:
            yield done.job.spec, done.job.key, done.result


__all__ = ["CellJob", "SpecJob", "check_versions", "ray_results"]

"""Bench cells as executor jobs (see bench.executors): the grid's looks, and tune's cells.

A CellJob is one `CellRequest` plus what a fresh worker needs: the bench config, the versions in the cells' keys
(None: not checked, a worker on this machine) and whether to load the PAD classifier. Every worker (this process,
a local pool worker or a Ray worker) runs it through bench.cell.run_cell: on its first job for a config it loads
its models, tasks and PAD classifier (kept in the worker process across its cells), after checking that its code
and model files hash to the driver's versions (a node with other code or weights fails its cells instead of
storing them under the wrong key). Each sample is a function of its own per-sequence seed, so the rows do not
depend on the worker; the driver alone stores them.
"""

from __future__ import annotations

from dataclasses import dataclass

from relaxspec.bench.cell import CellRequest, CellResult, run_cell
from relaxspec.bench.config import BenchConfig


@dataclass
class CellJob:
    request: CellRequest
    config: BenchConfig
    versions: dict | None = None  # code and model versions in the cells' keys, checked by a fresh worker
    with_pad: bool | None = None  # load the PAD classifier (None: when a method of the config needs it)

    @property
    def label(self) -> str:
        return self.request.spec.label

    @property
    def affinity(self) -> tuple:
        """The cell's model pair: a worker that has it loaded gets the job."""
        return self.request.spec.verifier, self.request.spec.drafter

    def run(self, cache: dict) -> CellResult:
        return run_cell(self.request, self.config, cache, self.versions, self.with_pad)


__all__ = ["CellJob"]

"""Where grid jobs run: in this process (`local`), in a pool of this machine's processes, or on a Ray cluster
(`ray`), behind one interface (`Executor`).

A job is any picklable object with
  * `label` (str, shown in the progress bar and in errors),
  * `affinity` (hashable: jobs with equal affinity prefer the worker that last ran one, e.g. the same model
    pair, so that the worker's loaded models are reused),
  * `run(cache: dict)` -> result: called on a worker with that worker's cache, kept across its jobs.

`executor.run(jobs)` pulls jobs from any iterable and yields one `Finished` per job as it completes
(completion order). A job that raises is reported with its error (`Finished.error`) and never retried; the
other jobs go on. Only the caller (the driver) sees results, so only the driver writes the store.
`executor.capacity()` is how many jobs run at once; `executor.status` maps each worker to the label of the job it
is running ("" when idle); `executor.on_change`, when set, is called after each change of it (e.g. to refresh a
progress bar).

The local executor runs jobs one after the other in this process, lazily (a job is pulled when the last one is
done). The pool executor runs them in `workers` spawned processes with this process's torch threads, each process's
cache kept across its jobs; a worker that dies (killed, out of memory) fails its job and every job not finished,
with one line that says so, and the next run starts a new pool. The Ray executor runs one actor per worker, whose
cache lives as long as the actor (loaded models stay in memory across its cells: loading a pair costs more than a
small cell); a job goes preferably to the worker that last ran one of the same affinity. An actor that dies (node
lost, process killed, out of memory) is restarted and its in-flight jobs re-sent, at most `max_retries` times; after
that the jobs are reported as failed. Without `ray_address` a local Ray instance with this machine's CPUs is started
(and shut down by `close`), without dashboard, its logs kept off the terminal.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

EXECUTORS = ("local", "ray")


@dataclass
class ExecutorOptions:
    kind: str = "local"  # local | ray
    ray_address: str | None = None  # None: start a local Ray instance; "auto" or HOST:PORT: join a cluster
    cells_per_worker: int = 1  # jobs held by each Ray worker at a time (running + queued)
    gpus_per_cell: float = 0.0  # GPUs each Ray worker reserves
    cpus_per_cell: float = 1.0  # CPUs each Ray worker reserves (its torch threads)
    max_retries: int = 3  # restarts of a dead worker (its jobs are re-sent), then its jobs fail

    def validate(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {self.kind!r}")
        if self.kind == "local" and (self.ray_address is not None or self.cells_per_worker != 1
                                     or self.gpus_per_cell):
            raise ValueError("--ray-address, --cells-per-worker and --gpus-per-cell need --executor ray")
        if not isinstance(self.cells_per_worker, int) or self.cells_per_worker < 1:
            raise ValueError(f"cells per worker must be an integer >= 1, got {self.cells_per_worker!r}")
        if self.gpus_per_cell < 0:
            raise ValueError(f"GPUs per cell must be >= 0, got {self.gpus_per_cell}")
        if self.cpus_per_cell <= 0:
            raise ValueError(f"CPUs per cell must be > 0, got {self.cpus_per_cell}")
        if self.max_retries < 0:
            raise ValueError(f"max retries must be >= 0, got {self.max_retries}")


@dataclass
class Finished:
    job: Any
    result: Any = None
    error: str | None = None  # "ExceptionType: message" when the job failed
    worker: str = ""
    seconds: float = 0.0  # wall time from submission to completion, as the driver saw it


def describe(exc: BaseException) -> str:
    """'ExceptionType: first line of its message'."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def make_executor(options: ExecutorOptions | None = None, cache: dict | None = None, workers: int = 1) -> Executor:
    """The executor for `options` (local by default): Ray's for kind "ray"; else a pool of `workers` processes when
    more than one, else this process. `cache` seeds the local executor's cache (e.g. models the driver already
    loaded); pool and Ray workers start with an empty one."""
    options = options or ExecutorOptions()
    options.validate()
    if options.kind == "ray":
        return RayExecutor(options)
    return PoolExecutor(workers) if workers > 1 else LocalExecutor(cache)


class Executor(ABC):
    """Where jobs run (see the module doc): `run`, `capacity`, `status` / `on_change`, `close` (also on leaving a
    `with` block)."""

    def __init__(self):
        self.status: dict[str, str] = {}
        self.on_change: Callable[[], None] | None = None

    @abstractmethod
    def run(self, jobs: Iterable) -> Iterator[Finished]:
        """One `Finished` per job, in completion order."""

    @abstractmethod
    def capacity(self) -> int:
        """How many jobs run at once."""

    def close(self) -> None:
        pass

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalExecutor(Executor):
    """Runs jobs one after the other in this process, with one cache."""

    def __init__(self, cache: dict | None = None):
        super().__init__()
        self.cache = {} if cache is None else cache
        self.status["local"] = ""

    def capacity(self) -> int:
        return 1

    def run(self, jobs: Iterable) -> Iterator[Finished]:
        for job in jobs:
            self.status["local"] = job.label
            self._notify()
            t0 = time.perf_counter()
            try:
                result, error = job.run(self.cache), None
            except Exception as e:  # the job's own failure: reported, the grid goes on
                result, error = None, describe(e)
            finally:
                self.status["local"] = ""
            yield Finished(job, result, error, "local", time.perf_counter() - t0)


_PROCESS_CACHE: dict = {}  # a pool worker's cache, across the jobs it runs


def _run_in_pool(indexed: tuple) -> tuple:
    """(index, result, error, seconds) of job (index, job), run in a pool worker with its process's cache."""
    index, job = indexed
    t0 = time.perf_counter()
    try:
        result, error = job.run(_PROCESS_CACHE), None
    except Exception as e:  # the job's own failure: reported, the grid goes on
        result, error = None, describe(e)
    return index, result, error, time.perf_counter() - t0


WORKER_DIED = ("BrokenProcessPool: its worker process died (killed by the system: out of memory? fewer --workers "
               "or a smaller --batch-size); not run")


class PoolExecutor(Executor):
    """Runs jobs in `workers` spawned processes of this machine, each with this process's torch threads and a cache
    kept across its jobs (`status` stays empty: a pool does not say which worker runs what). A worker that dies
    (killed, out of memory) breaks the pool: every job not finished is reported failed (WORKER_DIED), never waited
    for, and the next `run` starts a new pool."""

    def __init__(self, workers: int):
        super().__init__()
        self.workers = workers
        self.pool = self._start()

    def _start(self):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        import torch
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),))

    def capacity(self) -> int:
        return self.workers

    def run(self, jobs: Iterable) -> Iterator[Finished]:
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        jobs = list(jobs)
        futures = {self.pool.submit(_run_in_pool, (i, job)): i for i, job in enumerate(jobs)}
        broken = False
        for future in as_completed(futures):
            try:
                _, result, error, seconds = future.result()
            except BrokenProcessPool:
                broken, result, error, seconds = True, None, WORKER_DIED, 0.0
            yield Finished(jobs[futures[future]], result, error, "pool", seconds)  # seconds: in its worker
        if broken:
            self.close()
            self.pool = self._start()

    def close(self) -> None:
        """Ends the workers now, a job in flight included (Ctrl-C, SIGTERM, the end of the grid)."""
        processes = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # (Python < 3.14 has no public way to end a worker in flight)
            process.terminate()
        for process in processes:
            process.join(timeout=10)


def import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs Ray: pip install 'relaxspec[ray]'") from None
    return ray


class _Worker:
    """A Ray actor: runs jobs with a cache that lives as long as the actor."""

    def __init__(self, threads: int):
        os.environ["OMP_NUM_THREADS"] = str(max(1, threads))  # torch, imported later by a job, reads it
        self.cache = {}

    def run(self, job):
        return job.run(self.cache)


@dataclass
class _Slot:
    name: str
    actor: Any
    affinity: Any = None
    inflight: int = 0


class RayExecutor(Executor):
    """Runs jobs on Ray actors (see the module doc)."""

    def __init__(self, options: ExecutorOptions):
        super().__init__()
        self.options = options
        self.ray = import_ray()
        self.started = False
        self.slots: list[_Slot] = []
        self._created = 0
        if not self.ray.is_initialized():
            self._init()

    def _init(self) -> None:
        common = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=True)
        if os.environ.get("RELAXSPEC_CODE_VERSION"):  # the user's code-version override holds on the workers too
            common["runtime_env"] = {"env_vars": {"RELAXSPEC_CODE_VERSION": os.environ["RELAXSPEC_CODE_VERSION"]}}
        try:
            if self.options.ray_address:
                self.ray.init(address=self.options.ray_address, **common)
            else:
                self.ray.init(num_cpus=os.cpu_count(), **common)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = self.options.ray_address or "a local instance"
            raise ValueError(f"cannot start Ray ({where}): {str(e).splitlines()[0] if str(e) else type(e).__name__}")\
                from None
        self.started = True

    def capacity(self) -> int:
        """Workers the cluster's resources allow: CPUs / cpus_per_cell (and GPUs / gpus_per_cell if set)."""
        total = self.ray.cluster_resources()
        n = int(total.get("CPU", 0) // self.options.cpus_per_cell)
        if self.options.gpus_per_cell:
            n = min(n, int(total.get("GPU", 0) // self.options.gpus_per_cell))
        if n < 1:
            need = f"{self.options.cpus_per_cell:g} CPU" + (f" and {self.options.gpus_per_cell:g} GPU"
                                                            if self.options.gpus_per_cell else "")
            raise ValueError(f"the Ray cluster has no room for one worker ({need}); it has {total}")
        return n

    def _new_slot(self) -> _Slot:
        o = self.options
        actor_class = self.ray.remote(_Worker).options(
            num_cpus=o.cpus_per_cell, num_gpus=o.gpus_per_cell, max_restarts=o.max_retries,
            max_task_retries=o.max_retries, max_concurrency=1)
        name = f"w{self._created}"
        self._created += 1
        slot = _Slot(name, actor_class.remote(max(1, int(o.cpus_per_cell))))
        self.slots.append(slot)
        self.status[name] = ""
        return slot

    def _pick(self, buffer: deque) -> tuple[_Slot, Any] | None:
        """A worker with room and the buffered job it should take: same affinity as its last job first."""
        free = [s for s in self.slots if s.inflight < self.options.cells_per_worker]
        for slot in free:
            for job in buffer:
                if slot.affinity is not None and job.affinity == slot.affinity:
                    buffer.remove(job)
                    return slot, job
        # a job no busy worker of its affinity will take soon: an idle-most worker, or a new one
        if len(self.slots) < self._capacity:
            return self._new_slot(), buffer.popleft()
        if free:
            return min(free, key=lambda s: s.inflight), buffer.popleft()
        return None

    def run(self, jobs: Iterable) -> Iterator[Finished]:
        ray = self.ray
        from ray.exceptions import RayActorError, RayTaskError
        self._capacity = self.capacity()
        source = iter(jobs)
        buffer: deque = deque()
        inflight: dict = {}  # ObjectRef -> (slot, job, t0)
        running: dict[str, list] = {}  # worker -> labels in submission order
        exhausted = False
        while True:
            lookahead = self._capacity * self.options.cells_per_worker
            while not exhausted and len(buffer) < lookahead:
                job = next(source, None)
                if job is None:
                    exhausted = True
                else:
                    buffer.append(job)
            while buffer and (picked := self._pick(buffer)) is not None:
                slot, job = picked
                ref = slot.actor.run.remote(job)
                slot.inflight += 1
                slot.affinity = job.affinity
                inflight[ref] = (slot, job, time.perf_counter())
                running.setdefault(slot.name, []).append(job.label)
                self.status[slot.name] = running[slot.name][0]
                self._notify()
            if not inflight:
                if exhausted and not buffer:
                    return
                continue
            [ref], _ = ray.wait(list(inflight), num_returns=1)
            slot, job, t0 = inflight.pop(ref)
            slot.inflight -= 1
            running[slot.name].remove(job.label)
            self.status[slot.name] = running[slot.name][0] if running[slot.name] else ""
            try:
                result, error = ray.get(ref), None
            except RayTaskError as e:  # the job raised: its own error, not retried
                cause = getattr(e, "cause", None)
                result, error = None, describe(cause if isinstance(cause, BaseException) else e)
            except RayActorError as e:  # the worker died more than max_retries times
                result = None
                error = f"worker {slot.name} died (restarted {self.options.max_retries} times): " \
                        f"{type(e).__name__}"
                self._drop(slot)
            yield Finished(job, result, error, slot.name, time.perf_counter() - t0)

    def _drop(self, slot: _Slot) -> None:
        if slot in self.slots:
            self.slots.remove(slot)
            self.status.pop(slot.name, None)
            self.ray.kill(slot.actor, no_restart=True)

    def close(self) -> None:
        for slot in list(self.slots):
            self._drop(slot)
        if self.started:
            self.ray.shutdown()
            self.started = False


def status_line(status: dict[str, str], width: int = 40) -> str:
    """Per-worker status for a progress bar: 'w0: <label> | w1: idle'."""
    return " | ".join(f"{w}: {label[:width] if label else 'idle'}" for w, label in status.items())


__all__ = ["EXECUTORS", "ExecutorOptions", "Finished", "Executor", "LocalExecutor", "PoolExecutor", "RayExecutor",
           "make_executor", "status_line", "import_ray"]

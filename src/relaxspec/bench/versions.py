"""Versions that enter a cell's key: the code that decides results, model weights, the PAD classifier."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from relaxspec.version import __version__

# What a cell's samples do not depend on: presentation and analysis of stored cells (paths relative to the
# package, a folder ending in "/"). Everything else in the package is on the sample path or may be (engine,
# acceptance, models, drafters, tasks with their templates and scorers, pivot, the runners' seeding and batching,
# the CLI that builds the settings) and enters the code version. Built-in weights and classifiers are hashed
# per cell where they are used (model_version, the PAD classifier's version).
NOT_ON_SAMPLE_PATH = ("bench/report.py", "bench/plots.py", "study/", "tune/report.py",
                      "tune/compare.py", "models/builtin/", "pivot/builtin/")


def code_files(root: Path) -> list[Path]:
    """The package's files that enter the code version (see NOT_ON_SAMPLE_PATH), sorted."""
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or "__pycache__" in rel or path.suffix in (".pyc", ".pyo"):
            continue
        if any(rel == x or (x.endswith("/") and rel.startswith(x)) for x in NOT_ON_SAMPLE_PATH):
            continue
        out.append(path)
    return out


def code_version(root: str | Path | None = None) -> str:
    """relaxspec version + hash of every package file that may decide a cell's samples (code_files; `root`:
    the package directory, default the imported one). RELAXSPEC_CODE_VERSION, when set, replaces it: e.g. to
    keep reusing stored cells across an edit known not to change results."""
    if os.environ.get("RELAXSPEC_CODE_VERSION"):
        return os.environ["RELAXSPEC_CODE_VERSION"]
    root = Path(root) if root is not None else Path(__file__).parents[1]
    h = hashlib.sha256(__version__.encode())
    for path in code_files(root):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return f"{__version__}+{h.hexdigest()[:12]}"


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
    from relaxspec.models.family import head_directory
    path = builtin_path(name) if is_builtin(name) else head_directory(name)  # a built-in head, or a directory
    return file_version(path) if path.exists() else name  # hub ids: the name is all we know

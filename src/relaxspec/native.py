"""Small C kernels for the CPU, built on first use with the system's C compiler and loaded with ctypes.

The engine's round on a small model is made of many tiny tensor operations (a few microseconds each of
dispatch); a kernel here does the work of several of them in one call. Each kernel is plain C (no torch
headers: a build takes about a second), compiled with `-O3 -march=native` into a shared library cached under
`$RELAXSPEC_CACHE` (default `~/.cache/relaxspec/kernels`), keyed by the source, the flags, the compiler and the
CPU, and written atomically (parallel workers may build the same one; the last rename wins, both are equal).

Callers pass tensors' data pointers (`ptr`): CPU, contiguous, of the dtype the C function expects; the callers
check that and keep a torch path for everything else (another device or dtype). `load` returns None, with one
warning line per kernel, where no compiler is found or the build fails, and always when `RELAXSPEC_NATIVE=0`
(the torch path then serves: tests compare the two).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno")


def enabled() -> bool:
    """False when RELAXSPEC_NATIVE=0 (every kernel then stays unused)."""
    return os.environ.get("RELAXSPEC_NATIVE", "1") != "0"


def cache_dir() -> Path:
    return Path(os.environ.get("RELAXSPEC_CACHE") or Path.home() / ".cache" / "relaxspec") / "kernels"


def _cpu_identity() -> str:
    """The CPU's model name and flags (-march=native builds for this CPU only)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))][:2]
        return "".join(lines)
    except OSError:
        return platform.processor() or platform.machine()


@functools.cache
def load(name: str, source: str, signatures: tuple = ()) -> ctypes.CDLL | None:
    """The library built from C `source` (None, with one warning line, where it cannot be built or is
    disabled). `signatures`: (function, restype, (argtypes...)) to declare on the library."""
    if not enabled():
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return _unavailable(name, "no C compiler (cc) found")
    key = hashlib.sha256("\0".join((source, " ".join(FLAGS), compiler, _cpu_identity())).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                src = Path(tmp) / f"{name}.c"
                src.write_text(source)
                out = Path(tmp) / target.name
                done = subprocess.run([compiler, *FLAGS, "-o", str(out), str(src), "-lm"], capture_output=True,
                                      text=True, timeout=120)
                if done.returncode != 0:
                    first = (done.stderr.strip().splitlines() or ["failed"])[0]
                    return _unavailable(name, f"the build failed: {first[:200]}")
                os.replace(out, target)
        except (OSError, subprocess.SubprocessError) as error:
            return _unavailable(name, f"{type(error).__name__}: {error}")
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as error:
        return _unavailable(name, f"cannot load {target}: {error}")
    for function, restype, argtypes in signatures:
        f = getattr(lib, function)
        f.restype, f.argtypes = restype, list(argtypes)
    return lib


def _unavailable(name: str, why: str):
    warnings.warn(f"relaxspec native kernel {name!r} unavailable ({why}); the torch path serves", stacklevel=3)
    return None


def ptr(tensor) -> int:
    """A CPU tensor's data address, for a ctypes argument (c_void_p)."""
    return tensor.data_ptr()

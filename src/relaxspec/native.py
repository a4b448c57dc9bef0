"""Small C kernels for the CPU, built on first use with the system's C compiler and loaded with ctypes.

The engine's round on a small model is made of many tiny tensor operations (a few microseconds each of
dispatch); a kernel here does the work of several of them in one call. Each kernel is plain C (no torch
headers: a build takes about a second), compiled with `-O3 -march=native` into a shared library cached under
`$RELAXSPEC_CACHE` (default `~/.cache/relaxspec/kernels`), keyed by the source, the flags, the compiler and the
CPU, and written atomically (parallel workers may build the same one; the last rename wins, both are equal).

Callers pass tensors' data pointers (`tensor.data_ptr()`): CPU, contiguous, of the dtype the C function expects;
the callers check that and keep a torch path for everything else (another device or dtype). `load` returns None, with one
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
import sys
import tempfile
import warnings
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno")

# C shared by the kernels (a source puts it after its #includes; it needs <stdint.h> and <string.h>).
EXP_NONPOSITIVE = r"""
/* exp(x) in float32 for x <= 0 (-inf included), within ~1 ulp: Cephes' expf, written so that loops over it
   vectorise (2^n as two normal factors, so results down to the smallest subnormal, 0 below) */
static inline float exp_nonpositive(float x) {
    const float round = 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x < -104.0f ? -104.0f : x;
    float n = (xc * 1.44269504088896341f + round) - round;
    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return x < -103.972077f ? 0.0f : y * s1 * s2;
}
"""


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


@functools.cache
def tune_allocator() -> bool:
    """Keep freed memory in the process for reuse instead of handing it back to the kernel and faulting it in
    again: glibc malloc's mmap threshold set to 32 MB and its trim threshold to 256 MB (both are otherwise dynamic,
    and a batch's logits and activations, a few hundred KB each, went through mmap / munmap every round: ~25 page
    faults per generated token at batch 32, a fifth of a bench worker's CPU time in the kernel). Once per process;
    True when set (glibc on Linux, native kernels not turned off). The engine calls it for a CPU run."""
    if not enabled() or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # this process's C library
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(-3, 32 << 20)) and bool(mallopt(-1, 256 << 20))  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD

"""relaxspec.native: C kernels built with the system's compiler, cached per source, and a clean None (one warning)
where they cannot be built or are turned off."""

import ctypes
import os
import subprocess
import sys

import pytest
import torch

from relaxspec import native

SOURCE = "void twice(const float* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = 2 * x[i]; }\n"
SIG = (("twice", None, (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long)),)


def test_builds_caches_and_calls(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CACHE", str(tmp_path))
    lib = native.load("probe_ok", SOURCE, SIG)
    if lib is None:
        pytest.skip("no C compiler")
    x, y = torch.arange(5, dtype=torch.float32), torch.zeros(5)
    lib.twice(x.data_ptr(), y.data_ptr(), 5)
    assert torch.equal(y, 2 * x)
    built = list((tmp_path / "kernels").glob("probe_ok-*.so"))
    assert len(built) == 1  # cached under the source's key, no temporary left behind
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [built[0].name]


def test_a_failed_build_is_one_warning_and_none(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CACHE", str(tmp_path))
    with pytest.warns(UserWarning, match="probe_bad.*unavailable"):
        assert native.load("probe_bad", "this is not C;", ()) is None
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.warns(UserWarning, match="probe_cc.*unavailable"):
        assert native.load("probe_cc", SOURCE, SIG) is None


def test_turned_off_by_the_environment():
    code = "from relaxspec import native; print(native.load('probe_off', %r, ()))" % SOURCE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RELAXSPEC_NATIVE": "0"})
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr[-2000:]


def test_the_allocator_is_tuned_once_on_glibc_and_left_alone_when_turned_off():
    # Tuned, glibc serves a 1 MB block from its heap (below the program break; freed, it stays for reuse), where by
    # default a block that large comes from a fresh mmap (above the break; freed, it goes back to the kernel and
    # its pages fault in again next time: ~15 page faults per token at batch 32, benchmarks/engine_speed.py --batch).
    import platform
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    code = ("import ctypes; from relaxspec import native; c = ctypes.CDLL(None); "
            "c.malloc.restype = c.sbrk.restype = ctypes.c_void_p; c.malloc.argtypes = [ctypes.c_size_t]; "
            "c.sbrk.argtypes = [ctypes.c_ssize_t]; a = native.tune_allocator(); b = native.tune_allocator(); "
            "p = c.malloc(1 << 20); print(a, b, p < c.sbrk(0))")
    tuned = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if k != "RELAXSPEC_NATIVE"})
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RELAXSPEC_NATIVE": "0"})
    assert tuned.stdout.split() == ["True", "True", "True"], tuned.stderr[-2000:]
    assert off.stdout.split() == ["False", "False", "False"], off.stderr[-2000:]

"""relaxspec.native: C kernels from source files, built with the system's compiler, cached per source, their ctypes
signatures read from their header, and a clean None (one warning) where they cannot be built or are turned off."""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relaxspec import native

HEADER = ("/* the interface */\nvoid twice(const float* x, float* y, long n);\n"
          "int64_t count(const int64_t *a, double w);\n")
SOURCE = ('#include <stdint.h>\n#include "probe.h"\n'
          "void twice(const float* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = 2 * x[i]; }\n"
          "int64_t count(const int64_t *a, double w) { return a[0] + (int64_t)w; }\n")

needs_compiler = pytest.mark.skipif(native.compiler() is None, reason="no C compiler")


def probe(tmp_path: Path, name: str = "probe", source: str = SOURCE, header: str = HEADER) -> native.Kernel:
    folder = tmp_path / "src"
    folder.mkdir(exist_ok=True)
    (folder / "probe.h").write_text("#include <stdint.h>\n" + header)
    (folder / "probe.c").write_text(source)
    return native.Kernel(name, folder / "probe.c", folder / "probe.h")


def test_signatures_are_read_from_the_header(tmp_path):
    sig = native.signatures(probe(tmp_path).header)
    assert sig == {"twice": (None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]),
                   "count": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_double])}
    (tmp_path / "odd.h").write_text("void f(struct thing t);\n")
    with pytest.raises(ValueError, match="no ctypes mapping"):
        native.signatures(tmp_path / "odd.h")


@needs_compiler
def test_builds_caches_and_calls(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RELAXSPEC_NATIVE", raising=False)
    lib = native.load(probe(tmp_path, "probe_ok"))
    assert lib is not None  # a compiler is here: the build must work
    x, y = torch.arange(5, dtype=torch.float32), torch.zeros(5)
    lib.twice(x.data_ptr(), y.data_ptr(), 5)
    assert torch.equal(y, 2 * x)
    a = torch.tensor([40], dtype=torch.int64)
    assert lib.count(a.data_ptr(), 2.9) == 42  # restype and argtypes from the header
    built = list((tmp_path / "cache" / "kernels").glob("probe_ok-*.so"))
    assert len(built) == 1  # cached under the sources' key, no temporary left behind
    assert [p.name for p in (tmp_path / "cache" / "kernels").iterdir()] == [built[0].name]


@needs_compiler
def test_the_key_follows_the_sources(tmp_path):
    kernel = probe(tmp_path, "probe_key")
    first = native.build(kernel, directory=tmp_path / "out")
    assert native.build(kernel, directory=tmp_path / "out") == first  # found built
    (kernel.source.parent / "other.h").write_text("/* an include folder's file changed */\n")
    assert native.build(kernel, directory=tmp_path / "out") != first


@needs_compiler
def test_a_definition_against_its_header_does_not_build(tmp_path):
    kernel = probe(tmp_path, "probe_mismatch", header="void twice(const float* x, float* y, int n);\n")
    with pytest.raises(native.BuildError, match="the build failed") as error:
        native.build(kernel, directory=tmp_path / "out")
    assert "twice" in str(error.value)  # the compiler's messages in full


@needs_compiler
def test_a_failed_build_is_one_warning_and_none(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RELAXSPEC_NATIVE", raising=False)
    with pytest.warns(UserWarning, match="probe_bad.*unavailable.*the build failed"):
        assert native.load(probe(tmp_path, "probe_bad", source="this is not C;")) is None
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.warns(UserWarning, match="probe_cc.*unavailable"):
        assert native.load(probe(tmp_path, "probe_cc")) is None


def test_turned_off_by_the_environment(tmp_path):
    kernel = probe(tmp_path, "probe_off")
    code = ("from pathlib import Path; from relaxspec import native; "
            f"print(native.load(native.Kernel('probe_off', Path({str(kernel.source)!r}), "
            f"Path({str(kernel.header)!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RELAXSPEC_NATIVE": "0", "RELAXSPEC_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr[-2000:]
    assert not (tmp_path / "cache").exists()  # nothing built


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

"""relaxspec.native: C kernels from source files, built with the system's compiler, cached per source, their ctypes
signatures and argument structs read from their header (each struct's layout checked against the compiler's), and a
clean None (one warning) where they cannot be built or are turned off."""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relaxspec import native
from relaxspec.acceptance import fused

HEADER = ("/* the interface */\nvoid twice(const float* x, float* y, long n);\n"
          "int64_t count(const int64_t *a, double w);\n")
SOURCE = ('#include <stdint.h>\n#include "probe.h"\n'
          "void twice(const float* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = 2 * x[i]; }\n"
          "int64_t count(const int64_t *a, double w) { return a[0] + (int64_t)w; }\n")

STRUCT_HEADER = ("struct mix_args {\n    const float *x, *y;\n    long n;\n    double scale, shift; /* a comment */\n"
                 "    float* out;\n};\nvoid mix(const struct mix_args *a);\n")
STRUCT_SOURCE = ('#include "probe.h"\n'
                 "void mix(const struct mix_args *a) {\n"
                 "    for (long i = 0; i < a->n; ++i) a->out[i] = a->scale * a->x[i] + a->shift * a->y[i];\n}\n")

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


def test_structs_are_read_from_the_header_and_filled_by_name(tmp_path):
    header = probe(tmp_path, header=STRUCT_HEADER).header
    mix = native.structs(header)["mix_args"]
    assert mix._fields_ == [("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("n", ctypes.c_long),
                            ("scale", ctypes.c_double), ("shift", ctypes.c_double), ("out", ctypes.c_void_p)]
    assert native.signatures(header) == {"mix": (None, [ctypes.POINTER(mix)])}  # the struct's own pointer type
    args = mix(x=16, y=None, n=3, scale=2.0, shift=-1.0, out=32)
    assert (args.x, args.y, args.n, args.scale, args.shift, args.out) == (16, None, 3, 2.0, -1.0, 32)
    with pytest.raises(AttributeError, match="shfit"):  # a name that is not a field
        mix(x=16, y=None, n=3, scale=2.0, shfit=-1.0, out=32)
    (tmp_path / "odd.h").write_text("struct odd { float w[4]; };\nvoid f(const struct odd *a);\n")
    with pytest.raises(ValueError, match="struct odd: cannot read the field declaration 'float w\\[4\\]'"):
        native.structs(tmp_path / "odd.h")
    (tmp_path / "lost.h").write_text("void f(const struct lost *a);\n")
    with pytest.raises(ValueError, match="struct lost is not defined in the header"):
        native.signatures(tmp_path / "lost.h")


@needs_compiler
def test_a_struct_is_passed_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CACHE", str(tmp_path / "cache"))
    kernel = probe(tmp_path, "probe_struct", STRUCT_SOURCE, STRUCT_HEADER)
    lib = native.open_library(kernel)  # (its layout checked)
    x, y, out = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 20.0, 30.0]), torch.zeros(3)
    args = native.structs(kernel.header)["mix_args"]
    lib.mix(args(shift=-1.0, scale=2.0, out=out.data_ptr(), n=3, y=y.data_ptr(), x=x.data_ptr()))
    assert out.tolist() == [-8.0, -16.0, -24.0]  # 2 x - y: scale and shift, x and y, each where the C reads it
    with pytest.raises(ctypes.ArgumentError):  # a pointer, not the struct
        lib.mix(out.data_ptr())


@needs_compiler
def test_each_call_of_a_struct_kernel_names_every_field(monkeypatch):
    """The package's calls of the kernels that take a struct (the verify loop's three, FastLlama's attention and
    RoPE), each run once with structures that refuse a field not given (ctypes' own leave it 0)."""
    from relaxspec.acceptance.verify import VerifyStep
    from relaxspec.models import f32_kernels
    filled = {}

    def every_field(struct):
        def init(self, **fields):
            names = {name for name, _ in struct._fields_}
            assert fields.keys() == names, f"{struct.__name__}: {sorted(names ^ fields.keys())}"
            filled[struct.__name__] = filled.get(struct.__name__, 0) + 1
            struct.__init__(self, **fields)
        return type(struct.__name__, (struct,), {"__slots__": (), "__init__": init})

    for module, name in ((fused, "_FIRST_REJECTION"), (fused, "_FINISH"), (fused, "_VERIFY_DEFAULT"),
                         (f32_kernels, "_ATTENTION"), (f32_kernels, "_ROPE_WRITE")):
        monkeypatch.setattr(module, name, every_field(getattr(module, name)))
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 4, 30, generator=g)
    x = torch.randint(0, 30, (2, 3), generator=g)
    VerifyStep("strict", temperature=0.7)(z, z[:, :3] + 1, x, generator=g)  # verify_default, strict's test
    pivot = torch.rand(2, 3, generator=g)
    VerifyStep("pad", temperature=0.7, threshold=0.5)(z, z[:, :3] + 1, x, generator=g, pivot_prob=pivot)  # a rule's C
    VerifyStep("cactus", temperature=0.7)(z, z[:, :3] + 1, x, generator=g)  # its test in C, declined or not
    u = torch.rand(2, 3, generator=g)
    accepted, kept, n, _ = fused.first_rejection(u, torch.rand(2, 3, generator=g), None, None)
    p = torch.softmax(z[:, 0], -1)
    fused.finish(n, None, p, p, p, torch.rand(2, dtype=torch.float64, generator=g), x)
    lib = f32_kernels.library()
    H, KVH, D = 2, 1, 32
    qkv = torch.randn(1 * 2, (H + 2 * KVH) * D, generator=g)
    buffer = torch.zeros(1, 2 * KVH, 8, D)
    rotation = torch.polar(torch.ones(1, 2, 1, D // 2), torch.rand(1, 2, 1, D // 2, generator=g))
    kv = f32_kernels.rope_write(lib, qkv, rotation, buffer, 0, H, KVH, D)
    f32_kernels.attention(lib, qkv.view(1, 2, -1), kv, None, H, KVH, D, torch.empty(2 + 16))
    assert filled.keys() == {"rs_first_rejection_args", "rs_finish_args", "rs_verify_default_args",
                             "f32_attention_args", "f32_rope_write_args"}
    assert filled["rs_verify_default_args"] >= 3


@needs_compiler
def test_a_header_read_otherwise_than_compiled_is_one_error(tmp_path, monkeypatch):
    """The sampler's header copied, two fields of one type swapped in the copy: the library (compiled with the
    header its source includes) is refused, in one line, where the copy is what Python reads; the copy as it was
    loads."""
    monkeypatch.setenv("RELAXSPEC_CACHE", str(tmp_path / "cache"))
    text = fused.KERNEL.header.read_text()
    assert text.count("int64_t sp0, sp1;") == 1
    for name, copy in (("same", text), ("swapped", text.replace("int64_t sp0, sp1;", "int64_t sp1, sp0;"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "sampler.h").write_text(copy)
    same = native.Kernel("sampler_same", fused.KERNEL.source, tmp_path / "same" / "sampler.h")
    assert native.open_library(same) is not None
    swapped = native.Kernel("sampler_swapped", fused.KERNEL.source, tmp_path / "swapped" / "sampler.h")
    with pytest.raises(native.BuildError) as error:
        native.open_library(swapped)
    assert str(error.value) == ("sampler.h: struct rs_verify_default_args: the field 'sp1' lies at offset 8 (8 bytes) "
                                "as read, at 16 (8 bytes) as compiled: the struct read is not the one compiled")


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

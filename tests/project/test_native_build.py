"""Every C kernel of the package builds with warnings as errors, and its library exports what its header declares.

Where a C compiler is present, a kernel that does not build is a failure here (never a skip): its compiler
messages in full. Without one, the torch paths serve (checked in a subprocess whose compiler is missing: one
warning line per kernel, the same outputs) and the build test says so in one line."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from relaxspec import native
from relaxspec.acceptance import RULES, fused
from relaxspec.models import f32_kernels, gguf_block, int4_block

SRC = Path(__file__).resolve().parents[2] / "src" / "relaxspec"


def kernels() -> dict[str, native.Kernel]:
    """Every kernel of the package: the sampler's, each rule's with its math in C, FastLlama's, int4's and the GGUF
    block kernel's."""
    found = [fused.KERNEL, f32_kernels.KERNEL, int4_block.KERNEL, int4_block.AVX2_KERNEL, gguf_block.KERNEL]
    found += [fused.rule_kernel(rule.name, rule.native_test, rule.native_residual, rule.native_bonus)
              for rule in RULES.values() if rule.native_test is not None]
    return {k.name: k for k in found}


KERNELS = kernels()


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_kernel_builds_with_warnings_as_errors(name, tmp_path):
    kernel = KERNELS[name]
    if native.compiler() is None:
        pytest.skip("no C compiler: every kernel's torch path serves (test_without_a_compiler_the_torch_paths_serve)")
    cpu = {int4_block.KERNEL: int4_block.CPU_FLAGS, int4_block.AVX2_KERNEL: int4_block.AVX2_FLAGS}.get(kernel)
    if cpu is not None and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the int4 block kernels are x86-64 AVX-512 and AVX2 code")
    try:
        target = native.build(kernel, native.WARNINGS, tmp_path)
    except native.BuildError as error:
        pytest.fail(f"{name} does not build with {' '.join(native.WARNINGS)}:\n{error}", pytrace=False)
    declared = native.signatures(kernel.header)
    if cpu is not None and not set(cpu) <= native.cpu_flags():
        return  # built; not loadable on this CPU's instruction set
    lib = ctypes.CDLL(str(target))
    native.check_layout(lib, kernel.header)  # the structs' layout as read is the compiler's
    for function in kernel.functions or declared:
        assert function in declared, f"{name}: {function} is not in {kernel.header.name}"
        assert hasattr(lib, function), f"{name}: {kernel.header.name} declares {function}, the library lacks it"


def test_no_function_takes_more_than_8_arguments():
    """A function of more than 8 takes one struct instead, filled by name (native.structs)."""
    many = {f"{header.name}: {f}": len(args) for header in {k.header for k in KERNELS.values()}
            for f, (_, args) in native.signatures(header).items() if len(args) > 8}
    assert not many


def test_each_rule_file_belongs_to_a_rule_and_every_kernel_file_is_shipped_beside_its_module():
    rules = {rule.native_test for rule in RULES.values() if rule.native_test is not None}
    files = {p.name for p in (fused.CSRC / "rules").glob("*.c")}
    assert rules == files
    for kernel in KERNELS.values():
        assert kernel.source.is_file() and kernel.header.is_file()
        assert SRC in kernel.source.parents


def test_without_a_compiler_the_torch_paths_serve(tmp_path):
    """CC names no compiler: every kernel is None with one warning line, and the same outputs as with the kernels
    turned off (RELAXSPEC_NATIVE=0)."""
    code = ("import warnings, torch\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    from relaxspec.acceptance import fused, verify\n"
            "    from relaxspec.models import f32_kernels, gguf_block, int4_block\n"
            "    from relaxspec.models.quant import Linear\n"
            "    libs = [fused.library(), fused.rule_library('typical', 'typical.c', False, False),\n"
            "            f32_kernels.library(), int4_block.kernel()]\n"
            "    g = torch.Generator().manual_seed(0)\n"
            "    z = torch.randn(1, 4, 50, generator=g)\n"
            "    x = torch.randint(0, 50, (1, 3), generator=g)\n"
            "    out = verify('typical', z, z[:, :3] + 1, x, temperature=0.7, generator=g)\n"
            "    w = torch.randn(32, 64, generator=g)\n"
            "    y = Linear(w)(torch.randn(3, 64, generator=g))\n"
            "    y = y + Linear(w, 'int4', int4_impl='block')(torch.ones(2, 64))[0, 0]\n"
            "print([lib is None for lib in libs], out.tokens.tolist(), round(float(y.sum()), 3))\n"
            "print(sorted({str(c.message).split(' unavailable')[0] for c in caught\n"
            "              if 'unavailable' in str(c.message)}))\n")
    env = {k: v for k, v in os.environ.items() if k != "RELAXSPEC_NATIVE"}
    env.update(CC=str(tmp_path / "no-such-cc"), RELAXSPEC_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(sys.path))
    missing = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**env, "RELAXSPEC_NATIVE": "0"})
    assert missing.returncode == 0, missing.stderr[-2000:]
    assert off.returncode == 0, off.stderr[-2000:]
    libs_outputs, warned = missing.stdout.strip().splitlines()
    assert libs_outputs.startswith("[True, True, True, True]")
    assert libs_outputs == off.stdout.strip().splitlines()[0]  # the torch paths: the same outputs
    expected = ["relaxspec native kernel 'f32_kernels'", "relaxspec native kernel 'sampler'"]
    if int4_block.isa() is not None:
        expected.append("relaxspec int4 block kernel")
    assert eval(warned) == sorted(expected)
    assert off.stdout.strip().splitlines()[1] == "[]"  # turned off: no warning

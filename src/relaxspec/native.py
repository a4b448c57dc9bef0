"""The builder of the package's C kernels: each built on first use with the system's C compiler into a shared
library and loaded with ctypes.

The engine's round on a small model is made of many tiny tensor operations (a few microseconds each of
dispatch); a kernel does the work of several of them in one call. A kernel's sources are files shipped with the
package (`csrc/` beside the module that uses it; `relaxspec/csrc/` holds what several share): one translation
unit and one header, its interface, that declares every function the library exports. The translation unit
includes its header, so the compiler checks each definition against its declaration, and the ctypes
signatures are read from the header's prototypes (`signatures`): no argument list is written twice. A function of
more than 8 arguments takes one struct instead, defined in the header, whose fields Python fills by name
(`structs`: ctypes structures made from the header's struct definitions; an unknown name refused), and each library
carries the compiler's layout of its header's structs (each field's offset and size), checked against the
structures read when it loads (`check_layout`): a struct read otherwise than compiled is an error, never two values
swapped unnoticed. Plain C, no torch headers (a build takes about a second), compiled with `-O3 -march=native` (a
kernel may give its own flags) into a library cached under `$RELAXSPEC_CACHE` (default
`~/.cache/relaxspec/kernels`), keyed by the sources (every file of its include folders, the header, the layout
table), the flags, the compiler and the CPU, and written atomically (parallel workers may build the same one; the
last rename wins, both are equal).

Callers pass tensors' data pointers (`tensor.data_ptr()`): CPU, contiguous, of the dtype the C function expects;
the callers check that and keep a torch path for everything else (another device or dtype). `load` returns None,
with one warning line per kernel, where no compiler is found or the build fails, and always when
`RELAXSPEC_NATIVE=0` (the torch path then serves: tests compare the two; tests/project/test_native_build.py builds every
kernel with warnings as errors and fails where one does not build).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno")
CSRC = Path(__file__).resolve().parent / "csrc"  # C shared by the kernels (exp_nonpositive.h), on every include path
WARNINGS = ("-Wall", "-Wextra", "-Werror")  # the build test's flags (tests/project/test_native_build.py)


@dataclass(frozen=True)
class Kernel:
    """One library: `source`, the translation unit compiled (its folder and CSRC on the include path, with
    `include`); `header`, its interface, whose prototypes give the ctypes signatures of the functions in
    `functions` (None: every one it declares); `defines`, (name, value) pairs passed as -D; `flags`, the compiler's
    flags."""

    name: str
    source: Path
    header: Path
    include: tuple[Path, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...] = FLAGS
    functions: tuple[str, ...] | None = None

    def include_dirs(self) -> tuple[Path, ...]:
        return (self.source.parent, *self.include, CSRC)

    def command(self, compiler: str, out: Path, extra: tuple[str, ...] = (), layout: Path | None = None) -> list[str]:
        """The build's command line; `layout`: the layout table's translation unit (`layout_source`), linked in."""
        return [compiler, *self.flags, *extra, *(f"-I{d}" for d in self.include_dirs()),
                *(f"-D{k}={v}" if v else f"-D{k}" for k, v in self.defines), "-o", str(out), str(self.source),
                *(() if layout is None else (str(layout),)), "-lm"]


class BuildError(RuntimeError):
    """A kernel that cannot be built or loaded: `summary` in one line, the compiler's messages in full after it."""

    def __init__(self, summary: str, detail: str = ""):
        super().__init__(summary + (f"\n{detail}" if detail else ""))
        self.summary = summary


def enabled() -> bool:
    """False when RELAXSPEC_NATIVE=0 (every kernel then stays unused)."""
    return os.environ.get("RELAXSPEC_NATIVE", "1") != "0"


def compiler() -> str | None:
    """The C compiler the kernels are built with ($CC, else cc or gcc on the PATH), or None."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


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


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _sources_key(kernel: Kernel, compiler_path: str, extra: tuple[str, ...], layout: str | None) -> str:
    """The cache key: every C file of the kernel's include folders (name and text), its header and layout table
    (`layout_source`), its defines and flags, the compiler and the CPU."""
    h = hashlib.sha256()
    for folder in kernel.include_dirs():
        for path in sorted(p for p in folder.rglob("*") if p.suffix in (".c", ".h")):
            h.update(f"{path.relative_to(folder)}\0".encode() + path.read_bytes() + b"\0")
    h.update(kernel.header.read_bytes() + b"\0" + (layout or "").encode() + b"\0")
    h.update("\0".join((kernel.source.name, repr(kernel.defines), " ".join(kernel.flags + extra), compiler_path,
                        _cpu_identity())).encode())
    return h.hexdigest()[:16]


def build(kernel: Kernel, extra: tuple[str, ...] = (), directory: Path | None = None) -> Path:
    """The kernel's library (its source and layout table, `layout_source`), built (or found built) under `directory`
    (default: cache_dir()) with `extra` flags; BuildError where there is no compiler or the build fails."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (cc) found")
    layout = layout_source(kernel)
    target = (directory or cache_dir()) / f"{kernel.name}-{_sources_key(kernel, cc, extra, layout)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out, table = Path(tmp) / target.name, None
        if layout is not None:
            table = Path(tmp) / "layout.c"
            table.write_text(layout)
        command = kernel.command(cc, out, extra, table)
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            messages = done.stderr.strip() or done.stdout.strip()
            raise BuildError(f"the build failed: {(messages.splitlines() or ['failed'])[0][:200]}",
                             f"{messages}\n(command: {' '.join(command)})")
        os.replace(out, target)
    return target


@functools.cache
def load(kernel: Kernel) -> ctypes.CDLL | None:
    """The kernel's library (`open_library`), None, with one warning line, where it cannot be built or loaded, and
    None where RELAXSPEC_NATIVE=0."""
    if not enabled():
        return None
    try:
        return open_library(kernel)
    except BuildError as error:
        return _unavailable(kernel.name, error.summary)


def open_library(kernel: Kernel) -> ctypes.CDLL:
    """The kernel's library, built if needed, with its functions' signatures declared from its header; BuildError
    where it cannot be built or loaded, or its structs' layout is not the one read (`check_layout`)."""
    try:
        target = build(kernel)
    except (OSError, subprocess.SubprocessError) as error:
        raise BuildError(f"{type(error).__name__}: {error}") from error
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as error:
        raise BuildError(f"cannot load {target}: {error}") from error
    declared = signatures(kernel.header)
    check_layout(lib, kernel.header)
    for function in kernel.functions or tuple(declared):
        f = getattr(lib, function)
        f.restype, f.argtypes = declared[function]
    return lib


def _unavailable(name: str, why: str):
    warnings.warn(f"relaxspec native kernel {name!r} unavailable ({why}); the torch path serves", stacklevel=3)
    return None


_CTYPES = {"void": None, "int": ctypes.c_int, "long": ctypes.c_long, "int64_t": ctypes.c_int64,
           "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "size_t": ctypes.c_size_t,
           "float": ctypes.c_float, "double": ctypes.c_double}
_PROTOTYPE = re.compile(r"([A-Za-z_][\w\s]*?[\s*]+)([A-Za-z_]\w*)\s*\(([^()]*)\)\s*;")
_STRUCT = re.compile(r"\bstruct\s+([A-Za-z_]\w*)\s*\{([^{}]*)\}\s*;")  # struct NAME { fields };
_STRUCT_POINTER = re.compile(r"\s*(?:const\s+)?struct\s+([A-Za-z_]\w*)\s*\*\s*")  # a parameter's type
_FIELD = re.compile(r"\s*(.*?\w)\s*(\**\s*[A-Za-z_]\w*)\s*")  # a field's type words, then its first declarator
_DECLARATOR = re.compile(r"\s*(\**)\s*([A-Za-z_]\w*)\s*")  # *...name


def _declarations(header: Path) -> str:
    """The header's text without its comments and preprocessor lines."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", header.read_text(), flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


@functools.cache
def signatures(header: Path) -> dict[str, tuple]:
    """{function: (restype, [argtypes])} of every prototype in a kernel's header: a pointer to one of its structs is
    a pointer to its ctypes structure (`structs`; callers pass the structure), another pointer c_void_p (callers pass
    data pointers), a scalar its ctypes type (_CTYPES); ValueError for a type outside them."""
    found = {}
    for ret, name, args in _PROTOTYPE.findall(_declarations(header)):
        params = [] if args.strip() in ("", "void") else [re.sub(r"\w+$", "", a.strip()) for a in args.split(",")]
        found[name] = (_ctype(ret, header, name), [_argtype(a, header, name) for a in params])
    if not found:
        raise ValueError(f"{header}: no function prototypes")
    return found


class Struct(ctypes.Structure):
    """A struct of a kernel's header as ctypes reads it (`structs`), filled by name: Struct(field=value, ...), a
    pointer field taking a data pointer or None. No instance attributes: a name that is not a field is an
    AttributeError. A field not given is 0, as ctypes leaves it: ctypes' own constructor, with no check of its own,
    costs less than the positional arguments it replaces (tests/project/test_native.py checks that each of the package's
    calls names every field)."""

    __slots__ = ()


@functools.cache
def structs(header: Path) -> dict[str, type[Struct]]:
    """{name: ctypes structure} of every `struct NAME { ... };` a kernel's header defines, its fields in the header's
    order (one type and its declarators per declaration: `const float *p, *q;`), typed as `signatures` types
    parameters; ValueError for a field it cannot read (an array, a bit-field, a type outside _CTYPES)."""
    found = {}
    for name, body in _STRUCT.findall(_declarations(header)):
        fields = []
        for declaration in filter(str.strip, body.split(";")):
            first, *rest = declaration.split(",")
            match = _FIELD.fullmatch(first)
            declarators = [match and _DECLARATOR.fullmatch(d) for d in ([match[2]] if match else []) + rest]
            if not match or not all(declarators):
                raise ValueError(f"{header}: struct {name}: cannot read the field declaration {declaration.strip()!r}")
            fields += [(d[2], _ctype(f"{match[1]} {d[1]}", header, f"struct {name}")) for d in declarators]
        found[name] = type(name, (Struct,), {"__slots__": (), "_fields_": fields})
    return found


def layout_source(kernel: Kernel) -> str | None:
    """The C of the kernel's layout table, linked into its library: for each struct of its header (`structs`, field
    names as read), `relaxspec_layout_<struct>[]` = {its size, then each field's offset and size}, as the compiler
    lays it out, the header included by name through the kernel's include path (as its source includes it); None
    where the header defines no struct."""
    declared = structs(kernel.header)
    if not declared:
        return None
    lines = ["#include <stddef.h>", "#include <stdint.h>", f'#include "{kernel.header.name}"']
    for name, struct in declared.items():
        sizes = "".join(f", offsetof(struct {name}, {field}), sizeof(((struct {name} *)0)->{field})"
                        for field, _ in struct._fields_)
        lines.append(f"const int64_t relaxspec_layout_{name}[] = {{sizeof(struct {name}){sizes}}};")
    return "\n".join(lines) + "\n"


def check_layout(lib: ctypes.CDLL, header: Path) -> None:
    """BuildError, naming the first field that differs, where the library's layout of a struct of `header` (its
    compiler's, `layout_source`) is not the ctypes structure's (`structs`): a header read otherwise than compiled."""
    for name, struct in structs(header).items():
        fields = [(field, getattr(struct, field)) for field, _ in struct._fields_]
        read = [ctypes.sizeof(struct)] + [n for _, f in fields for n in (f.offset, f.size)]
        try:
            # read through a pointer: an array type per table would be new ctypes types (and their reference cycles)
            # at each library's first open
            table = ctypes.addressof(ctypes.c_int64.in_dll(lib, f"relaxspec_layout_{name}"))
            compiled = ctypes.cast(table, ctypes.POINTER(ctypes.c_int64))[:len(read)]
        except ValueError as error:
            raise BuildError(f"{header.name}: struct {name}: the library has no layout table ({error})") from error
        if compiled == read:
            continue
        differs = next(((field, f.offset, f.size, compiled[1 + 2 * i], compiled[2 + 2 * i])
                        for i, (field, f) in enumerate(fields) if compiled[1 + 2 * i:3 + 2 * i] != [f.offset, f.size]),
                       None)
        where = (f"the field {differs[0]!r} lies at offset {differs[1]} ({differs[2]} bytes) as read, at "
                 f"{differs[3]} ({differs[4]} bytes) as compiled" if differs
                 else f"its size is {read[0]} bytes as read, {compiled[0]} as compiled")
        raise BuildError(f"{header.name}: struct {name}: {where}: the struct read is not the one compiled")


def _argtype(decl: str, header: Path, function: str):
    """A parameter's ctypes type: a pointer to a struct of the header is a pointer to its structure."""
    struct = _STRUCT_POINTER.fullmatch(decl)
    if struct is None:
        return _ctype(decl, header, function)
    declared = structs(header)
    if struct[1] not in declared:
        raise ValueError(f"{header}: {function}: struct {struct[1]} is not defined in the header")
    return ctypes.POINTER(declared[struct[1]])


def _ctype(decl: str, header: Path, where: str):
    if "*" in decl:
        return ctypes.c_void_p
    words = [w for w in decl.split() if w not in ("const", "extern", "static", "inline")]
    if len(words) != 1 or words[0] not in _CTYPES:
        raise ValueError(f"{header}: {where}: the type {decl.strip()!r} has no ctypes mapping")
    return _CTYPES[words[0]]


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

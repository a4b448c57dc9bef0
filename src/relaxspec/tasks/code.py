"""Code answers: extraction from a response, and scoring in the sandbox.

  extract_code     the code of a response: a fenced block (the first one that defines the entry
                   point when one is named, else the last one; an unclosed fence runs to the end),
                   else the raw response.
  passes_asserts   a program made of code + setup + assert lines passes in the sandbox (mbpp).
  passes_io        a stdin/stdout program prints the expected output for every input (livecodebench).
"""

from __future__ import annotations

import re

from relaxspec.tasks.sandbox import DEFAULT_TIMEOUT_S, passes_tests, run_python

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_CODE_LANGS = ("", "python", "py", "python3")


def extract_code(response: str, entry_point: str | None = None) -> str:
    blocks = [body for lang, body in _FENCE.findall(response) if lang.lower() in _CODE_LANGS]
    if not blocks:
        return response
    if entry_point:
        for body in blocks:
            if defines(body, entry_point):
                return body
    return blocks[-1]


def defines(code: str, name: str) -> bool:
    """Whether `code` defines the top-level function `name`."""
    return re.search(rf"^def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def passes_asserts(code: str, tests: list[str], setup: str = "", timeout: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    """The program: the code, then the setup (MBPP's `test_setup_code` builds its inputs from the code's own
    classes, e.g. task 367's trees of `Node`s), then the asserts."""
    return passes_tests("\n".join([code, "", setup, "", *tests]), timeout=timeout)


def same_output(got: str, want: str) -> bool:
    """Token by token, ignoring whitespace differences; numbers may differ by 1e-6 (relative or absolute)."""
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if abs(fx - fy) > 1e-6 * max(1.0, abs(fy)):
            return False
    return True


def passes_io(code: str, tests: list[tuple[str, str]], timeout: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    """Run the program once per (input, expected output); stop at the first failure. The exit
    status does not matter: the output, which the program cannot know in advance, decides."""
    for i, (given, expected) in enumerate(tests):
        result = run_python(code, stdin=given, timeout=timeout)
        if result.timed_out:
            return False, f"test {i}: timed out"
        if not same_output(result.stdout, expected):
            return False, f"test {i}: wrong output" + (f" ({result.reason()})" if result.returncode else "")
    return True, "passed"

"""Answer extraction and comparison for the math and multiple-choice benchmarks.

  gsm8k            the number in the last \\boxed{} if any, else after the last '####', else the last
                   number of the response; compared as numbers (commas, $ and % ignored).
  math500, aime24  the last \\boxed{} (or \\fbox{}), normalised (see `normalize_math`), compared as
                   text, or as exact fractions when both sides are numbers.
  gpqa             the letter after the last 'Answer:' (or in the last \\boxed{}), A-D.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (braces balanced) or \\boxed X, or None."""
    matches = list(_BOXED.finditer(text))
    for m in reversed(matches):
        rest = text[m.end():]
        if not rest.startswith("{"):
            token = re.match(r"[^\s$]+", rest)
            if token:
                return token.group(0)
            continue
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0:
                return rest[1:i]
        # unbalanced: a truncated answer, try an earlier box
    return None


def to_number(text: str | None) -> Fraction | None:
    """`text` as an exact number: '1,234', '-3.50', '$12', '40%', '3/4', '\\frac{3}{4}'; else None."""
    if text is None:
        return None
    s = normalize_math(text)
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)/(-?\d+(?:\.\d+)?)", s)
    try:
        if m:
            return Fraction(m.group(1)) / Fraction(m.group(2))
        return Fraction(s) if re.fullmatch(r"-?\d+(?:\.\d+)?|-?\.\d+", s) else None
    except (ValueError, ZeroDivisionError):
        return None


def _unwrap(s: str, command: str) -> str:
    """\\command{x} -> x (balanced braces), for every occurrence."""
    while (i := s.find("\\" + command + "{")) >= 0:
        start = i + len(command) + 2
        depth, j = 1, start
        while j < len(s) and depth:
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            j += 1
        if depth:
            break
        s = s[:i] + s[start:j - 1] + s[j:]
    return s


def _fracs(s: str) -> str:
    """\\frac{a}{b} and \\frac12 -> (a)/(b), with the parentheses dropped around plain numbers."""
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    while (i := s.find("\\frac{")) >= 0:
        parts, j = [], i + len("\\frac")
        for _ in range(2):
            if j >= len(s) or s[j] != "{":
                return s
            depth, k = 0, j
            while k < len(s):
                depth += {"{": 1, "}": -1}.get(s[k], 0)
                if depth == 0:
                    break
                k += 1
            if depth:
                return s
            parts.append(s[j + 1:k])
            j = k + 1
        num, den = (p if re.fullmatch(r"-?\d+(?:\.\d+)?", p) else f"({p})" for p in parts)
        s = s[:i] + f"{num}/{den}" + s[j:]
    return s


def normalize_math(text: str) -> str:
    """A canonical form of a final answer: $, \\left/\\right, \\text{}, \\! and spacing commands
    removed; \\dfrac/\\tfrac -> \\frac -> a/b; degrees and percent signs dropped; thousands
    separators and trailing '.0' removed; a leading 'x =' dropped; all whitespace removed."""
    s = text.strip().strip("$").strip()
    for command in ("text", "textbf", "mathrm", "mbox"):
        s = _unwrap(s, command)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\\quad|\\?\$", "", s)
    s = re.sub(r"\^\s*\{?\\circ\}?|\\%|%|\\degree", "", s)
    s = _fracs(s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    if re.fullmatch(r"[a-zA-Z]\w?=.+", s):
        s = s.split("=", 1)[1]
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = re.sub(r"^(-?\d+)\.0+$", r"\1", s)
    return s


def math_equal(answer: str | None, reference: str) -> bool:
    if answer is None:
        return False
    got, want = normalize_math(answer), normalize_math(reference)
    if got == want and got:
        return True
    a, b = to_number(got), to_number(want)
    return a is not None and a == b


def math_utility(response: str, reference: str) -> float:
    """1.0 iff the last \\boxed{} answer equals the reference after normalisation."""
    return float(math_equal(last_boxed(response), reference))


def gsm8k_answer(response: str) -> str | None:
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    if "####" in response:
        return response.rsplit("####", 1)[1].strip().split("\n")[0]
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


def gsm8k_utility(response: str, reference: str) -> float:
    """1.0 iff the answer (\\boxed{}, else after '####', else the last number) equals the reference number."""
    got, want = to_number(gsm8k_answer(response)), to_number(reference)
    return float(got is not None and got == want)


_LETTER = re.compile(r"(?i:answer\s*(?:is)?)\s*:?\s*\**\s*\(?\$?([A-D])\b")


def choice_letter(response: str) -> str | None:
    """The letter after the last 'Answer:' / 'answer is', else in the last \\boxed{}; None if absent."""
    found = _LETTER.findall(response)
    if found:
        return found[-1].upper()
    boxed = last_boxed(response)
    if boxed is not None:
        m = re.fullmatch(r"\s*(?:\\text\{)?\(?([A-Da-d])\)?\}?\s*", boxed)
        if m:
            return m.group(1).upper()
    return None


def choice_utility(response: str, reference: str) -> float:
    """1.0 iff the extracted letter is the reference letter."""
    return float(choice_letter(response) == reference)

"""User datasets as JSONL: one {"prompt": str, "answer": str | number} object per line.

Metrics:
  exact    the final answer (text after the last "The answer is", else the whole stripped
           response) equals the answer, whitespace-stripped and case-sensitive;
  numeric  the last number in that final answer equals the answer as a number;
  contains the answer occurs anywhere in the response (case-insensitive).
"""

from __future__ import annotations

from pathlib import Path

from relaxspec.tasks.base import Example, Task, final_answer, jsonl_records, parse_number

METRICS = ("exact", "numeric", "contains")


def _answer_text(response: str) -> str:
    found = final_answer(response)
    return (found if found is not None else response).strip()


def exact_utility(response: str, reference: str) -> float:
    got = _answer_text(response).rstrip(".").strip()
    return float(got == str(reference).strip().rstrip(".").strip())


def numeric_utility(response: str, reference: str) -> float:
    got = parse_number(_answer_text(response))
    want = parse_number(str(reference))
    return float(got is not None and want is not None and got == want)


def contains_utility(response: str, reference: str) -> float:
    ref = str(reference).strip().lower()
    return float(bool(ref) and ref in response.lower())


UTILITIES = {"exact": exact_utility, "numeric": numeric_utility, "contains": contains_utility}


def read_jsonl(path: str | Path, metric: str = "exact") -> list[Example]:
    """Parse and validate a JSONL dataset; any malformed line -> ValueError naming file:line."""
    if metric not in METRICS:
        raise ValueError(f"unknown JSONL metric {metric!r}; known: {', '.join(METRICS)}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"JSONL dataset {str(path)!r} does not exist")
    examples = []
    for lineno, obj in jsonl_records(str(path), path.read_bytes()):
        where = f"{path}:{lineno}"
        for key in ("prompt", "answer"):
            if key not in obj:
                raise ValueError(f"{where}: missing key {key!r}")
        prompt, answer = obj["prompt"], obj["answer"]
        if not isinstance(prompt, str):
            raise ValueError(f"{where}: 'prompt' must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError(f"{where}: 'prompt' is empty")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise ValueError(f"{where}: 'answer' must be a string or a number, got {type(answer).__name__}")
        answer = str(answer)
        if not answer.strip():
            raise ValueError(f"{where}: 'answer' is empty")
        if metric == "numeric" and parse_number(answer) is None:
            raise ValueError(f"{where}: metric 'numeric' needs a numeric 'answer', got {answer!r}")
        examples.append(Example(prompt=prompt, reference=answer))
    if not examples:
        raise ValueError(f"{path}: no examples (the file is empty)")
    return examples


def jsonl_task(path: str | Path, metric: str = "exact") -> Task:
    examples = read_jsonl(path, metric)
    return Task(name=f"jsonl:{Path(path).name}", examples=examples, utility=UTILITIES[metric], metric=metric,
                meta={"path": str(Path(path).resolve()), "metric": metric})

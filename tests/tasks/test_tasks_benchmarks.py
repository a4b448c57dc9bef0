"""The seeds' benchmarks, loaded offline from small files in each dataset's own schema."""

import base64
import json
import pickle
import zlib

import pytest

from relaxspec.tasks import get_task
from relaxspec.tasks.benchmarks import BENCHMARKS, REASON_BOXED, gpqa_choices
from relaxspec.tasks.humaneval import problems
from helpers import write_jsonl


def jsonl(tmp_path, rows, name="data.jsonl"):  # (parquet's signature)
    return write_jsonl(tmp_path / name, rows)


def parquet(tmp_path, rows, name="data.parquet"):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


GSM8K = [{"question": "Ann has 2 apples and buys 3. How many?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"},
         {"question": "A pen costs $1,200 / 100. How much?", "answer": "1200 / 100 = 12\n#### 12"}]


@pytest.mark.parametrize("write", [jsonl, parquet])
def test_gsm8k_from_jsonl_and_parquet(tmp_path, write):
    task = get_task(f"gsm8k:{write(tmp_path, GSM8K)}")
    assert task.references == ["5", "12"] and task.metric == "numeric"
    assert task.prompts[0] == REASON_BOXED.replace("{question}", GSM8K[0]["question"])
    assert task.prompts[0].endswith("Please reason step by step, and put your final answer within \\boxed{}.")
    assert task.examples[0].response == GSM8K[0]["answer"]
    assert task.score(r"2 + 3 = 5, so \boxed{5}", "5") == 1.0
    assert task.score("#### 6", "5") == 0.0
    assert len(get_task(f"gsm8k:{write(tmp_path, GSM8K)}", limit=1).examples) == 1


@pytest.mark.parametrize("answer, message", [("no final answer", "no '#### <number>'"),
                                             ("#### five", "not a number")])
def test_gsm8k_malformed_rows(tmp_path, answer, message):
    path = write_jsonl(tmp_path / "data.jsonl", [GSM8K[0], {"question": "q", "answer": answer}])
    with pytest.raises(ValueError, match=f"data.jsonl:2: .*{message}"):
        get_task(f"gsm8k:{path}")


def test_math500_and_aime24_schemas(tmp_path):
    math = [{"problem": "What is $1/2 + 1/4$?", "solution": "...", "answer": r"\frac{3}{4}", "subject": "Algebra",
             "level": 1, "unique_id": "test/algebra/1.json"}]
    task = get_task(f"math500:{write_jsonl(tmp_path / 'data.jsonl', math)}")
    assert task.references == [r"\frac{3}{4}"] and task.examples[0].response == "..."
    assert task.score(r"$\boxed{\dfrac34}$", task.references[0]) == 1.0
    assert task.score(r"\boxed{0.75}", task.references[0]) == 1.0
    assert task.score(r"\boxed{\frac{3}{5}}", task.references[0]) == 0.0
    assert task.score("3/4", task.references[0]) == 0.0  # no \boxed{}
    # aime24: HuggingFaceH4's lower-case schema, and the capitalised one with integer answers.
    h4 = [{"id": 60, "problem": "Find N.", "solution": "s", "answer": "204", "url": "u", "year": "2024"}]
    caps = [{"ID": "2024-I-1", "Problem": "Find N.", "Solution": "s", "Answer": 204}]
    for rows in (h4, caps):
        task = get_task(f"aime24:{write_jsonl(tmp_path / 'data.jsonl', rows)}")
        assert task.references == ["204"] and task.score(r"\boxed{204}", "204") == 1.0
        assert task.score(r"\boxed{24}", "204") == 0.0


def gpqa_row(i):
    return {"Question": f"Question number {i}?", "Correct Answer": f"right {i}", "Incorrect Answer 1": f"wrong a{i}",
            "Incorrect Answer 2": f"wrong b{i}", "Incorrect Answer 3": f"wrong c{i}", "Record ID": f"rec{i}"}


def test_gpqa_choices_shuffled_per_question_with_a_fixed_seed(tmp_path):
    rows = [gpqa_row(i) for i in range(40)]
    task = get_task(f"gpqa:{write_jsonl(tmp_path / 'data.jsonl', rows)}")
    again = get_task(f"gpqa:{write_jsonl(tmp_path / 'reversed.jsonl', rows[::-1])}")
    assert task.prompts == again.prompts[::-1]  # fixed by the question, not by the position
    for ex, row in zip(task.examples, rows):
        lines = ex.prompt.splitlines()
        assert f"{ex.reference}) {row['Correct Answer']}" in lines
        assert sorted(line[0] for line in lines if line[1:3] == ") ") == ["A", "B", "C", "D"]
        assert task.score(f"Some reasoning.\nAnswer: {ex.reference}", ex.reference) == 1.0
        assert task.score("Answer: " + "ABCD".replace(ex.reference, "")[0], ex.reference) == 0.0
        assert task.score("I cannot tell.", ex.reference) == 0.0
    letters = [ex.reference for ex in task.examples]
    assert set(letters) == set("ABCD")  # 40 questions: every position is used (chance of failing < 4 * 0.75**40)
    text, letter = gpqa_choices("Q?", "yes", ["no1", "no2", "no3"])
    assert (text, letter) == gpqa_choices("Q?", "yes", ["no1", "no2", "no3"])


MBPP_FULL = {"task_id": 11, "text": "Write a function to add two numbers.",
             "code": "def add_nums(a, b):\n    return a + b", "test_list": ["assert add_nums(1, 2) == 3",
                                                                     "assert add_nums(-1, 1) == 0"],
             "test_setup_code": "", "challenge_test_list": []}
MBPP_SANITIZED = {"source_file": "x.py", "task_id": 12, "prompt": "Write a function to find the max of a list.",
                  "code": "import math\ndef list_max(xs):\n    return max(xs)", "test_imports": ["import math"],
                  "test_list": ["assert list_max([1, 5, 2]) == 5", "assert math.isclose(list_max([0.5]), 0.5)"]}


@pytest.mark.parametrize("write", [jsonl, parquet])
def test_mbpp_full_and_sanitized_schemas(tmp_path, write):
    task = get_task(f"mbpp:{write(tmp_path, [MBPP_FULL])}")
    assert task.references == ["11"] and "assert add_nums(1, 2) == 3" in task.prompts[0]
    ref = "11"
    assert task.score("Here it is:\n```python\ndef add_nums(a, b):\n    return a + b\n```\nDone.", ref) == 1.0
    assert task.score("def add_nums(a, b):\n    return a + b\n", ref) == 1.0  # raw code
    assert task.score("```python\ndef add_nums(a, b):\n    return a - b\n```", ref) == 0.0
    assert task.score("```python\nimport sys\nsys.exit(0)\n```", ref) == 0.0
    assert task.score("no code at all", ref) == 0.0
    sanitized = get_task(f"mbpp:{write_jsonl(tmp_path / 's.jsonl', [MBPP_SANITIZED])}")
    assert sanitized.score("```python\ndef list_max(xs):\n    return sorted(xs)[-1]\n```", "12") == 1.0
    assert sanitized.score("```python\ndef list_max(xs):\n    return xs[0]\n```", "12") == 0.0
    with pytest.raises(ValueError, match="unknown problem id"):
        task.score("x", "999")


def test_humaneval_from_a_file_in_the_hub_schema(tmp_path):
    p = problems()["HumanEval/2"]
    path = write_jsonl(tmp_path / "data.jsonl", [{k: p[k] for k in ("task_id", "prompt", "canonical_solution", "test", "entry_point")}])
    task = get_task(f"humaneval:{path}")
    assert task.prompts == [p["prompt"]] and task.references == ["HumanEval/2"]
    assert task.score(p["canonical_solution"], "HumanEval/2") == 1.0
    fenced = f"Sure:\n```python\n{p['prompt']}{p['canonical_solution']}```\n"
    assert task.score(fenced, "HumanEval/2") == 1.0  # a whole function in a fenced block
    assert task.score("    return 0.0\n", "HumanEval/2") == 0.0
    assert get_task("humaneval", limit=2).references == ["HumanEval/0", "HumanEval/1"]  # the package's copy


def compress(tests):
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def lcb_row(qid, public, private, testtype="stdin", compressed=True):
    tag = lambda ts: [{"input": i, "output": o, "testtype": testtype} for i, o in ts]  # noqa: E731
    return {"question_title": "Sum", "question_content": "Read two integers and print their sum.",
            "platform": "atcoder", "question_id": qid, "contest_id": "abc1", "contest_date": "2024-08-01T00:00:00",
            "starter_code": "", "difficulty": "easy", "public_test_cases": json.dumps(tag(public)),
            "private_test_cases": compress(tag(private)) if compressed else json.dumps(tag(private)),
            "metadata": "{}"}


def test_livecodebench_public_and_private_tests(tmp_path):
    rows = [lcb_row("abc1_a", [("1 2\n", "3\n")], [("10 20\n", "30\n"), ("-5 5\n", "0\n")]),
            lcb_row("lc_1", [("[1]", "1")], [], testtype="functional"),
            lcb_row("abc1_b", [("2 2\n", "4\n")], [("1 1\n", "2\n")], compressed=False)]
    task = get_task(f"livecodebench:{write_jsonl(tmp_path / 'data.jsonl', rows)}")
    assert task.references == ["abc1_a", "abc1_b"] and task.meta["n_rows"] == 3  # functional problem left out
    assert "Read two integers" in task.prompts[0]
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert task.score(right, "abc1_a") == 1.0 and task.score(right, "abc1_b") == 1.0
    assert task.score("a, b = map(int, input().split())\nprint(a + b)\nexit(0)", "abc1_a") == 1.0  # raw, exit ok
    assert task.score("```python\nprint(3)\n```", "abc1_a") == 0.0  # passes the public test only
    assert task.score("```python\nraise SystemExit(0)\n```", "abc1_a") == 0.0


def test_livecodebench_refuses_code_in_a_pickled_field(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    row = lcb_row("abc1_a", [("1 2\n", "3\n")], [])
    row["private_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(ValueError, match="refusing to load "):
        get_task(f"livecodebench:{write_jsonl(tmp_path / 'data.jsonl', [row])}")
    row["private_test_cases"] = "not json, not base64 !"
    with pytest.raises(ValueError, match="neither JSON nor"):
        get_task(f"livecodebench:{write_jsonl(tmp_path / 'data.jsonl', [row])}")


def test_prompt_template_override(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", GSM8K)
    task = get_task(f"gsm8k:{path}", prompt_template="Q: {question}\nA:")
    assert task.prompts[0] == f"Q: {GSM8K[0]['question']}\nA:"
    template_file = tmp_path / "t.txt"
    template_file.write_text("<<{question}>> {braces} stay", encoding="utf-8")
    assert get_task(f"gsm8k:{path}", prompt_template=str(template_file)).prompts[1] == f"<<{GSM8K[1]['question']}>> {{braces}} stay"
    with pytest.raises(ValueError, match="placeholder"):
        get_task(f"gsm8k:{path}", prompt_template="no placeholder")
    with pytest.raises(ValueError, match="applies to the benchmarks"):
        get_task("arithmetic", prompt_template="{question}")


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="missing field 'answer'"):
        get_task(f"gsm8k:{write_jsonl(tmp_path / 'data.jsonl', [{'question': 'q'}])}")
    with pytest.raises(ValueError, match=r"data.jsonl:1: missing field 'correct answer'"):
        get_task(f"gpqa:{write_jsonl(tmp_path / 'data.jsonl', [{'Question': 'q'}])}")
    with pytest.raises(ValueError, match="does not exist"):
        get_task(f"math500:{tmp_path / 'none.jsonl'}")
    bad = tmp_path / "data.csv"
    bad.write_text("question,answer\n")
    with pytest.raises(ValueError, match="expected a .jsonl \\(JSON lines\\) or .parquet"):
        get_task(f"gsm8k:{bad}")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match="not a readable parquet"):
        get_task(f"gsm8k:{broken}")
    (tmp_path / "bad.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object"):
        get_task(f"gsm8k:{tmp_path / 'bad.jsonl'}")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no rows"):
        get_task(f"aime24:{tmp_path / 'empty.jsonl'}")
    (tmp_path / "latin.jsonl").write_bytes(b'{"question": "caf\xe9"}\n')
    with pytest.raises(ValueError, match="not UTF-8"):
        get_task(f"gsm8k:{tmp_path / 'latin.jsonl'}")


def test_every_benchmark_has_a_template_with_the_placeholder():
    assert set(BENCHMARKS) == {"gsm8k", "math500", "aime24", "gpqa", "mbpp", "mbpp-instruct", "humaneval", "humaneval-instruct",
                               "livecodebench"}
    for bench in BENCHMARKS.values():
        assert "{question}" in bench.template

import json

import pytest

from relaxspec.tasks import get_task
from relaxspec.tasks.jsonl import contains_utility, exact_utility, numeric_utility, read_jsonl


def write(tmp_path, lines, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_exact_uses_final_answer_else_stripped_response():
    assert exact_utility("Some steps. The answer is Paris.", "Paris") == 1.0
    assert exact_utility("  Paris \n", "Paris") == 1.0
    assert exact_utility("The answer is paris", "Paris") == 0.0  # case-sensitive
    assert exact_utility("Paris is nice. The answer is London.", "Paris") == 0.0  # the final answer decides
    assert exact_utility("", "Paris") == 0.0


def test_numeric():
    assert numeric_utility("3 + 4 = 7. The answer is 7.", "7") == 1.0
    assert numeric_utility("The answer is 1,234", "1234") == 1.0
    assert numeric_utility("The answer is 7.0", "7") == 1.0
    assert numeric_utility("The answer is 8", "7") == 0.0
    assert numeric_utility("The answer is seven", "7") == 0.0  # malformed: no number
    assert numeric_utility("42", "42") == 1.0  # no 'The answer is': the stripped response


def test_contains_is_case_insensitive_substring():
    assert contains_utility("I think it is PARIS, France", "paris") == 1.0
    assert contains_utility("London", "Paris") == 0.0


def test_jsonl_task_end_to_end(tmp_path):
    path = write(tmp_path, [json.dumps({"prompt": "2+2?", "answer": 4}), "",
                            json.dumps({"prompt": "3+3?", "answer": "6"})])
    task = get_task(f"jsonl:{path}:numeric")
    assert task.metric == "numeric" and task.prompts == ["2+2?", "3+3?"] and task.references == ["4", "6"]
    assert task.score("The answer is 4.", "4") == 1.0
    assert task.score("The answer is 5.", "4") == 0.0
    assert get_task(f"jsonl:{path}").metric == "exact"  # default metric
    assert len(get_task(f"jsonl:{path}", limit=1).examples) == 1


@pytest.mark.parametrize("line, message", [
    ("{not json", "invalid JSON"),
    (json.dumps({"answer": "x"}), "missing key 'prompt'"),
    (json.dumps({"prompt": "q"}), "missing key 'answer'"),
    (json.dumps({"prompt": 5, "answer": "x"}), "'prompt' must be a string"),
    (json.dumps({"prompt": "   ", "answer": "x"}), "'prompt' is empty"),
    (json.dumps({"prompt": "q", "answer": [1]}), "'answer' must be a string or a number"),
    (json.dumps(["q", "a"]), "expected a JSON object"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    path = write(tmp_path, [json.dumps({"prompt": "ok", "answer": "1"}), line])
    with pytest.raises(ValueError) as err:
        read_jsonl(path)
    assert f"{path}:2" in str(err.value) and message in str(err.value)


def test_numeric_metric_needs_numeric_answers(tmp_path):
    path = write(tmp_path, [json.dumps({"prompt": "q", "answer": "abc"})])
    with pytest.raises(ValueError, match=r"data.jsonl:1: metric 'numeric'"):
        read_jsonl(path, "numeric")


def test_bad_metric_missing_and_empty_file(tmp_path):
    path = write(tmp_path, [json.dumps({"prompt": "q", "answer": "a"})])
    with pytest.raises(ValueError, match="unknown JSONL metric"):
        read_jsonl(path, "fuzzy")
    with pytest.raises(ValueError, match="does not exist"):
        get_task(f"jsonl:{tmp_path / 'nope.jsonl'}")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no examples"):
        read_jsonl(empty)

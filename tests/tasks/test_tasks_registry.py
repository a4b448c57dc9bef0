import pytest

from relaxspec.tasks import arithmetic, get_task, sorting, synthetic  # noqa: F401  (the old imports keep working


def test_synthetic_specs_use_the_held_out_split():
    task = get_task("arithmetic", limit=5)
    assert len(task.examples) == 5 and task.meta["split"] == "test"
    ex = task.examples[0]
    assert task.score(f"The answer is {ex.reference}.", ex.reference) == 1.0
    assert task.score("The answer is 0.", ex.reference) == (1.0 if ex.reference == "0" else 0.0)
    assert get_task("sorting", limit=3).name == "sorting"
    assert get_task("arithmetic", limit=3).prompts == get_task("arithmetic", limit=3).prompts


def test_unknown_spec_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_task("nosuchtask")
    for known in ("arithmetic", "sorting", "humaneval", "jsonl:", "gsm8k[:PATH]", "livecodebench[:PATH]"):
        assert known in str(err.value)
    with pytest.raises(ValueError, match="names no file"):
        get_task("jsonl:")
    with pytest.raises(ValueError, match="limit"):
        get_task("arithmetic", limit=0)

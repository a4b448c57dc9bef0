import re

from relaxspec.tasks import arithmetic, sorting, synthetic
from relaxspec.tasks.base import split_of

EQUATION = re.compile(r"(\d+) ([+\-*]) (\d+) = (\d+)")


def test_generators_are_deterministic_under_a_seed():
    for task in synthetic.GENERATORS:
        a = synthetic.examples(task, "test", 20, seed=5)
        b = synthetic.examples(task, "test", 20, seed=5)
        c = synthetic.examples(task, "test", 20, seed=6)
        assert a == b
        assert a != c


def test_arithmetic_answers_recomputed_from_the_worked_steps():
    for ex in synthetic.examples("arithmetic", "test", 200):
        steps = EQUATION.findall(ex.response)
        assert 2 <= len(steps) <= 4
        prompt_numbers = set(re.findall(r"\d+", ex.prompt))
        value = None
        for x, op, y, result in steps:
            x, y, result = int(x), int(y), int(result)
            assert result == {"+": x + y, "-": x - y, "*": x * y}[op]
            assert value is None or x == value  # each step continues from the previous result
            if op != "*":
                assert str(y) in prompt_numbers  # operands come from the problem text
            value = result
        assert str(int(steps[0][0])) in prompt_numbers
        assert ex.reference == str(value)
        assert arithmetic.utility(ex.response, ex.reference) == 1.0


def test_sorting_answers_recomputed_from_the_prompt():
    for ex in synthetic.examples("sorting", "test", 200):
        listed = [int(x) for x in re.findall(r"\d+", ex.prompt.split(":", 1)[1])]
        assert ex.reference == ", ".join(map(str, sorted(listed)))
        assert sorting.utility(ex.response, ex.reference) == 1.0


def test_splits_are_disjoint():
    for task in synthetic.GENERATORS:
        prompts = {split: {e.prompt for e in synthetic.examples(task, split, 300)} for split in ("train", "pivot", "test")}
        assert not prompts["train"] & prompts["test"]
        assert not prompts["train"] & prompts["pivot"]
        assert not prompts["pivot"] & prompts["test"]
        assert all(split_of(p) == "test" for p in prompts["test"])


def test_utilities_on_hand_made_responses():
    assert arithmetic.utility("So 3 + 4 = 7. The answer is 7.", "7") == 1.0
    assert arithmetic.utility("The answer is 8.", "7") == 0.0
    assert arithmetic.utility("7", "7") == 0.0  # no stated final answer
    assert arithmetic.utility("The answer is seven.", "7") == 0.0
    assert sorting.utility("The answer is 1, 5, 12.", "1, 5, 12") == 1.0
    assert sorting.utility("The answer is 1, 12, 5.", "1, 5, 12") == 0.0
    assert sorting.utility("The answer is 1, 5.", "1, 5, 12") == 0.0


def test_surface_varies():
    exs = synthetic.examples("arithmetic", "test", 200)
    openers = {e.response.split(".")[0].split()[0] for e in exs}
    assert len(openers) >= 3
    lengths = {len(e.response) for e in exs}
    assert len(lengths) > 50

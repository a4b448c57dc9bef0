"""The GSM8K-style labelling problems (tasks/word_problems.py): well-formed, split by hash, and disjoint from the
evaluation sets: no problem text shared with HumanEval (always here), GSM8K's and MBPP's (the fetched files with
`-m task_data`; the offline stand-in rows of tests/tasks/test_tasks_fetch.py otherwise), by a 13-word overlap (the
contamination check of Brown et al. 2020)."""

import re

import pytest
from helpers import GSM8K_ROWS, MBPP_ROWS

from relaxspec.tasks import fetched
from relaxspec.tasks.answers import gsm8k_utility
from relaxspec.tasks.base import split_of
from relaxspec.tasks.humaneval import problems as humaneval_problems
from relaxspec.tasks.word_problems import examples, word_problems_task

N = 13  # words


def question(prompt: str) -> str:
    return prompt.split("\nPlease reason")[0]


def grams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + N]) for i in range(len(words) - N + 1)} or {tuple(words)}


def shared(ours: list[str], theirs: list[str]) -> list[str]:
    """Our texts sharing a 13-word run (or, for shorter texts, all their words) with one of theirs."""
    seen = set().union(*(grams(t) for t in theirs))
    return [t for t in ours if grams(t) & seen]


@pytest.fixture(scope="module")
def ours():
    return [question(e.prompt) for split in ("train", "pivot", "test") for e in examples(split, 1500)]


def test_problems_are_well_formed_and_split_by_hash():
    task = word_problems_task("pivot", 400)
    assert task.meta["split"] == "pivot" and task.name == "word-problems" and task.utility is gsm8k_utility
    assert len({e.prompt for e in task.examples}) == 400
    assert all(split_of(e.prompt) == "pivot" for e in task.examples)
    assert all(e.prompt.endswith("put your final answer within \\boxed{}.") for e in task.examples)
    # the worked solution ends in GSM8K's '#### N' and scores 1; the answer is a whole number; a wrong one scores 0
    assert all(gsm8k_utility(e.response, e.reference) == 1.0 and e.response.endswith(f"#### {e.reference}")
               for e in task.examples)
    assert all(re.fullmatch(r"\d+", e.reference) for e in task.examples)
    assert gsm8k_utility("so \\boxed{%d}" % (int(task.examples[0].reference) + 1), task.examples[0].reference) == 0
    assert [e.prompt for e in examples("pivot", 5)] == [e.prompt for e in task.examples[:5]]  # reproducible
    with pytest.raises(ValueError, match="unknown split"):
        examples("dev", 1)


def test_the_checker_finds_a_shared_problem(ours):
    """The check can fail: a labelling text planted among GSM8K's is found, a rewording of one is not."""
    planted, gsm8k = ours[7], [r["question"] for r in GSM8K_ROWS]
    assert shared([planted, ours[8]], gsm8k + [planted.replace("?", " please?")]) == [planted]
    assert shared(["Mia has 3 pens."], ["Mia has 3 pens."]) and not shared(["Mia has 3 pens."], ["Mia has 4 pens."])


def test_disjoint_from_humaneval_and_the_stand_in_rows(ours):
    he = [p["prompt"] for p in humaneval_problems().values()]
    assert len(he) == 164
    assert shared(ours, he) == []
    assert shared(ours, [r["question"] for r in GSM8K_ROWS]) == []
    assert shared(ours, [r["text"] for r in MBPP_ROWS]) == []


@pytest.mark.task_data
def test_disjoint_from_the_fetched_gsm8k_and_mbpp(ours):
    for name in ("gsm8k", "mbpp"):
        if not fetched.is_fetched(name):
            pytest.fail(f"run `relaxspec tasks fetch {name}` first (this test checks the real files)")
    gsm8k = [r["question"] for _, r in fetched.rows("gsm8k")]
    mbpp = [r["text"] for _, r in fetched.rows("mbpp")]
    assert len(gsm8k) == 1319 and len(mbpp) == 500
    assert shared(ours, gsm8k) == [] and shared(ours, mbpp) == []

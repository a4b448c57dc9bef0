"""The code-instruction pool (tasks/code_pool.py): distinct, deterministic, made of its templates, and disjoint from
every evaluation set: no pool prompt shares an 8-gram of normalized words with a HumanEval prompt, a held-out chat
prompt, or (here a few real rows; under `-m task_data` the full fetched sets) an MBPP, GSM8K or MATH-500 problem, and
no object it is made from is named as a HumanEval or MBPP entry point. The overlap is computed here, not with the
module's own helpers."""

import re

import pytest

from relaxspec.tasks import chat, code_pool, fetched, humaneval

N = 8

# Real rows (MBPP's test split, GSM8K's and MATH-500's test sets, as `relaxspec tasks fetch` stores them): MBPP 108 is
# heapq.merge's docstring, MBPP 38 and 143 share "1 2 3 4 5 6 7 8" with statistics.covariance's.
MBPP_ROWS = [
    {"task_id": 108, "text": "Write a function to merge multiple sorted inputs into a single sorted iterator using heap "
                             "queue algorithm.",
     "test_list": ["assert merge_sorted_list([25, 24, 15, 4, 5, 29, 110],[19, 20, 11, 56, 25, 233, 154],"
                   "[24, 26, 54, 48])==[4, 5, 11, 15, 19, 20, 24, 24, 25, 25, 26, 29, 48, 54, 56, 110, 154, 233]"]},
    {"task_id": 38, "text": "Write a function to find the division of first even and odd number of a given list.",
     "test_list": ["assert div_even_odd([1,3,5,7,4,1,6,8])==4", "assert div_even_odd([1,2,3,4,5,6,7,8,9,10])==2"]},
    {"task_id": 11, "text": "Write a python function to remove first and last occurrence of a given character from the "
                            "string.",
     "test_list": ['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"']},
]
GSM8K_ROWS = ["A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in total does it take?",
              "Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for "
              "her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh "
              "duck egg. How much in dollars does she make every day at the farmers' market?"]
MATH500_ROWS = ["Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your answer in the "
                "form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$"]


def grams(text: str) -> set:
    w = re.findall(r"[a-z0-9]+", text.lower())
    return {" ".join(w[i:i + N]) for i in range(len(w) - N + 1)}


def overlaps(prompts, texts) -> list[tuple[str, str]]:
    """(a prompt's start, the 8-gram) of every pool prompt sharing an 8-gram with one of `texts`."""
    seen = set().union(*map(grams, texts))
    return [(p[:60], g) for p in prompts for g in grams(p) if g in seen]


def mbpp_texts(rows):
    return [r["text"] + "\n" + "\n".join(r["test_list"]) for r in rows]


def mbpp_names(rows):
    """The functions an MBPP problem's tests call (its entry point) and, when given, those its code defines."""
    return {n for r in rows for t in r["test_list"] for n in re.findall(r"assert\s+(?:not\s+)?\(?\s*([A-Za-z_]\w*)\(", t)
            } | {n for r in rows for n in re.findall(r"def\s+(\w+)", r.get("code", ""))}


def used_names():
    return {key.rpartition(".")[2] for key, _ in code_pool.entries()}


def test_the_pool_is_thousands_of_distinct_prompts_from_every_template():
    pool = code_pool.training_prompts(code_pool.pool_size())
    assert len(set(pool)) == len(pool) == code_pool.pool_size() > 10_000
    heads = [t.split("`")[0].split("{")[0] for t in (*code_pool.DOC_TEMPLATES, *code_pool.METHOD_TEMPLATES,
                                                      *code_pool.CLASS_TEMPLATES, *code_pool.SOURCE_TEMPLATES,
                                                      code_pool.USE_TEMPLATE, code_pool.FIX_TEMPLATE)]
    counts = {h: sum(p.startswith(h) for p in pool) for h in heads}
    assert min(counts.values()) >= 250, counts
    # read from the source files: heapq's Python definitions, though C replaces them at run time
    assert "Write a Python function `heappush(heap, item)`. Push item onto heap, maintaining the heap invariant." in pool
    assert any(p.startswith("Write a Python function `dedent(text)`. Remove any common leading whitespace") for p in pool)
    # a bug to fix is the function's source with exactly one operator changed
    fixes = [p for p in pool if p.startswith(code_pool.FIX_TEMPLATE.split("\n")[0])]
    assert len(fixes) > 500 and all(p.count("```python") == 1 for p in fixes)


def test_the_pool_is_the_same_when_built_again_and_seeded_when_drawn():
    digest, size = code_pool.pool_digest(), code_pool.pool_size()
    code_pool.entries.cache_clear()
    code_pool._heldout_ngrams.cache_clear()
    assert (code_pool.pool_digest(), code_pool.pool_size()) == (digest, size)
    if code_pool.python_version() == code_pool.STDLIB:  # the size and digest docs/models.md records
        assert (size, digest) == (14514, "8624d2d7b1b973e1")
    assert code_pool.training_prompts(50, seed=1) == code_pool.training_prompts(50, seed=1)
    assert code_pool.training_prompts(50, seed=1) != code_pool.training_prompts(50, seed=2)
    with pytest.raises(ValueError, match=rf"^code training prompts: n must be in 1\.\.{size} \(the pool's size\), "
                                         rf"got {size + 1}$"):
        code_pool.training_prompts(size + 1)


def left_out(monkeypatch) -> dict[str, list[str]]:
    """{object: its prompts} of the objects the pool leaves out by construction (EXCLUDED, EVAL_ENTRY_POINTS)."""
    monkeypatch.setattr(code_pool, "EXCLUDED", frozenset())
    monkeypatch.setattr(code_pool, "EVAL_ENTRY_POINTS", frozenset())
    out = {}
    for key, prompt in code_pool._candidates():
        if key in {"statistics.covariance", "heapq.merge", "statistics.median"}:
            out.setdefault(key, []).append(prompt)
    return out


def test_no_pool_prompt_shares_an_8_gram_with_humaneval_or_the_heldout_chat_prompts(monkeypatch):
    pool = code_pool.training_prompts(code_pool.pool_size())
    problems = [p["prompt"] for p in humaneval.problems().values()]
    assert len(problems) == 164
    assert overlaps(pool, problems + list(chat.HELDOUT)) == []
    # the check bites: statistics.covariance's docstring shares "1 2 3 4 5 6 7 8" with HumanEval
    assert "1 2 3 4 5 6 7 8" in {g for _, g in overlaps(left_out(monkeypatch)["statistics.covariance"], problems)}


def test_no_pool_prompt_shares_an_8_gram_with_real_mbpp_gsm8k_and_math500_rows(monkeypatch):
    pool = code_pool.training_prompts(code_pool.pool_size())
    texts = mbpp_texts(MBPP_ROWS) + GSM8K_ROWS + MATH500_ROWS
    assert overlaps(pool, texts) == []
    # the check bites: the objects left out by construction would have overlapped these rows
    out = left_out(monkeypatch)
    assert {g for _, g in overlaps(out["heapq.merge"], texts)} == {"merge multiple sorted inputs into a single sorted"}
    assert "1 2 3 4 5 6 7 8" in {g for _, g in overlaps(out["statistics.covariance"], texts)}


def test_no_object_is_named_as_a_humaneval_or_mbpp_entry_point():
    names = used_names()
    assert len(names) > 1000 and "dedent" in names
    assert names & {p["entry_point"] for p in humaneval.problems().values()} == set()
    assert names & mbpp_names(MBPP_ROWS) == set() and "merge_sorted_list" in mbpp_names(MBPP_ROWS)
    assert "merge" not in names and "median" not in names  # heapq.merge (MBPP 108), statistics.median (HumanEval)


def test_the_trainer_selects_the_code_pool_and_refuses_too_many(capsys, tmp_path):
    from relaxspec.cli import main
    from relaxspec.training.mtp import training_prompts

    assert set(training_prompts(["code"], 20)) == set(code_pool.training_prompts(20))
    n = code_pool.pool_size() + 1
    assert main(["drafter", "train", "--task", "code", "--n", str(n), "--out", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err == (f"relaxspec: error: code training prompts: n must be in 1..{n - 1} (the pool's "
                                       f"size), got {n}\n")


# ------------------------------------------------------------------ the full fetched sets (opt in: -m task_data)


@pytest.mark.task_data
def test_no_pool_prompt_shares_an_8_gram_with_the_full_mbpp_gsm8k_and_math500_sets():
    for name in ("mbpp", "gsm8k", "math500"):
        if not fetched.is_fetched(name):
            pytest.fail(f"run `relaxspec tasks fetch {name}` first (this test checks the real files)")
    mbpp = [r for _, r in fetched.rows("mbpp")]
    texts = (mbpp_texts(mbpp) + [r["question"] for _, r in fetched.rows("gsm8k")]
             + [r["problem"] for _, r in fetched.rows("math500")])
    assert len(texts) == 500 + 1319 + 500
    assert overlaps(code_pool.training_prompts(code_pool.pool_size()), texts) == []
    assert used_names() & mbpp_names(mbpp) == set()

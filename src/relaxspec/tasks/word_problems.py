"""GSM8K-style word problems generated offline: training problems for PAD's labeller on a chat pair.

Eight kinds of two- to four-step grade-school problems (shopping and change, wages and savings, "k times as many",
discounts, sharing, distance, weekly totals, fractions of a group), names, items and numbers drawn at random; every
answer is a whole number. Asked as the gsm8k benchmark asks (its prompt template, `benchmarks.REASON_BOXED`:
reason step by step, answer in \\boxed{}) and scored by its utility (`answers.gsm8k_utility`), so a verifier is
labelled on the format it is evaluated on; each example also carries a worked solution ending `#### N` (GSM8K's own
format). Splits by a hash of the prompt, as the synthetic tasks (`base.split_of`); none of these texts is a GSM8K,
MBPP, HumanEval or MATH-500 problem (tests/tasks/test_word_problems.py checks the fetched sets where present).
"""

from __future__ import annotations

import random

from relaxspec.tasks.answers import gsm8k_utility
from relaxspec.tasks.base import Example, Task, split_examples
from relaxspec.tasks.benchmarks import REASON_BOXED, render

NAME = "word-problems"
NAMES = ["Mia", "Liam", "Ava", "Noah", "Emma", "Omar", "Zoe", "Ravi", "Lena", "Kofi", "Yuki", "Iris", "Diego",
         "Nora", "Sam", "Priya", "Theo", "Maya", "Ezra", "Chloe", "Ivan", "Aisha", "Leo", "Hana", "Tariq", "Greta"]
GOODS = [("notebook", "notebooks"), ("pen", "pens"), ("sandwich", "sandwiches"), ("ticket", "tickets"),
         ("plant", "plants"), ("mug", "mugs"), ("scarf", "scarves"), ("puzzle", "puzzles"), ("candle", "candles")]
THINGS = ["stickers", "marbles", "stamps", "shells", "trading cards", "beads", "coins", "postcards"]


def _shopping(rng: random.Random, n: str) -> tuple[str, list[str], int]:
    (g1, g1s), (g2, g2s) = rng.sample(GOODS, 2)
    a, b, p, q = rng.randint(2, 6), rng.randint(2, 5), rng.randint(2, 12), rng.randint(3, 15)
    cost = a * p + b * q
    bill = next(v for v in (20, 50, 100, 200) if v >= cost)
    text = (f"{n} buys {a} {g1s} for ${p} each and {b} {g2s} for ${q} each. {n} pays with a ${bill} bill. "
            "How much change, in dollars, does " + n + " get back?")
    steps = [f"The {g1s} cost {a} * {p} = {a * p} dollars.", f"The {g2s} cost {b} * {q} = {b * q} dollars.",
             f"Together they cost {a * p} + {b * q} = {cost} dollars.", f"The change is {bill} - {cost} = {bill - cost}."]
    return text, steps, bill - cost


def _wages(rng, n):
    h, r, d = rng.randint(2, 8), rng.randint(9, 25), rng.randint(3, 6)
    earned = h * r * d
    spend = rng.randint(1, earned // 10) * 5
    text = (f"{n} works {h} hours a day for {d} days and earns ${r} an hour. {n} then spends ${spend} on a "
            f"bicycle. How many dollars does {n} have left?")
    steps = [f"Each day {n} earns {h} * {r} = {h * r} dollars.", f"In {d} days that is {h * r} * {d} = {earned}.",
             f"After the bicycle: {earned} - {spend} = {earned - spend}."]
    return text, steps, earned - spend


def _times_as_many(rng, n):
    m1, m2 = rng.sample([x for x in NAMES if x != n], 2)
    thing = rng.choice(THINGS)
    a, k = rng.randint(12, 60), rng.randint(2, 4)
    fewer = rng.randint(3, a * k - 1)
    b, c = a * k, a * k - fewer
    text = (f"{n} has {a} {thing}. {m1} has {k} times as many {thing} as {n}, and {m2} has {fewer} fewer "
            f"{thing} than {m1}. How many {thing} do the three of them have altogether?")
    steps = [f"{m1} has {a} * {k} = {b}.", f"{m2} has {b} - {fewer} = {c}.", f"Altogether {a} + {b} + {c} = {a + b + c}."]
    return text, steps, a + b + c


def _discount(rng, n):
    good, goods = rng.choice(GOODS)
    price, pct, k = rng.randint(2, 15) * 20, rng.choice([10, 15, 20, 25, 30, 40, 50]), rng.randint(2, 5)
    off = price * pct // 100
    text = (f"A {good} costs ${price}. The shop takes {pct}% off the price during a sale. {n} buys {k} {goods} "
            "in the sale. How many dollars does " + n + " pay?")
    steps = [f"The discount is {pct}% of {price} = {off} dollars.", f"Each {good} costs {price} - {off} = {price - off}.",
             f"For {k}: {k} * {price - off} = {k * (price - off)}."]
    return text, steps, k * (price - off)


def _sharing(rng, n):
    friends, each, per_pack = rng.randint(3, 8), rng.randint(3, 12), rng.choice([4, 6, 8, 10, 12])
    total = friends * each
    packs = -(-total // per_pack)
    total = packs * per_pack
    kept = total - friends * each
    text = (f"{n} buys {packs} packs of cookies with {per_pack} cookies in each pack and shares them so that each "
            f"of {friends} friends gets {each} cookies. How many cookies does {n} keep?")
    steps = [f"{packs} packs hold {packs} * {per_pack} = {total} cookies.",
             f"The friends get {friends} * {each} = {friends * each}.", f"{n} keeps {total} - {friends * each} = {kept}."]
    return text, steps, kept


def _distance(rng, n):
    v, t, w, u = rng.randint(30, 70), rng.randint(2, 5), rng.randint(20, 60), rng.randint(1, 4)
    text = (f"{n} drives at {v} miles per hour for {t} hours, then at {w} miles per hour for {u} hours. "
            "How many miles does " + n + " drive in total?")
    steps = [f"First part: {v} * {t} = {v * t} miles.", f"Second part: {w} * {u} = {w * u} miles.",
             f"Total: {v * t} + {w * u} = {v * t + w * u}."]
    return text, steps, v * t + w * u


def _weekly(rng, n):
    p, q, w = rng.randint(5, 30), rng.randint(10, 60), rng.randint(2, 6)
    week = 5 * p + 2 * q
    text = (f"{n} reads {p} pages every weekday and {q} pages on each day of the weekend. How many pages does "
            f"{n} read in {w} weeks?")
    steps = [f"Weekdays: 5 * {p} = {5 * p}.", f"Weekend: 2 * {q} = {2 * q}.", f"One week: {5 * p} + {2 * q} = {week}.",
             f"In {w} weeks: {week} * {w} = {week * w}."]
    return text, steps, week * w


def _fractions(rng, n):
    k, pct = rng.choice([2, 3, 4, 5]), rng.choice([20, 25, 50, 75])
    group = k * 4 * rng.randint(2, 10)
    first = group // k
    rest = group - first
    while rest * pct % 100:
        group += k * 4
        first, rest = group // k, group - group // k
    second = rest * pct // 100
    text = (f"There are {group} students in {n}'s school club. One {['', '', 'half', 'third', 'quarter', 'fifth'][k]} "
            f"of them play chess. Of the others, {pct}% play music. How many students in the club do neither?")
    steps = [f"Chess: {group} / {k} = {first}.", f"The others: {group} - {first} = {rest}.",
             f"Music: {pct}% of {rest} = {second}.", f"Neither: {rest} - {second} = {rest - second}."]
    return text, steps, rest - second


KINDS = (_shopping, _wages, _times_as_many, _discount, _sharing, _distance, _weekly, _fractions)


def make_problem(rng: random.Random) -> Example:
    """One problem: the prompt (the gsm8k template around the question), the answer, a worked solution."""
    text, steps, answer = rng.choice(KINDS)(rng, rng.choice(NAMES))
    return Example(render(REASON_BOXED, text), str(answer), "\n".join(steps) + f"\n#### {answer}")


def examples(split: str, n: int, seed: int = 0) -> list[Example]:
    """n distinct problems whose prompt falls in `split` (train / pivot / test by the prompt's hash)."""
    return split_examples(make_problem, random.Random(f"{NAME}:{split}:{seed}"), split, n)


def word_problems_task(split: str = "pivot", n: int = 100, seed: int = 0) -> Task:
    return Task(name=NAME, examples=examples(split, n, seed), utility=gsm8k_utility, metric="numeric",
                meta={"split": split, "seed": seed})

"""Multi-step arithmetic word problems with worked steps and distractor sentences.

The surface varies (names, items, phrasings, optional words, distractors with
numbers of their own), so many response tokens are free choices while the
digits of each intermediate result are decisive. Step lengths vary with the
numbers, so acceptance cannot line up with a fixed draft length.
"""

from __future__ import annotations

import random

from relaxspec.tasks.base import Example, final_answer, parse_number

NAMES = ["Mia", "Liam", "Ava", "Noah", "Emma", "Omar", "Zoe", "Ravi", "Lena", "Kofi", "Yuki", "Iris",
         "Diego", "Nora", "Sam", "Priya", "Theo", "Maya", "Ezra", "Chloe", "Ivan", "Aisha", "Leo", "Hana"]
ITEMS = ["apples", "marbles", "coins", "stickers", "books", "pencils", "cards", "shells", "stamps",
         "beads", "cookies", "tickets", "bottles", "stones", "buttons", "flowers"]
PLACES = ["the market", "school", "the park", "the library", "the fair", "the beach", "the shop"]

START = ["{n} has {a} {item}.", "{n} owns {a} {item}.", "{n} starts the day with {a} {item}.",
         "At first, {n} has {a} {item}.", "{n} collected {a} {item} last year."]
ADD = ["{pr} buys {b} more at {place}.", "{pr} finds {b} more {item}.", "A friend gives {ob} {b} {item}.",
       "Then {pr} gets {b} more.", "Later {pr} receives {b} extra {item}."]
SUB = ["{pr} gives away {b} {item}.", "{pr} loses {b} of them at {place}.", "Then {pr} sells {b} {item}.",
       "{pr} uses {b} {item} for a project.", "Later {pr} donates {b} of them."]
MUL = ["Then the number of {item} {pr} has doubles.|2", "{pr} ends up with twice as many {item}.|2",
       "Then the pile of {item} triples.|3", "{pr} ends up with three times as many.|3"]
DISTRACT = ["{n} is {d} years old.", "{place_cap} is {d0} meters away.", "It is {d} degrees outside.",
            "{n}'s bag weighs {d0} grams.", "The bus number is {d}.", "{n} slept for {d0} minutes."]
QUESTION = ["How many {item} does {n} have now?", "How many {item} are left with {n}?",
            "What is the number of {item} {n} has at the end?", "How many {item} does {n} have in the end?"]

OPENERS = ["{n} starts with {a}.", "{n} has {a} {item} at first.", "Start with {a}.", "At the start there are {a} {item}."]
STEP_ADD = ["{pr_cap} gets {b} more, so {x} + {b} = {y}.", "Adding {b} gives {x} + {b} = {y}.",
            "Then {x} + {b} = {y}.", "After that, {x} + {b} = {y} {item}."]
STEP_SUB = ["{pr_cap} loses {b}, so {x} - {b} = {y}.", "Taking away {b} gives {x} - {b} = {y}.",
            "Then {x} - {b} = {y}.", "After that, {x} - {b} = {y} {item}."]
STEP_MUL = ["The amount is multiplied by {k}, so {x} * {k} = {y}.", "Then {x} * {k} = {y}.",
            "Multiplying by {k} gives {x} * {k} = {y}."]
CLOSERS = ["The answer is {y}.", "So {n} has {y} {item}. The answer is {y}.", "In the end there are {y}. The answer is {y}."]

PRONOUNS = {"she": ("she", "her"), "he": ("he", "him")}
FEMALE = {"Mia", "Ava", "Emma", "Zoe", "Lena", "Yuki", "Iris", "Nora", "Priya", "Maya", "Chloe", "Aisha", "Hana"}


def make_problem(rng: random.Random) -> Example:
    name = rng.choice(NAMES)
    pr, ob = PRONOUNS["she" if name in FEMALE else "he"]
    item, place = rng.choice(ITEMS), rng.choice(PLACES)
    fill = dict(n=name, pr=pr, pr_cap=pr.capitalize(), ob=ob, item=item, place=place, place_cap=place.capitalize())

    # Small numbers (2-3 digits, a few carries per step) keep the problems within reach of a
    # 2M-parameter verifier trained on 2 CPU cores, while a 0.1M drafter still fumbles the sums.
    value = rng.randint(10, 199)
    question = [rng.choice(START).format(a=value, **fill)]
    steps = [rng.choice(OPENERS).format(a=value, **fill)]
    n_ops = rng.choice([2, 2, 3, 3, 4])
    used_mul = False
    for _ in range(n_ops):
        kind = rng.choice(["add", "add", "sub", "sub", "mul"])
        if kind == "mul" and (used_mul or value > 150):
            kind = "add"
        if kind == "sub" and value < 10:
            kind = "add"
        if kind == "add":
            b = rng.randint(5, 99)
            question.append(rng.choice(ADD).format(b=b, **fill))
            steps.append(rng.choice(STEP_ADD).format(x=value, b=b, y=value + b, **fill))
            value += b
        elif kind == "sub":
            b = rng.randint(1, min(99, value - 1))
            question.append(rng.choice(SUB).format(b=b, **fill))
            steps.append(rng.choice(STEP_SUB).format(x=value, b=b, y=value - b, **fill))
            value -= b
        else:
            sentence, k = rng.choice(MUL).split("|")
            k = int(k)
            used_mul = True
            question.append(sentence.format(**fill))
            steps.append(rng.choice(STEP_MUL).format(x=value, k=k, y=value * k, **fill))
            value *= k
        if rng.random() < 0.35:
            question.insert(rng.randint(1, len(question)), rng.choice(DISTRACT).format(d=rng.randint(2, 99), d0=rng.randint(10, 999), **fill))
    question.append(rng.choice(QUESTION).format(**fill))
    steps.append(rng.choice(CLOSERS).format(y=value, **fill))
    text = " ".join(_cap(s) for s in question)
    return Example(prompt=f"Question: {text}\nAnswer:", reference=str(value), response=" " + " ".join(_cap(s) for s in steps))


def _cap(sentence: str) -> str:
    return sentence[0].upper() + sentence[1:]


def utility(response: str, reference: str) -> float:
    """Numeric exact match on the stated final answer."""
    value = parse_number(final_answer(response))
    return float(value is not None and value == float(reference))

"""Sort a short list of numbers, with the comparison written out.

Checkable answer (the sorted list), variable length (3-5 numbers of 1-3
digits), and free wording around the decisive digits.
"""

from __future__ import annotations

import random
import re

from relaxspec.tasks.base import Example, final_answer

ASK = ["Sort these numbers from smallest to largest: {xs}.", "Put the numbers {xs} in increasing order.",
       "Order from lowest to highest: {xs}.", "Arrange {xs} from smallest to biggest."]
CONTEXT = ["", "", "A teacher wrote numbers on the board. ", "Here is a list from a game. ", "Kim got some scores. "]
OPEN = ["The smallest is {first}.", "First comes {first}.", "{first} is the smallest number."]
NEXT = ["Then {x}.", "Next is {x}.", "After that comes {x}.", "Then {x} follows."]
CLOSE = ["The answer is {ys}.", "So the order is {ys}. The answer is {ys}."]


def make_problem(rng: random.Random) -> Example:
    count = rng.randint(3, 5)
    numbers: list[int] = []
    while len(numbers) < count:
        digits = rng.choice([1, 2, 2, 3, 3])
        x = rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)
        if x not in numbers:
            numbers.append(x)
    ordered = sorted(numbers)
    listed = ", ".join(map(str, numbers))
    prompt = "Question: " + rng.choice(CONTEXT) + rng.choice(ASK).format(xs=listed) + "\nAnswer:"
    steps = [rng.choice(OPEN).format(first=ordered[0])]
    steps += [rng.choice(NEXT).format(x=x) for x in ordered[1:]]
    ys = ", ".join(map(str, ordered))
    steps.append(rng.choice(CLOSE).format(ys=ys))
    return Example(prompt=prompt, reference=ys, response=" " + " ".join(steps))


def _numbers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    return [int(x) for x in re.findall(r"\d+", text)]


def utility(response: str, reference: str) -> float:
    """Exact match of the stated list of numbers with the sorted reference."""
    got = _numbers(final_answer(response))
    return float(got is not None and got == _numbers(reference))

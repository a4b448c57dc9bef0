import pytest

from relaxspec.tasks.answers import (choice_letter, choice_utility, gsm8k_utility, last_boxed, math_equal,
                                     math_utility, normalize_math, to_number)


@pytest.mark.parametrize("text, boxed", [
    (r"so \boxed{42}.", "42"),
    (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # the last one
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"\boxed 7 is it", "7"),
    (r"\fbox{3}", "3"),
    (r"\boxed{5} and a truncated \boxed{\frac{1}{", "5"),  # unbalanced last box: the one before
    ("no box here", None),
])
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


@pytest.mark.parametrize("raw, norm", [
    (r"\dfrac{1}{2}", "1/2"), (r"\tfrac12", "1/2"), (r"\frac{\sqrt{3}}{2}", r"(\sqrt{3})/2"),
    ("12.0", "12"), ("1,000", "1000"), (r"$ 5 $", "5"), (r"\text{(B)}", "(B)"), (r"\textbf{yes}", "yes"),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,(\pi)/2)"), (r"90^\circ", "90"), (r"50\%", "50"), ("x = 3", "3"),
    (r"10\!000", "10000"), ("  7. ", "7"),
])
def test_normalize_math(raw, norm):
    assert normalize_math(raw) == norm


def test_math_utility_right_wrong_malformed():
    assert math_utility(r"Thus the answer is $\boxed{\dfrac{3}{4}}$.", r"\frac{3}{4}") == 1.0
    assert math_utility(r"\boxed{0.75}", r"\frac34") == 1.0  # numbers compare exactly as fractions
    assert math_utility(r"\boxed{\text{Evelyn}}", "Evelyn") == 1.0
    assert math_utility(r"\boxed{204}", "204") == 1.0 and math_utility(r"\boxed{204.0}", "204") == 1.0
    assert math_utility(r"\boxed{205}", "204") == 0.0
    assert math_utility("The answer is 204.", "204") == 0.0  # no box: no answer
    assert math_utility(r"\boxed{", "204") == 0.0  # malformed
    assert math_utility(r"\boxed{1/0}", "1/0") == 1.0 and not math_equal("1/0", "2")  # no crash on x/0
    assert to_number("1/0") is None and to_number("abc") is None and to_number("$1,234") == 1234


def test_gsm8k_utility():
    assert gsm8k_utility("3 * 4 = 12\n#### 12", "12") == 1.0
    assert gsm8k_utility(r"So she pays \boxed{\$1,250}.", "1250") == 1.0
    assert gsm8k_utility(r"\boxed{18} ... 19", "18") == 1.0  # the box wins over the last number
    assert gsm8k_utility("She has 5, then 7 apples. So 7.", "7") == 1.0  # the last number
    assert gsm8k_utility("The total is 7.50 dollars", "7.5") == 1.0
    assert gsm8k_utility("#### 13", "12") == 0.0
    assert gsm8k_utility("I do not know", "12") == 0.0
    assert gsm8k_utility("", "12") == 0.0


def test_choice_letter():
    assert choice_letter("Reasoning about A and B...\nAnswer: C") == "C"
    assert choice_letter("answer: B\nWait, no.\nAnswer: D") == "D"  # the last one
    assert choice_letter("The answer is (B).") == "B"
    assert choice_letter(r"so \boxed{A}") == "A"
    assert choice_letter("Answer: E") is None and choice_letter("I think option A is wrong") is None
    assert choice_utility("Answer: B", "B") == 1.0 and choice_utility("Answer: A", "B") == 0.0
    assert choice_utility("", "B") == 0.0

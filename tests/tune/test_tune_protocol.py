"""The search / confirm protocol (`tune --protocol`, tune/protocol.py) over mixed tasks (`mix:`, tasks/mix.py): the
bands are disjoint, the confirmation band is never read before each run's choice, one test per budget is stated."""

import csv
import math
import platform
import re
from dataclasses import replace

import pytest

from relaxspec import cli
from relaxspec.tasks import get_task, mix, runs_code
from relaxspec.tune import cells as tune_cells
from relaxspec.tune import protocol as proto
from relaxspec.tune import run as tune_run
from relaxspec.tune.space import make_config


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


TINY = proto.Protocol(  # budgets the last rung's 8 samples can show (identical outputs: 0.32)
    "tiny", "a test protocol", None, ("drafter-weak",), (0.7,), (0.35, 0.5),
    "arithmetic[0:10],sorting[0:6]", "arithmetic[10:16],sorting[6:10]", {0.7: 1},
    proto.PROTOCOLS["builtin"].costs, max_new_tokens=48, methods=("strict", "cactus:delta=1", "ensemble:weight=0.8"),
    draft_lengths=(3,), sizes=(4, 8), speed_prompts=2)


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

    assert [(d.drafter, d.temperature, d.budget) for d in decisions] == [("drafter-weak", 0.7, 0.35),
                                                                        ("drafter-weak", 0.7, 0.5)]
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
    assert [float(r["budget"]) for r in rows] == [0.35, 0.5]  # one test per budget
    for r, d in zip(rows, decisions):
        held = r["held"] == "True"
        assert held == (float(r["drop_high"]) <= float(r["budget"])) or d.result.choice.is_strict
        line = proto.format_decision(d)
        assert ("confirmed" in line) and (("NOT confirmed" in line) == (not held))
        assert f"budget {d.budget:g}" in line and f"on {confirm} samples" in line
        assert (tmp_path / "out" / "choices" / f"drafter-weak-T0.7-drop{d.budget:g}.toml").is_file()


def test_the_cli_prints_the_plan_and_refuses_what_the_protocol_fixes(capsys, tmp_path):
    assert cli.main(["tune", "--protocol", "builtin", "--plan", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "search band: 120 problems (arithmetic[0:60],sorting[0:60])" in out
    assert "confirmation band: 80 problems (arithmetic[60:100],sorting[60:100]), never read by the search" in out
    assert "search: rungs of 6, 24, 160 samples a configuration, then 64, 16 configurations on" in out
    for t in ("0", "0.7"):  # one price per arm, then the whole
        assert re.search(rf"drafter-weak, T = {t}: search \d+\.\d h \(\d+ configurations\), confirmation \d+\.\d h "
                         r"\(\d+ cells\), starts \d+\.\d+ h: \d+\.\d h\n", out)
    assert re.search(r"in all: at most \d+\.\d h \(search \d+\.\d h, confirmation \d+\.\d h, starts \d+\.\d h\), less "
                     r"what OUT holds; in 1 part of at most 2.5 h: `relaxspec tune --protocol builtin --hours 2.5`", out)
    assert cli.main(["tune", "--protocol", "builtin", "--hours", "0"]) == 2
    assert "--hours must be a finite number > 0" in capsys.readouterr().err
    assert cli.main(["tune", "--hours", "1"]) == 2
    assert "--hours is for a protocol" in capsys.readouterr().err
    assert cli.main(["tune", "--protocol", "builtin", "--max-drop", "0.1"]) == 2
    assert "the protocol fixes --max-drop" in capsys.readouterr().err
    assert cli.main(["tune", "--protocol", "builtin", "--drafter", "drafter-strong", "--plan"]) == 2
    assert "drafter 'drafter-strong' is not one of its drafters (drafter-weak)" in capsys.readouterr().err
    assert cli.main(["tune", "--protocol", "builtin", "--temperature", "0", "--plan"]) == 0
    assert "temperatures 0;" in capsys.readouterr().out
    assert cli.main(["tune", "--plan"]) == 2


def test_a_protocol_s_parts_share_one_kind_of_machine(tmp_path, capsys):
    """The first part records the machine's kind (architecture, int4 kernel); a part on another kind is refused in
    one line before anything runs, unless --any-machine, which keeps the record."""
    out, kind = tmp_path / "out", proto.machine_kind()
    assert kind.startswith(f"{platform.machine()}, int4 kernel ")
    assert proto.check_machine(out) == kind and (out / "machine.txt").read_text() == kind + "\n"
    assert proto.check_machine(out) == kind  # the same kind goes on
    (out / "machine.txt").write_text("riscv64, int4 kernel none / aten\n")
    recorded = re.escape("begun on a machine of another kind (riscv64, int4 kernel none / aten)")
    with pytest.raises(ValueError, match=recorded) as error:
        proto.check_machine(out)
    assert "\n" not in str(error.value) and kind in str(error.value)
    assert proto.check_machine(out, any_machine=True) == kind
    assert (out / "machine.txt").read_text() == "riscv64, int4 kernel none / aten\n"  # kept as it was
    assert cli.main(["tune", "--protocol", "builtin", "--hours", "0.1", "--out", str(out)]) == 2
    assert "begun on a machine of another kind" in capsys.readouterr().err
    assert not (out / "results.sqlite").exists()  # refused before any cell ran


def test_the_search_price_counts_each_cell_once_and_subtracts_what_is_stored():
    space = [make_config("strict", {}, n) for n in (3, 5)] + \
        [make_config("cactus", {"delta": d}, n) for d in (0.1, 1.0) for n in (3, 5)]
    sizes, caps = (4, 8, 20), (3, 1)  # 6 configurations (2 strict), three rungs
    # one race: all at the first rung, then at most its cap beyond strict at each N (2), and AR at every rung
    assert proto.search_samples(space, 1, sizes, caps) == (6 * 4 + 5 * 4 + 3 * 12, 20)
    # three budgets' races share their cells: the first rung once, later rungs at most 3 x the cap beyond strict
    assert proto.search_samples(space, 3, sizes, caps) == (6 * 4 + 6 * 4 + 5 * 12, 20)
    # at T = 0 AR is the reference: strict goes on only as a race's fallback, one a race
    assert proto.search_samples(space, 1, sizes, caps, references=False) == (6 * 4 + 4 * 4 + 2 * 12, 20)
    # a budget the last rung cannot decide races strict alone: its strict cells through every rung
    assert proto.search_samples(space, 0, sizes, caps, strict_race=True) == (2 * 4 + 2 * 4 + 2 * 12, 20)
    assert proto.search_samples(space, 1, sizes, caps, references=False, strict_race=True) == \
        proto.search_samples(space, 1, sizes, caps)
    assert proto.search_samples(space, 0, sizes, caps) == (0, 0)  # every budget decided
    # stored samples (the j-th a race reads) are subtracted: exactly at the first rung, from the bound after it
    stored = {space[0]: set(range(8)), space[2]: {0, 1, 12}, None: set(range(20))}
    assert proto.search_samples(space, 1, sizes, caps, stored=stored) == ((24 - 4 - 2) + (20 - 4) + (36 - 1), 0)


def test_the_confirmation_price_counts_a_choice_per_budget_and_strict_once_per_n():
    # per budget its choice, strict at its N and the fastest strict; strict cells at most one per N searched
    assert proto.confirmation_cells(2, 0, 5) == (2, 4)
    assert proto.confirmation_cells(2, 0, 3) == (2, 3)
    # at T = 0 AR's cell is the choice's reference: the fastest strict alone
    assert proto.confirmation_cells(2, 0, 5, references=False) == (2, 2)
    # a budget searched with strict alone chooses strict: the fastest strict, no relaxed cell
    assert proto.confirmation_cells(0, 1, 5) == (0, 1)
    assert proto.confirmation_cells(2, 1, 1) == (2, 1)
    assert proto.confirmation_cells(0, 0, 3) == (0, 0)


def test_at_t0_strict_is_served_by_ars_cell_and_at_t07_by_its_own():
    rule, strict = make_config("topk-delta", {"delta": 0.6}, 3), make_config("strict", {}, 3)
    greedy, sampled = tune_run.TuneConfig(temperature=0.0), tune_run.TuneConfig(temperature=0.7)
    assert tune_cells.reference(greedy, rule) is None and tune_cells.arm_cells(greedy, rule) == [rule, None]
    assert tune_cells.reference(sampled, rule) == strict and tune_cells.arm_cells(sampled, rule) == [rule, strict, None]
    assert tune_cells.arm_cells(greedy, strict) == tune_cells.arm_cells(sampled, strict) == [strict, None]
    greedy.objective = sampled.objective = "modelled"  # AR still serves as the reference at T = 0, and only there
    assert tune_cells.arm_cells(greedy, rule) == [rule, None] and tune_cells.arm_cells(sampled, rule) == [rule, strict]
    # what makes it right: strict's greedy tokens are AR's; sampled, they are not (the built-in pair)
    from relaxspec.drafters import load_drafter
    from relaxspec.engine import generate
    from relaxspec.models import load_model

    verifier = load_model("verifier")
    drafter = load_drafter("drafter-weak", verifier)
    prompts = get_task("arithmetic", limit=4).prompts

    def tokens(method, temperature):
        out = generate(verifier, drafter if method != "ar" else None, prompts, method=method, draft_length=3,
                       max_new_tokens=24, temperature=temperature, seed=0)
        return [r.token_ids for r in out.results]
    assert tokens("strict", 0.0) == tokens("ar", 0.0)
    assert tokens("strict", 0.7) != tokens("ar", 0.7)


def test_at_t0_strict_is_held_out_on_its_speed_answers_alone(tmp_path, monkeypatch):
    """A greedy protocol run: strict's held-out cell reads the confirmation band's first STRICT_SPEED_JOBS answers
    (its tokens are AR's), every other held-out cell (AR's, a relaxed choice's) the whole band; sampled, strict reads
    the whole band too (tune.run.confirmation_jobs)."""
    greedy = replace(TINY, name="tiny-greedy", temperatures=(0.0,), heldout_repeats={0.0: 1}, budgets=(0.5,))
    search, confirm = greedy.bands()
    monkeypatch.setattr(tune_run, "STRICT_SPEED_JOBS", 4)
    held = {}
    ensure = tune_cells.Cells.ensure

    def logged_ensure(self, spec, jobs, heldout=False):
        if heldout:
            held.setdefault(spec.method, set()).update(p for p, _ in jobs)
        return ensure(self, spec, jobs, heldout)
    monkeypatch.setattr(tune_cells.Cells, "ensure", logged_ensure)
    (decision,) = proto.run_protocol(greedy, tmp_path / "out", progress=False)
    assert held["strict"] == set(range(search, search + 4))
    assert held["ar"] == set(range(search, search + confirm)) and len(held) >= 2
    assert decision.result.confirmation.choice.config.is_strict or len(held) == 3
    sampled = tune_run.TuneConfig(temperature=0.7, search_prompts=search, heldout_prompts=confirm)
    strict = make_config("strict", {}, 3)
    assert tune_run.confirmation_jobs(sampled, strict) == tune_run.heldout_jobs(search, confirm, 1)


def test_a_part_out_of_time_stops_between_a_cells_calls_keeping_them_and_the_same_call_goes_on(tmp_path,
                                                                                                  monkeypatch):
    """A part whose hours are spent after its first generate call (Pace) stops there with OutOfTime, that call's
    samples stored; the same call again finishes the protocol, deciding as a run never stopped does (its speeds are
    measured anew, so they are not compared)."""
    one = replace(TINY, name="tiny-one", budgets=(0.5,), batch_size=2)  # rung 1: 4 samples a cell, 2 calls
    clock = iter(range(0, 10 ** 7, 7200))  # each look at the part's clock 2 h later: only the first call fits
    monkeypatch.setattr(proto.Pace, "clock", staticmethod(lambda: next(clock)))
    with pytest.raises(proto.OutOfTime, match="every finished generate call is stored"):
        proto.run_protocol(one, tmp_path / "parts", progress=False, hours=1.5)
    store = proto._open_store(tmp_path / "parts")
    stored = store.conn.execute("SELECT COUNT(*) FROM rows").fetchone()[0]
    store.close()
    assert stored == 2  # the first call (2 samples) of the first cell, nothing more
    monkeypatch.undo()
    (resumed,) = proto.run_protocol(one, tmp_path / "parts", progress=False)
    (whole,) = proto.run_protocol(one, tmp_path / "whole", progress=False)
    samples_decide = ("search_choice", "answer", "held", "samples", "drop", "drop_low", "drop_high")  # (not speed)
    assert {k: resumed.row()[k] for k in samples_decide} == {k: whole.row()[k] for k in samples_decide}


def _real_pair(monkeypatch):
    """The qwen-coder protocol with its bands' sizes (500 searched, 400 confirmed) given, no task loaded."""
    monkeypatch.setattr(proto.Protocol, "bands", lambda self: (500, 400))
    return proto.PROTOCOLS["qwen-coder"]


def test_each_arm_searches_what_its_drafter_serves_and_at_t0_only_points_that_can_differ_from_strict(monkeypatch):
    qwen = _real_pair(monkeypatch)
    sizes = {(d, t): len(qwen.space(d, t)) for d, t in qwen.arms()}
    # N = 3: strict + the 64 points of tune's rules (PAD aside: no classifier fits this pair); prompt lookup (one-hot
    # q) cannot serve ensemble, spec-casc-opt nor spec-cont-dec; at T = 0 only the points that can differ from strict
    assert sizes == {("qwen2.5-coder-0.5b", 0.0): 29, ("qwen2.5-coder-0.5b", 0.7): 65, ("ngram", 0.0): 21,
                     ("ngram", 0.7): 48}
    greedy = {c.method for c in qwen.space("ngram", 0.0)}
    assert greedy == {"strict", "topk-delta", "topk-ratio", "spec-casc-tok", "fly", "regret-budget"}
    lm_greedy = qwen.space("qwen2.5-coder-0.5b", 0.0)
    assert {c.method for c in lm_greedy} == greedy | {"ensemble", "spec-casc-opt"}
    assert [c.params_dict for c in lm_greedy if c.method == "spec-casc-opt"] == [{"alpha": 0.0}]  # one for alpha >= 0
    assert qwen.tune_config("ngram", 0.0, 0.03, "x").methods is None  # every rule it serves (tune checks)
    # 0.01 is below what the last rung's 160 samples can show (identical outputs: 0.023): strict searched alone
    assert not qwen.decidable(0.01) and qwen.decidable(0.03)
    assert qwen.tune_config("ngram", 0.7, 0.01, "x").methods == ["strict"]


def test_the_real_pair_plan_prices_each_arm_by_its_cells_and_drafter_and_splits_it_into_parts(monkeypatch):
    """The plan's arithmetic on the real pair, by hand: 4.8 s a batched AR answer (measured on its search band), a
    speculative one 1.37x with the 0.5B (measured) and (3 + 1) / 1.6 = 2.5x with prompt lookup; 0.03 and 0.05 race
    (0.01: strict alone); rungs 8, 32, 160 with caps 2, 1; a held-out cell's batch-1 timing 10 x 41 ms x 210."""
    qwen = _real_pair(monkeypatch)
    sample, timing, start = 4.8, 10 * 0.041 * 210, 3 * 180.0
    ratio = {"qwen2.5-coder-0.5b": 1.37, "ngram": 2.5}
    configs = {("qwen2.5-coder-0.5b", 0.0): 29, ("qwen2.5-coder-0.5b", 0.7): 65, ("ngram", 0.0): 21,
               ("ngram", 0.7): 48}
    arms = proto.price(qwen)
    assert [(a.drafter, a.temperature) for a in arms] == qwen.arms()
    for a in arms:
        # every configuration 8 samples; two races keep at most 2 x 2 + strict on 24 more, 2 x 1 + strict on 128 more
        spec = configs[a.drafter, a.temperature] * 8 + 5 * 24 + 3 * 128
        ar = 160 if a.drafter == "qwen2.5-coder-0.5b" else 0  # AR's cells once a temperature
        assert a.search_s == pytest.approx((spec * ratio[a.drafter] + ar) * sample)
        # two choices on the 400 problems and one strict cell (N = 3 alone; at T = 0 on 80, for its speed), each timed;
        # AR's once a temperature
        strict = 80 if a.temperature == 0 else 400
        assert a.confirm_cells == 3 + (ar > 0)
        assert a.confirm_s == pytest.approx(2 * (400 * ratio[a.drafter] * sample + timing) +
                                            strict * ratio[a.drafter] * sample + timing + (400 * sample if ar else 0))
        assert a.start_s == start and a.parts == math.ceil(a.total_s / 9000)
    plan = proto.format_plan(qwen)
    for a in arms:
        assert (f"{a.drafter}, T = {a.temperature:g}: search {a.search_s / 3600:.1f} h" in plan
                and (f"h in {a.parts} parts" in plan) == (a.parts > 1))
    total = sum(a.total_s for a in arms) / 3600
    assert f"in all: at most {total:.1f} h" in plan and f"in {math.ceil(total / 2.5)} parts of at most 2.5 h" in plan
    assert "0.01: below the bound identical outputs reach on 160 samples (0.023), strict searched alone" in plan


def test_an_arm_runs_in_parts_of_at_most_the_part_hours():
    arm = proto.ArmPrice("d", 0.7, 1, search_s=2 * 3600, confirm_cells=1, confirm_s=0.4 * 3600, start_s=0.1 * 3600)
    assert arm.parts == 1  # 2.5 h: one part
    assert replace(arm, confirm_s=0.4 * 3600 + 1).parts == 2 and replace(arm, search_s=7 * 3600).parts == 3
    with pytest.raises(ValueError, match="hours must be > 0"):
        proto.Pace(TINY, 0)


@pytest.mark.parametrize("name", list(proto.PROTOCOLS))
def test_a_protocols_search_and_confirmation_bands_share_no_problem(name):
    search, confirm = mix.parse(proto.PROTOCOLS[name].task)
    for task, a, b in search:
        for other, c, d in confirm:
            if task == other:  # two slices of one task: one ends before the other starts
                assert (b is not None and b <= (c or 0)) or (d is not None and d <= (a or 0)), (task, a, b, c, d)

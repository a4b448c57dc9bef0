"""`relaxspec report --findings` (study/findings.py; the `paper` preset that runs its grid: bench/test_bench_config.py).

The verdict logic runs on real stores written through the store's API, with cells whose utilities, lengths,
speed-ups and acceptance rates are chosen so that every finding comes out confirmed in one world ("paper") and
not confirmed in the other ("contrary"); the CLI runs on a tiny real bench run."""

import subprocess
import sys
from pathlib import Path

import pytest

from relaxspec.acceptance import RULES
from relaxspec.bench.config import BenchConfig
from relaxspec.study.findings import DEFAULT_MAX_DROP as FINDINGS_MAX_DROP
from relaxspec.study.findings import CONFIRMED, INCONCLUSIVE, NOT_CONFIRMED, check_findings, format_findings
from relaxspec.bench.report import build_rows
from relaxspec.bench.runner import run_grid
from relaxspec.bench.store import Row, Store

N_SAMPLES = 200
STRICT_U = [0.0] * 20 + [1.0] * 180
LOSE_U = [0.0] * 80 + [1.0] * 120  # -0.3 vs strict: beyond a 0.1 budget
SLIGHT_U = [0.0] * 40 + [1.0] * 160  # -0.1 vs strict: its interval straddles -0.1 (undecided)
MTP, STRONG, WEAK = "drafter-mtp", "lm-a", "lm-b"  # strong / weak are told apart by their strict acceptance
TASKS = ("arithmetic", "sorting")
SETTINGS = dict(limit=N_SAMPLES, temperature=0.6, top_k=20, top_p=0.95, max_new_tokens=64, batch_size=200,
                device=None, dtype=None, chat_template="auto", system=None, code_version="test")
# (rule, weaker setting, stronger setting): two q-trusting rules, two verifier-bounded ones.
FAMILIES = [("ensemble", {"weight": 0.95}, {"weight": 0.8}), ("r-fuzzy", {"threshold": 0.05}, {"threshold": 0.3}),
            ("cactus", {"delta": 0.1}, {"delta": 10.0}), ("mentored", {"alpha": 0.3}, {"alpha": 0.95})]
PAD = ("pad", {"threshold": 0.5})


def put(store, drafter, task, method, params, n, utilities, tokens=40, s_len=1.0, acceptance=0.5, c_rel=0.2,
        phase=None):
    """A cell whose length-adjusted speed-up (vs AR's 40 tokens) is s_len at every c_rel (run with `phase`, if given)."""
    config = dict(SETTINGS, verifier="v", verifier_version="1", drafter=drafter, drafter_version="1", task=task,
                  method=method, params=params, draft_length=n, seed=0, **({"phase": phase} if phase else {}))
    plain = s_len * tokens / 40
    metrics = {"n_prompts": len(utilities), "n_samples": len(utilities), "utility": sum(utilities) / len(utilities),
               "utility_ci_low": 0.0, "utility_ci_high": 1.0, "mean_response_length": float(tokens),
               "acceptance_rate": acceptance, "mean_acceptance_length": 2.0, "tokens_per_s": 100.0,
               "c_rel_measured": c_rel, "c_block_measured": 1.0, "modelled_speedup_measured_c_rel": plain,
               "block_aware_speedup_measured": plain, "looks": 1, "first_repeats": 1,
               **{f"modelled_speedup_c{c:g}": plain for c in (0.05, 0.2, 0.5)}}
    base = f"{drafter}|{task}|{method}|{sorted(params.items())}|{n}"
    key = base + (f"|{phase}" if phase else "")
    # per-sample tau that gives the cell's S_len = 40 / (rounds x (1 + N c_rel)), with +-10% noise of its own
    cost, shift = 1 + n * c_rel, 0 if method == "strict" else 1 + sum(map(ord, base)) % 4  # noise unlike strict's
    tau = [tokens * s_len * cost / 40 * (1 + 0.1 * ((3 * i + shift) % 5 - 2) / 2) if n else 1.0
           for i in range(len(utilities))]
    metrics["extra_draft_passes"] = 0
    store.put(key, config, metrics, [Row(i, 0, "p", "1", "r", u, tokens, {"mean_acceptance_length": t},
                                         token_hash="") for i, (u, t) in enumerate(zip(utilities, tau))])


def strict_speed(task: str, n: int, paper: bool) -> float:
    """Strict's S: the best N differs between the tasks in the paper world (finding 6), not in the other."""
    return {("arithmetic", 3): 1.5, ("arithmetic", 5): 2.0, ("sorting", 3): 2.0, ("sorting", 5): 1.5}[
        (task if paper else "arithmetic", n)]


def fill(store, world: str, tasks=TASKS, drafters=(MTP, STRONG, WEAK), mtp_trusting=None, strong_gain=1.2):
    paper = world == "paper"
    agreement = {MTP: 0.5, STRONG: 0.7, WEAK: 0.3}
    c_rel = {MTP: 0.1, STRONG: 0.3, WEAK: 0.2} if paper else {MTP: 0.3, STRONG: 0.1, WEAK: 0.2}
    for task in tasks:
        put(store, None, task, "ar", {}, 0, STRICT_U)
        for d in drafters:
            for n in (3, 5):
                s = strict_speed(task, n, paper)
                put(store, d, task, "strict", {}, n, STRICT_U, s_len=s, acceptance=agreement[d], c_rel=c_rel[d])
                for rule, weak_setting, strong_setting in FAMILIES:
                    for strength, params in ((1, weak_setting), (2, strong_setting)):
                        utilities, tokens, s_len = STRICT_U, 40, s * (1.5 if not paper else 1.0)
                        if paper and RULES[rule].trusts_q and d == MTP and strength == 2 or \
                                paper and rule == "r-fuzzy" and d == MTP:
                            utilities = LOSE_U if mtp_trusting is None else mtp_trusting
                        if paper and RULES[rule].trusts_q and d == WEAK:
                            utilities = LOSE_U  # worse than PAD at a matched speed-up
                        if paper and d == STRONG:
                            s_len = strong_gain * s  # near-lossless relaxed speed-ups
                        if paper and d == WEAK:
                            tokens = 60  # longer responses
                        put(store, d, task, rule, params, n, utilities, tokens, s_len,
                            agreement[d] + 0.1 * strength, c_rel[d])
                if d == WEAK:
                    put(store, d, task, *PAD, n, STRICT_U if paper else LOSE_U, 40, s * (1.0 if paper else 1.5),
                        agreement[d] + 0.2, c_rel[d])


def verdicts(tmp_path, world: str, **kw) -> dict:
    with Store(tmp_path / world) as store:
        fill(store, world, **kw)
        rows = build_rows(store)
        found = check_findings(store, rows, max_drop=0.1)
        text = format_findings(found, rows, 0.1, None)
    assert all(f"({f.key})" in text and f"verdict: {f.verdict.upper()}" in text for f in found)
    return {f.key: f for f in found}


def test_every_finding_is_confirmed_in_the_paper_world(tmp_path):
    found = verdicts(tmp_path, "paper")
    assert {k: f.verdict for k, f in found.items()} == {**{k: CONFIRMED for k in ("1", "2", "3", "4", "5", "6", "PAD")},
                                                         "phase": INCONCLUSIVE}  # no phase-aware cells in this run
    assert "missing cells run with a phase" in found["phase"].reason
    assert "4 of 48 families lose utility from their weakest to their strongest setting" in found["1"].evidence[1]
    assert "drafter-mtp, q-trusting (ensemble, r-fuzzy): 12 of 16 beyond" in "\n".join(found["2"].evidence)
    assert "verifier-bounded (cactus, mentored): 0 of 16 beyond, 16 within" in "\n".join(found["2"].evidence)
    assert "measured c_rel: lm-a 0.300, drafter-mtp 0.100" in found["3"].evidence[0]  # lm-a agrees most: strong
    assert "lm-b: of 32 relaxed cells, 32 significantly longer" in found["4"].evidence[0]


def test_every_finding_is_not_confirmed_in_the_contrary_world(tmp_path):
    found = verdicts(tmp_path, "contrary")
    assert {k: f.verdict for k, f in found.items()} == \
        {**{k: NOT_CONFIRMED for k in ("1", "2", "3", "4", "5", "6", "PAD")}, "phase": INCONCLUSIVE}
    assert "PAD better in 0, worse in 32, equivalent in 0, undecided in 0" in found["PAD"].evidence[0]


@pytest.mark.parametrize("steps_u, verdict", [(STRICT_U, CONFIRMED), ([0.0] * 140 + [1.0] * 60, NOT_CONFIRMED)])
def test_the_phase_finding_pairs_the_phase_group_with_the_plain_one(tmp_path, steps_u, verdict):
    """Two settings groups differing only in `phase`: each relaxed cell run with a phase vs the same rule run
    everywhere at the same acceptance length (put's 2.0)."""
    with Store(tmp_path) as store:
        for phase in (None, "..The answer is"):
            put(store, None, "arithmetic", "ar", {}, 0, STRICT_U, phase=phase)
            put(store, WEAK, "arithmetic", "strict", {}, 3, STRICT_U, phase=phase)
            for params in ({"weight": 0.9}, {"weight": 0.8}):
                put(store, WEAK, "arithmetic", "ensemble", params, 3, steps_u if phase else LOSE_U, phase=phase)
        rows = build_rows(store)
        assert rows[0]["settings"]["phase"] == "..The answer is"  # the latest group: the phase run
        found = {f.key: f for f in check_findings(store, rows, max_drop=0.1)}
        text = format_findings(list(found.values()), rows, 0.1, None)
    assert found["phase"].verdict == verdict
    assert found["phase"].intervals == 2 and found["phase"].confidence == pytest.approx(1 - 0.05 / 2)  # one test
    better = 2 if verdict == CONFIRMED else 0
    assert f"2 matched pairs (phase '..The answer is'): phase better in {better}, worse in {2 - better}" in \
        found["phase"].evidence[0]
    assert "(phase) relaxing only a span (phase-aware) keeps utility closer to strict" in text


def test_undecided_cells_make_a_finding_inconclusive(tmp_path):
    """The MTP drafter's q-trusting cells at -0.1 (their interval straddles the budget): finding 2 could go
    either way."""
    found = verdicts(tmp_path, "paper", mtp_trusting=SLIGHT_U)
    assert found["2"].verdict == INCONCLUSIVE and "undecided cells decide it" in found["2"].reason


def test_missing_evidence_is_inconclusive_and_named(tmp_path):
    found = verdicts(tmp_path, "paper", tasks=("arithmetic",), drafters=(STRONG, WEAK))
    assert found["2"].verdict == INCONCLUSIVE and found["2"].reason == "missing an MTP drafter in this run"
    assert found["3"].reason == "missing an MTP drafter"
    assert found["6"].verdict == INCONCLUSIVE and found["6"].reason == "missing a second task"
    assert found["1"].verdict == INCONCLUSIVE  # no rule's strength moves its utility here, but it could


# ---------------------------------------------------------------- the CLI on a real run


def test_report_findings_cli_on_a_tiny_real_run(tmp_path):
    import torch
    torch.set_num_threads(1)
    config = BenchConfig(drafters=["drafter-mtp", "drafter-strong", "drafter-weak"], tasks=["arithmetic", "sorting"],
                         methods=["ar", "strict", "ensemble:weight=0.8", "cactus:delta=1"], draft_lengths=[2],
                         limit=2, repeats=1, looks=1, speed_prompts=0, max_new_tokens=8, workers=1, out=str(tmp_path))
    run_grid(config, progress=False, log=lambda *a: None)
    with Store.open_existing(tmp_path) as store:  # what the CLI must print: the findings computed here
        expected = {f.key: f for f in check_findings(store, build_rows(store, "latest"), FINDINGS_MAX_DROP, None)}
    assert set(expected) == {"1", "2", "3", "4", "5", "6", "PAD", "phase"}
    src = Path(__file__).resolve().parents[2] / "src"
    out = subprocess.run([sys.executable, "-m", "relaxspec", "report", str(tmp_path), "--findings"],
                         capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(src), "PATH": ""})
    assert out.returncode == 0, out.stderr
    # What this grid decides, known without the findings' code: one setting per rule, one draft length, no PAD cells
    # and no phase leave findings 1, 5, PAD and phase without evidence; the others read intervals of its cells.
    missing = {"1", "5", "PAD", "phase"}
    for key in ("1", "2", "3", "4", "5", "6", "PAD", "phase"):
        block = out.stdout.split(f"({key}) ", 1)[1].split("\n\n", 1)[0]
        assert f"    test: {expected[key].rule}\n" in block + "\n", block  # the finding's own test, printed
        verdict = block.splitlines()[-1]
        if key in missing:
            assert verdict.startswith("    verdict: INCONCLUSIVE: missing "), block
        else:
            assert verdict.startswith("    verdict: ") and ": missing " not in verdict, block
            assert expected[key].intervals > 0 and f": {expected[key].intervals} intervals, each at " in block, block
    assert "Drafters: MTP drafter-mtp; strong LM drafter-" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "relaxspec", "report", str(tmp_path), "--findings", "--c-rel", "0.3"],
                         capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(src), "PATH": ""})
    assert bad.returncode != 0 and bad.stderr.strip() == \
        "relaxspec: error: --c-rel must be one of 0.05, 0.2, 0.5 (the bench's grid), got 0.3"


def test_speed_gains_are_judged_by_intervals_and_each_verdict_states_its_error(tmp_path):
    """Finding 3's bar 1.05 on a gain whose point estimate clears it (1.06) but whose interval (per-sample
    speed-ups +-10%, 200 samples, simultaneous over the finding's intervals) does not: inconclusive, where a
    point comparison would confirm it. Every verdict reads its intervals at 1 - 0.05 / (looks x count)."""
    found = verdicts(tmp_path, "paper", strong_gain=1.06)
    assert found["3"].verdict == INCONCLUSIVE
    assert "holds on 0 of 2 tasks by lower bounds" in found["3"].evidence[-1]
    assert verdicts(tmp_path / "clear", "paper", strong_gain=1.2)["3"].verdict == CONFIRMED
    assert found["phase"].intervals == 0 and found["phase"].reason.startswith("missing")  # no run with a phase here
    for f in found.values():
        if f.key != "phase":
            assert f.intervals > 0 and f.confidence == pytest.approx(1 - 0.05 / f.intervals)  # 1 look
    assert found["2"].intervals == 32  # the MTP drafter's q-trusting and verifier-bounded cells, both tasks

"""The speed constants c_rel and c_block: interleaved step measurements, medians of within-round ratios, and the
CPU-time clock that other processes' load does not inflate."""

import time

import pytest
import torch

from relaxspec.bench.cell import CellSpec, speed_constants
from relaxspec.models import load_model, measure_step_latencies, relative_costs
from relaxspec.models.hf import step_clock


def test_relative_costs_are_medians_of_within_round_ratios():
    times = [[1.0, 2.0, 4.0], [2.0, 4.0, 8.0], [1.0, 10.0, 2.0]]  # round 3: a burst of load on step 1 only
    assert relative_costs(times) == [1.0, 2.0, 4.0]
    assert relative_costs(times, reference=1) == pytest.approx([0.5, 1.0, 2.0])


def test_step_clock_is_thread_cpu_time_with_one_cpu_thread():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        clock = step_clock(torch.device("cpu"))
        assert clock is time.thread_time
        t = clock()
        time.sleep(0.2)  # time not running on the CPU is not counted
        assert clock() - t < 0.05
        torch.set_num_threads(2)
        assert step_clock(torch.device("cpu")) is time.perf_counter
    finally:
        torch.set_num_threads(before)
    assert step_clock(torch.device("cuda")) is time.perf_counter


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    return {"verifier": load_model("verifier"), "drafter-weak": load_model("drafter-weak")}


def test_interleaved_measurement_and_speed_constants(pair):
    v, d = pair["verifier"], pair["drafter-weak"]
    times = measure_step_latencies([(v, 1), (d, 1), (v, 9)], rounds=7)
    assert len(times) == 7 and all(len(t) == 3 and min(t) > 0 for t in times)
    cells = [CellSpec("verifier", "drafter-weak", "arithmetic", "strict", {}, n, 0) for n in (2, 8)]
    cells.append(CellSpec("verifier", None, "arithmetic", "ar", {}, 0, 0))
    got = speed_constants(pair, cells, rounds=9)
    assert set(got) == {("verifier", "drafter-weak", 2), ("verifier", "drafter-weak", 8)}
    a, b = got[("verifier", "drafter-weak", 2)], got[("verifier", "drafter-weak", 8)]
    assert a["c_rel_measured"] == b["c_rel_measured"]  # one measurement, one c_rel for every N
    # The drafter (2 layers x 64) is much cheaper than the verifier (6 x 128) per step; a 9-token block costs
    # more than one token.
    assert 0 < a["c_rel_measured"] < 1 and b["c_block_measured"] > 1
    assert a["latency_verifier_s"] > a["latency_drafter_s"] > 0
    assert speed_constants(pair, cells[-1:]) == {}


def test_a_measurement_stops_at_its_time_bound_after_its_least_rounds(pair):
    v, d = pair["verifier"], pair["drafter-weak"]
    # A bound already passed: the least rounds, all of them whole (every step timed)
    times = measure_step_latencies([(v, 1), (d, 1)], rounds=500, max_seconds=0.0, min_rounds=6)
    assert len(times) == 6 and all(len(t) == 2 and min(t) > 0 for t in times)
    # A bound far away: every round asked for
    assert len(measure_step_latencies([(v, 1), (d, 1)], rounds=8, max_seconds=60.0, min_rounds=2)) == 8


def test_a_protocol_drafter_is_timed_inside_the_interleaved_rounds(pair, monkeypatch):
    from relaxspec.drafters import draft_timer, load_drafter
    import relaxspec.models as models

    v = pair["verifier"]
    drafters = {("verifier", "drafter-mtp"): load_drafter("drafter-mtp", v),
                ("verifier", "ngram"): load_drafter("ngram", v)}
    timer = draft_timer(drafters[("verifier", "ngram")], v)
    clock = step_clock(torch.device("cpu"))
    assert 0 < timer(clock) < 0.1  # seconds per drafted token of prompt lookup: no forward
    seen = []
    real = models.measure_step_latencies

    def spy(steps, **kw):
        seen.append(steps)
        return real(steps, **kw)

    monkeypatch.setattr(models, "measure_step_latencies", spy)
    cells = [CellSpec("verifier", d, "arithmetic", "strict", {}, 3, 0) for d in ("drafter-mtp", "ngram")]
    got = speed_constants({"verifier": v}, cells, rounds=5, drafters=drafters)
    # one interleaved measurement: the verifier's step and block, and both drafters' timers
    assert len(seen) == 1 and len(seen[0]) == 4 and sum(callable(s) for s in seen[0]) == 2
    mtp, ngram = got[("verifier", "drafter-mtp", 3)], got[("verifier", "ngram", 3)]
    assert 0 < ngram["c_rel_measured"] < mtp["c_rel_measured"] < 1  # a one-layer head costs less than the verifier

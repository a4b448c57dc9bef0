import pytest

from conftest import benchmark_module


@pytest.fixture(scope="module")
def real_pair():
    return benchmark_module("real_pair")


def test_real_pair_measures_every_configuration_on_the_builtin_pair(real_pair):
    verifier = real_pair.load_pair_verifier("verifier")
    assert verifier.backend == "fast"  # our engine runs the fast path, HF the same weights as transformers
    result = real_pair.measure(verifier, "drafter-strong", real_pair.chat.HELDOUT[:2], threads=(1,),
                               draft_lengths=(2,), temperatures=(0.0, 0.7), max_new_tokens=8, progress=False)
    assert result["hf_can_assist"]  # an LM drafter: HF runs it as assistant_model
    rows = real_pair.rows(result)
    # per temperature: ours AR, HF AR, ours strict + drafter, ours strict + ngram, HF prompt lookup, HF assisted
    assert len(rows) == 2 * 6
    assert {(r["config"].system, r["config"].method, r["config"].drafter) for r in rows} == {
        ("ours", "ar", ""), ("HF", "ar", ""), ("ours", "strict", "drafter-strong"), ("ours", "strict", "ngram"),
        ("HF", "prompt lookup", "ngram"), ("HF", "assisted", "drafter-strong")}
    for r in rows:
        c = r["config"]
        assert len(result["ms"][c]) == 2  # one run per prompt
        assert 0.1 < r["ms"] < 2000, r  # milliseconds per token of a tiny model
        if (c.system, c.method) == ("ours", "ar"):
            assert r["speedup"] == 1.0
        if c.method == "strict":
            assert 1.0 <= r["tau"] <= c.n + 1
            assert r["c_block"] > 0 and r["modelled"] > 0 and r["vs_hf"] > 0
            assert (r["c_rel"] == 0.0) == (c.drafter == "ngram")
            assert result["stats"][c].sequences == 2
        else:
            assert r["tau"] is None and r["modelled"] is None
    text = real_pair.table(result)
    assert len([line for line in text.splitlines() if line.startswith("| 1 |")]) == len(rows)
    assert "c_block 3 tokens" in text and "cannot run" not in text


def test_an_mtp_drafter_gets_no_hf_assisted_rows(real_pair):
    configs = real_pair.configurations("drafter-mtp", False, [1, 2], [3, 5, 8], [0.0, 0.7])
    assert len(configs) == 2 * 2 * (2 + 3 * 3)
    assert not any(c.method == "assisted" for c in configs)
    assert len(real_pair.configurations("drafter-strong", True, [1], [3], [0.0])) == 6
    assert len(real_pair.configurations("ngram", False, [1], [3], [0.0])) == 4  # no duplicate ngram rows


def test_rows_compute_speedups_and_the_block_aware_model_from_the_medians(real_pair):
    from relaxspec.engine import GenerationStats

    configs = real_pair.configurations("drafter-mtp", False, [2], [3], [0.0])
    ms = {c: [10.0, 20.0, 30.0] for c in configs}  # median 20
    ours_ar, mtp, ngram, hf_pl = (next(c for c in configs if (c.system, c.method, c.drafter) == key) for key in
                                  [("ours", "ar", ""), ("ours", "strict", "drafter-mtp"), ("ours", "strict", "ngram"),
                                   ("HF", "prompt lookup", "ngram")])
    ms[mtp] = [8.0, 12.5, 40.0]  # median 12.5
    ms[hf_pl] = [25.0]
    stats = {c: GenerationStats(draft_length=3, sequences=3, sequence_rounds=10, drafts_accepted=15)
             for c in (mtp, ngram)}  # tau = 2.5
    result = {"configs": configs, "ms": ms, "stats": stats, "hf_can_assist": False, "drafter_kind": "mtp",
              "constants": {2: {"step_ms": 40.0, "c_rel": 0.1, "c_block": {4: 1.2}}}}
    rows = {r["config"]: r for r in real_pair.rows(result)}
    assert rows[ours_ar]["speedup"] == 1.0
    assert rows[mtp]["speedup"] == 20.0 / 12.5 and rows[mtp]["tau"] == 2.5
    assert abs(rows[mtp]["modelled"] - 2.5 / (1.2 + 3 * 0.1)) < 1e-12
    assert abs(rows[ngram]["modelled"] - 2.5 / 1.2) < 1e-12 and rows[ngram]["c_rel"] == 0.0
    assert rows[mtp]["vs_hf"] == 25.0 / 12.5  # no HF assisted with an MTP head: HF prompt lookup at the same N
    text = real_pair.table(result)
    assert "kind 'mtp'" in text and "| 2 | 0 | ours | strict | drafter-mtp | 3 | 12.5 | 1.60 | 2.50 |" in text

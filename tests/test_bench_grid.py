import pytest

from relaxspec.acceptance import RULES
from relaxspec.bench.grid import BenchConfig, default_methods, parse_method, plan
from relaxspec.bench.store import cell_key


def test_default_grid_is_the_paper_grid():
    methods = default_methods()
    assert methods[0] == ("ar", {}) and methods[1] == ("strict", {})
    by_rule = {}
    for name, params in methods:
        by_rule.setdefault(name, []).append(params)
    assert by_rule["typical"] == [{"epsilon": 0.09, "delta": 0.3}]
    assert [p["alpha"] for p in by_rule["spec-casc-tok"]] == [0.0, 0.35, 0.8]
    assert [p["delta"] for p in by_rule["cactus"]] == [0.1, 0.25, 1.0, 10.0]
    assert [p["threshold"] for p in by_rule["pad"]] == [0.3, 0.5, 0.7]
    assert set(by_rule) == {"ar", *RULES}
    config = BenchConfig()
    assert config.draft_lengths == [3, 5] and config.temperature == 0.7 and config.top_p == 0.95
    assert config.tasks == ["arithmetic"]
    cells = plan(config)
    assert cells[0].method == "ar" and sum(c.method == "ar" for c in cells) == 1
    assert len(cells) == 1 + 2 * (len(methods) - 1)


def test_parse_method():
    assert parse_method("cactus:delta=0.5/2") == [("cactus", {"delta": 0.5}), ("cactus", {"delta": 2.0})]
    assert parse_method("typical:epsilon=0.1;delta=0.2/0.4") == [
        ("typical", {"epsilon": 0.1, "delta": 0.2}), ("typical", {"epsilon": 0.1, "delta": 0.4})]
    assert parse_method("ar") == [("ar", {})]
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        parse_method("nope")
    with pytest.raises(ValueError, match="has no parameter 'beta'"):
        parse_method("cactus:beta=1")
    with pytest.raises(ValueError, match="must be numbers"):
        parse_method("cactus:delta=big")


def test_config_from_dict_and_key_stability():
    config = BenchConfig.from_dict({"verifier": "verifier", "draft_length": 4, "methods": ["ar", "strict"],
                                    "limit": 7})
    assert config.verifiers == ["verifier"] and config.draft_lengths == [4] and config.limit == 7
    with pytest.raises(ValueError, match="unknown setting 'colour'"):
        BenchConfig.from_dict({"colour": "red"})
    with pytest.raises(ValueError, match="draft lengths"):
        BenchConfig(draft_lengths=[0]).validate()
    assert cell_key({"a": 1, "b": [1, 2]}) == cell_key({"b": [1, 2], "a": 1})
    assert cell_key({"a": 1}) != cell_key({"a": 2})


def test_merge_stats_recovers_rounds_from_drafts():
    from relaxspec.bench.grid import _merge_stats
    # part 1: 10 rounds of N=2, 12 accepted (pos1 8/10, pos2 4/10); part 2: 5 rounds, 2 accepted (2/5, 0/5)
    parts = [dict(drafts_proposed=20, drafts_accepted=12, acceptance_rate_per_position=[0.8, 0.4], verifier_calls=3,
                  drafter_calls=6, generated_tokens=22, time_draft_s=1.0, time_verify_s=2.0, time_total_s=3.5),
             dict(drafts_proposed=10, drafts_accepted=2, acceptance_rate_per_position=[0.4, 0.0], verifier_calls=2,
                  drafter_calls=4, generated_tokens=7, time_draft_s=0.5, time_verify_s=1.0, time_total_s=1.5)]
    total = _merge_stats(parts, 2)
    assert total["verify_rounds"] == 15 and total["time_total_s"] == 5.0
    assert total["acceptance_rate"] == pytest.approx(14 / 30)
    assert total["mean_acceptance_length"] == pytest.approx((15 + 14) / 15)
    assert total["acceptance_rate_per_position"] == pytest.approx([10 / 15, 4 / 15])
    assert _merge_stats([dict(parts[0], drafts_proposed=0, drafts_accepted=0)], 0)["mean_acceptance_length"] == 1.0


def test_toml_config_and_flag_override(tmp_path):
    import argparse

    from relaxspec.bench.commands import config_from_args, register
    (tmp_path / "b.toml").write_text('tasks = ["sorting"]\nmethods = ["ar", "cactus:delta=0.5"]\nlimit = 9\n'
                                     'draft_lengths = [4]\ntemperature = 0.0\nrepeats = 1\n')
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    args = ap.parse_args(["bench", "--config", str(tmp_path / "b.toml"), "--limit", "3", "--draft-lengths", "2,6"])
    config = config_from_args(args)
    assert config.tasks == ["sorting"] and config.limit == 3 and config.draft_lengths == [2, 6]
    assert config.temperature == 0.0 and config.method_specs() == [("ar", {}), ("cactus", {"delta": 0.5})]
    (tmp_path / "bad.toml").write_text("limit = [\n")
    with pytest.raises(ValueError, match="invalid TOML"):
        config_from_args(ap.parse_args(["bench", "--config", str(tmp_path / "bad.toml")]))

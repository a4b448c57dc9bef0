import pytest

from relaxspec.acceptance import RULES
from relaxspec.acceptance import get_rule
from relaxspec.bench.config import BenchConfig
from relaxspec.bench.methods import default_methods, extra_draft_passes, needs_classifier, parse_method
from relaxspec.bench.runner import plan
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
    assert [p["weight"] for p in by_rule["ensemble"]] == [0.0, 0.8, 0.9, 0.95]  # 0: the always-accept baseline
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


def test_rule_needs_come_from_the_rules_declarations():
    for name in RULES:
        assert extra_draft_passes(name) == get_rule(name).extra_draft_passes
        assert needs_classifier(name) == ("pivot_prob" in get_rule(name).inputs)
    assert extra_draft_passes("ar") == 0 and not needs_classifier("ar")
    assert any(extra_draft_passes(name) for name in RULES) and any(needs_classifier(name) for name in RULES)


def test_repeats_double_per_look_and_settings_are_checked():
    from relaxspec.bench.sampling import samples_at
    assert [len(samples_at(80, 2, k, 10_000, 240)) for k in (1, 2, 3)] == [160, 320, 640]
    for bad, match in [(dict(looks=0), "looks"), (dict(workers=0), "workers"), (dict(max_drop=1.5), "max drop"),
                       (dict(time_budget_s=0), "time budget"), (dict(speed_prompts=-1), "speed prompts"),
                       (dict(heldout_band=-1), "held-out band")]:
        with pytest.raises(ValueError, match=match):
            BenchConfig(**bad).validate()


def test_toml_config_and_flag_override(tmp_path):
    import argparse

    from relaxspec.cli.bench import config_from_args, register
    (tmp_path / "b.toml").write_text('tasks = ["sorting"]\nmethods = ["ar", "cactus:delta=0.5"]\nlimit = 9\n'
                                     'draft_lengths = [4]\ntemperature = 0.0\nrepeats = 1\n')
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    args = ap.parse_args(["bench", "--config", str(tmp_path / "b.toml"), "--limit", "3", "--draft-lengths", "2,6"])
    config = config_from_args(args)
    assert config.tasks == ["sorting"] and config.limit == 3 and config.draft_lengths == [2, 6]
    assert config.temperature == 0.0 and config.method_specs() == [("ar", {}), ("cactus", {"delta": 0.5})]
    paper = config_from_args(ap.parse_args(["bench", "--sampling", "paper", "--top-p", "0.9"]))
    assert (paper.temperature, paper.top_k, paper.top_p) == (0.6, 20, 0.9)  # explicit flags override the preset
    (tmp_path / "p.toml").write_text('sampling = "paper"\ntemperature = 0.5\n')
    from_toml = config_from_args(ap.parse_args(["bench", "--config", str(tmp_path / "p.toml")]))
    assert (from_toml.temperature, from_toml.top_k, from_toml.top_p) == (0.5, 20, 0.95)
    with pytest.raises(ValueError, match="unknown sampling preset 'vllm'"):
        BenchConfig.from_dict({"sampling": "vllm"})
    (tmp_path / "bad.toml").write_text("limit = [\n")
    with pytest.raises(ValueError, match="invalid TOML"):
        config_from_args(ap.parse_args(["bench", "--config", str(tmp_path / "bad.toml")]))

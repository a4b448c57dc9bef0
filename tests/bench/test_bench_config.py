"""The bench's settings (bench/config.py): the `paper` run preset, flags and config keys over it, the first look's
time estimate."""

import argparse

import pytest

from relaxspec.acceptance import RULES
from relaxspec.bench.config import BenchConfig, estimate_minutes
from relaxspec.bench.methods import needs_classifier
from relaxspec.bench.runner import plan
from relaxspec.cli.bench import config_from_args, register
from relaxspec.study.findings import DEFAULT_MAX_DROP as FINDINGS_MAX_DROP


def _parse(argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_the_paper_preset_is_the_grid_the_issue_names():
    config = config_from_args(_parse(["--preset", "paper"]))
    cells = plan(config)
    assert config.drafters == ["drafter-mtp", "drafter-strong", "drafter-weak"]
    assert (config.temperature, config.top_k, config.top_p) == (0.6, 20, 0.95)  # the investigation's sampling
    assert config.max_drop == FINDINGS_MAX_DROP  # later looks serve the findings' budget
    assert (config.limit, config.repeats, config.looks, config.time_budget_s) == (80, 1, 2, 3600.0)
    assert 10 <= estimate_minutes(config, len(cells)) <= 40  # the first look, as measured (21 min under load)
    assert {(c.drafter, c.task, c.draft_length) for c in cells if c.drafter} == \
        {(d, t, n) for d in config.drafters for t in ("arithmetic", "sorting") for n in (3, 5, 10)}
    assert [(c.task, c.method) for c in cells if c.method == "ar"] == [("arithmetic", "ar"), ("sorting", "ar")]
    for d in config.drafters:
        for task in ("arithmetic", "sorting"):
            for n in (3, 5, 10):
                got = {(c.method, tuple(sorted(c.params.items()))) for c in cells
                       if (c.drafter, c.task, c.draft_length) == (d, task, n)}
                want = {("strict", ())}
                for name, rule in RULES.items():
                    if name == "strict":
                        continue
                    if needs_classifier(name):
                        want |= {(name, (("threshold", t),)) for t in config.pad_thresholds}
                    else:
                        grids = {p: s.grid for p, s in rule.params.items() if s.grid}
                        assert len(grids) <= 2
                        import itertools
                        want |= {(name, tuple(sorted(zip(grids, combo)))) for combo in itertools.product(*grids.values())}
                assert got == want
    # 31 settings of the investigation's rules + 12 of the engines' (threshold 2, topk-delta 2, topk-ratio 2, fly 3,
    # regret-budget 3); PAD cells run only where the classifier fits (the runner skips the others)
    assert len(cells) == 2 * (1 + 3 * 3 * 43)
    # A partial run covers every drafter and task at N=3 before any N=5 cell: AR, then N by N.
    order = [(c.draft_length, c.task, c.drafter) for c in cells[2:]]
    assert order == sorted(order, key=lambda o: (o[0], ("arithmetic", "sorting").index(o[1]),
                                                 config.drafters.index(o[2])))
    assert cells[2].method == "strict" and cells[2].draft_length == 3


def test_flags_and_config_keys_override_the_preset(tmp_path):
    config = config_from_args(_parse(["--preset", "paper", "--limit", "5", "--temperature", "0.9",
                                      "--draft-lengths", "3"]))
    assert (config.limit, config.temperature, config.top_k, config.draft_lengths) == (5, 0.9, 20, [3])
    assert config.drafters == ["drafter-mtp", "drafter-strong", "drafter-weak"]
    toml = tmp_path / "b.toml"
    toml.write_text('preset = "paper"\ntasks = ["arithmetic"]\nsampling = "paper"\ntop_k = 5\n')
    config = config_from_args(_parse(["--config", str(toml)]))
    assert (config.tasks, config.top_k, config.draft_lengths) == (["arithmetic"], 5, [3, 5, 10])
    with pytest.raises(ValueError, match="unknown run preset 'nope'"):
        BenchConfig.from_dict({"preset": "nope"})


def test_the_first_look_estimate_counts_compilation_and_says_seconds():
    from relaxspec.bench.config import BenchConfig, estimate_minutes, estimate_text
    eager = BenchConfig(limit=2, speed_prompts=0, workers=1)
    compiled = BenchConfig(limit=2, speed_prompts=0, workers=1, compile=True)
    assert estimate_text(estimate_minutes(eager, 2)) == "about 1 s"  # 2 cells x 2 samples x 0.04 s, rounded up
    assert estimate_minutes(compiled, 2) * 60 >= 42  # a compiled tiny bench took 42 s on a quiet machine
    assert estimate_text(12.4) == "about 12 min"

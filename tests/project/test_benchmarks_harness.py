"""benchmarks/harness, what the benchmark scripts share: the order configurations take turns in and the figure each
keeps, the tables and CSV they print, their options and checks, the clock of a call (no model loaded here: the
scripts' own runs are tests/project/test_benchmarks_run.py's)."""

from __future__ import annotations

import argparse
import csv
import sys
import time

import pytest
import torch

from conftest import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
from harness import llamacpp, options, output, peer, timing  # noqa: E402


def test_interleaved_rotates_the_order_and_keeps_each_prompt_fastest_round():
    calls = []
    seconds = {("a", 0, 0): 0.4, ("a", 0, 1): 0.1, ("b", 0, 0): 0.2, ("b", 0, 1): 0.3,
               ("a", 1, 0): 0.5, ("a", 1, 1): 0.6, ("b", 1, 0): 0.8, ("b", 1, 1): 0.7}

    def run(cfg, i):
        r = sum(1 for c, j in calls if (c, j) == (cfg, i))
        calls.append((cfg, i))
        return [7] * 4 if cfg == "a" else 2, f"{cfg}{i}.{r}", seconds[cfg, i, r]

    ms, outs = timing.interleaved(["a", "b"], 2, run, repeats=2)
    # prompt 0: a b, then b a (one further); prompt 1: b a, then a b
    assert calls == [("a", 0), ("b", 0), ("b", 0), ("a", 0), ("b", 1), ("a", 1), ("a", 1), ("b", 1)]
    assert ms["a"] == pytest.approx([1e3 * 0.1 / 4, 1e3 * 0.5 / 4])  # ms per token, the fastest of the two rounds
    assert ms["b"] == pytest.approx([1e3 * 0.2 / 2, 1e3 * 0.7 / 2])
    assert outs["a"] == [([7] * 4, "a0.0"), ([7] * 4, "a1.0")]  # what the first round gave
    assert timing.rotated([1, 2, 3], 4) == [2, 3, 1]


def test_interleaved_times_the_call_itself_without_its_seconds_and_sets_its_threads():
    class Cfg:
        threads = 1

    previous = torch.get_num_threads()
    seen = []

    def run(cfg, i):
        seen.append(torch.get_num_threads())
        time.sleep(0.02)
        return 0, None, None  # no tokens: per one token

    try:
        torch.set_num_threads(2)
        ms, _ = timing.interleaved([Cfg()], 1, run)
    finally:
        torch.set_num_threads(previous)
    assert seen == [1] and 20 <= next(iter(ms.values()))[0] < 2000


def test_clocked_adds_each_call_time_and_passes_results_and_errors_through():
    total = [0.0]

    class Sleeper:
        def nap(self, seconds):
            time.sleep(seconds)
            if seconds > 0.01:
                raise ValueError("too long")
            return seconds

    Sleeper.nap = timing.clocked(Sleeper.nap, total, clock=time.perf_counter)
    assert Sleeper().nap(0.005) == 0.005
    with pytest.raises(ValueError, match="too long"):
        Sleeper().nap(0.02)
    assert 0.025 <= total[0] < 1.0


def test_tables_notes_and_csv(tmp_path):
    assert output.header("a", "b c") == ["| a | b c |", "|---|---|"]
    assert output.row(1, "-", f"{2.5:.1f}") == "| 1 | - | 2.5 |"
    assert (output.num(None), output.num(0.1234), output.num(0.1234, 3)) == ("-", "0.12", "0.123")
    assert output.with_notes(["| x |"], ["one"]) == "| x |\n\n- one"
    path = tmp_path / "deeper" / "t.csv"
    output.write_csv(path, ("a", "b"), [{"a": 1, "b": None, "extra": 3}])
    assert list(csv.DictReader(path.open())) == [{"a": "1", "b": ""}]
    assert output.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert output.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert output.first_difference([1, 2], [1, 2, 3]) == 2


def test_options_keep_their_types_defaults_and_checks(capsys):
    ap = options.parser("A script.\n\n    python x.py")
    options.add(ap, max_new_tokens=64, temperature=0.7, model="verifier", quick=(False, "a flag"), rounds=(20, "help"))
    options.chat_prompts(ap, 6)
    assert "    python x.py" in ap.format_help() and "held-out chat prompts (at most 20)" in ap.format_help()
    args = ap.parse_args(["--max-new-tokens", "8", "--temperature", "1", "--quick"])
    assert (args.max_new_tokens, args.temperature, args.model, args.quick, args.rounds, args.prompts) == \
        (8, 1.0, "verifier", True, 20, 6)
    assert isinstance(args.temperature, float)
    for check, message in ((lambda: options.within_chat(ap, 21), "--prompts must be between 1 and 20"),
                           (lambda: options.within_chat(ap, 0, "--chat-prompts", low=0), None),
                           (lambda: options.positive(ap, argparse.Namespace(b1_prompts=0, limit=None), "b1_prompts",
                                                     "limit"), "--b1-prompts must be a positive integer")):
        if message is None:
            check()
            continue
        with pytest.raises(SystemExit) as e:
            check()
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_peer_configurations_and_divergence_notes():
    cfgs = peer.ours(["int4"], "ngram", [3], 2)  # the drafter is prompt lookup: no second ngram row
    assert [(c.method, c.drafter, c.n) for c in cfgs] == [("ar", "", 0), ("strict", "ngram", 3)]
    strict = cfgs[1]
    assert strict.ar == cfgs[0] and strict.llamacpp_ar == peer.Config(peer.LLAMACPP, "gguf", "ar", "", 0, 2)
    result = {"configs": cfgs, "ms": {c: [1.0, 2.0] for c in cfgs},
              "divergences": {"int4": [(strict, 1, 5, 0.0123)], "float32": []}}
    assert peer.divergence_notes(result) == [
        "greedy, int4: 1 of 2 strict runs differ from AR (top-2 logit gaps at the first difference: 0.0123)",
        "greedy, float32: 0 of 0 strict runs differ from AR"]


def test_the_speculative_binary_is_found_only_where_it_runs(tmp_path, monkeypatch):
    monkeypatch.delenv(llamacpp.BIN_ENV, raising=False)
    assert llamacpp.spec_binary(None) is None and llamacpp.spec_binary(str(tmp_path)) is None
    binary = tmp_path / llamacpp.SPEC_BINARY
    binary.write_text("#!/bin/sh\n")
    assert llamacpp.spec_binary(str(tmp_path)) is None  # not executable
    binary.chmod(0o755)
    monkeypatch.setenv(llamacpp.BIN_ENV, str(tmp_path))
    assert llamacpp.spec_binary(None) == binary

"""Issue 26's table of unclear errors and silent misbehaviours: its command-line rows, each as a user meets it, through
the CLI's main() (the one-line error path, rc 2). Its API rows are with the tests of their packages
(acceptance/test_acceptance_checks.py, engine/test_engine_checks.py, models/test_models_checks.py,
tune/test_tune_checks.py, bench/test_bench_report.py)."""

import json
import re
from pathlib import Path

import pytest

from relaxspec.acceptance.random import derive_seed
from relaxspec.bench.store import Store
from relaxspec.cli import main
from relaxspec.engine import generate
from relaxspec.tune.run import TuneConfig
from helpers import one_line_error, write_jsonl

PROMPT = "Question: 12 + 7\nAnswer:"


def test_a_huge_draft_length_is_bounded_by_what_can_be_used(capsys):
    assert main(["generate", "--prompt", PROMPT, "--method", "strict", "--drafter", "drafter-weak",
                 "--draft-length", "100000", "--max-new-tokens", "8", "--json"]) == 0
    text = capsys.readouterr().out
    data = json.loads(text)
    assert len(text) < 20_000
    for stats in [data["stats"], *(r["stats"] for r in data["results"])]:
        assert stats["draft_length"] == 8 and len(stats["accepted_per_position"]) == 8


def test_per_result_json_stats_leave_out_the_batch_only_fields(capsys):
    assert main(["generate", "--prompt", PROMPT, "--method", "ar", "--max-new-tokens", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (result,) = data["results"]
    for field in ("verifier_forwards", "drafter_forwards", "time_draft_s", "time_verify_s", "time_total_s"):
        assert field not in result["stats"] and field in data["stats"]
    assert result["stats"]["generated_tokens"] == 4


def test_generate_json_with_show_is_refused(capsys):
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--json", "--show", says="--show")


def test_seeds_beyond_64_bits_are_refused(capsys, tmp_path):
    with pytest.raises(ValueError, match=r"\[0, 2\^64\)"):
        derive_seed(2 ** 64, 0)
    assert derive_seed(2 ** 64 - 1, 0) != derive_seed(0, 0)
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--seed", 2 ** 64, "--method", "ar", says="--seed")
    one_line_error(capsys, "bench", "--tasks", "arithmetic", "--methods", "ar", "--seed", 2 ** 64,
                   "--out", tmp_path / "b", says="seed must be an integer in [0, 2^64)")
    assert not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match=r"tune: seed must be an integer in \[0, 2\^64\)"):
        TuneConfig(seed=2 ** 64).validate()


def test_unknown_jsonl_metric_is_named(capsys, tmp_path):
    data = write_jsonl(tmp_path / "my.jsonl", [{"prompt": "a", "reference": "b"}])
    one_line_error(capsys, "tasks", "show", f"jsonl:{data}:fuzzy",
                   says=["unknown metric 'fuzzy'", "exact, numeric, contains"])


def test_drafter_train_and_pivot_label_check_their_arguments_first(capsys, tmp_path):
    one_line_error(capsys, "drafter", "train", "--task", "arithmetic", "--steps", "0", "--out", tmp_path / "d",
                   says="--steps must be > 0")
    assert not (tmp_path / "d").exists()
    one_line_error(capsys, "drafter", "train", "--task", "arithmetic", "--stop-after", "-1", "--out", tmp_path / "d",
                   says="--stop-after must be >= 0")
    assert not (tmp_path / "d").exists()
    one_line_error(capsys, "pivot", "label", "--out", tmp_path, says="is a directory")
    one_line_error(capsys, "pivot", "label", "--out", tmp_path / "l.json", "--prompts", "0",
                   says="--prompts must be > 0")
    one_line_error(capsys, "pivot", "label", "--out", tmp_path / "no" / "l.json", says="does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("task, says", [("nosuch", "unknown task 'nosuch'"), ("jsonl:EMPTY", "no examples"),
                                        ("jsonl:BAD", "invalid JSON"), ("arithmetic", "must be in [0, inf)")])
def test_bench_checks_tasks_and_methods_before_any_work(capsys, tmp_path, task, says):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"prompt": 1\n')
    task = task.replace("EMPTY", str(tmp_path / "empty.jsonl")).replace("BAD", str(tmp_path / "bad.jsonl"))
    methods = "cactus:delta=-1" if task == "arithmetic" else "ar"
    one_line_error(capsys, "bench", "--tasks", task, "--methods", methods, "--out", tmp_path / "store", says=says)
    assert not (tmp_path / "store").exists()
    assert "bench:" not in capsys.readouterr().out  # no plan printed: nothing started


def test_bench_out_that_is_a_file(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        one_line_error(capsys, "bench", "--tasks", "arithmetic", "--methods", "ar", "--out", out,
                       says=f"{tmp_path / 'file'} is a file, not a directory")


def test_models_path_of_a_builtin_drafter_head(capsys):
    assert main(["models", "path", "drafter-mtp"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.name == "drafter-mtp" and path.is_dir()
    one_line_error(capsys, "models", "path", "nosuch", says=["unknown built-in model 'nosuch'", "drafter-mtp"])


def test_accurate_wording(capsys, tmp_path):
    (tmp_path / "dir").mkdir()
    one_line_error(capsys, "tasks", "show", f"gsm8k:{tmp_path / 'dir'}", says="is a directory")
    with Store(tmp_path / "store"):
        pass
    one_line_error(capsys, "report", tmp_path / "store" / "results.sqlite",
                   says=f"give its directory: {tmp_path / 'store'}")
    (tmp_path / "bad.toml").write_text("verifier = \n")
    one_line_error(capsys, "generate", "--config", tmp_path / "bad.toml", "--prompt", PROMPT,
                   says="generate config")
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "fine"}, {"prompt": "  "}])
    one_line_error(capsys, "generate", "--prompts", prompts, says=f"{prompts}:2: the prompt is empty")


def test_a_truncated_gguf_is_named(capsys, tmp_path):
    from relaxspec.models.gguf import smollm2_gguf_path

    with open(smollm2_gguf_path(), "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(100_000))
    one_line_error(capsys, "generate", "--verifier", tmp_path / "cut.gguf", "--prompt", PROMPT, "--method", "ar",
                   says="the GGUF file is truncated or corrupt")


@pytest.mark.parametrize("flag, value, says", [("--max-new-tokens", "0", "--max-new-tokens must be > 0"),
                                               ("--temperature", "-1", "temperature must be"),
                                               ("--seed", "-1", "--seed must be")])
def test_generate_checks_its_arguments_before_loading_models(capsys, tmp_path, flag, value, says):
    # the verifier does not exist: the argument's error comes first, so nothing was loaded
    one_line_error(capsys, "generate", "--verifier", tmp_path / "missing", "--prompt", PROMPT, flag, value, says=says)


@pytest.mark.parametrize("command", ["bench", "tune"])
@pytest.mark.parametrize("value, says", [("nan", "temperature must be a finite number >= 0, got nan"),
                                         ("inf", "temperature must be a finite number >= 0, got inf"),
                                         ("-0.5", "temperature must be a finite number >= 0, got -0.5")])
def test_bench_and_tune_refuse_a_temperature_that_is_not_finite_and_at_least_0(capsys, tmp_path, command, value,
                                                                              says):
    # the verifier does not exist: the temperature's error comes first (before: each cell failed on it, or the race)
    one_line_error(capsys, command, "--verifier", tmp_path / "missing", "--temperature", value, "--out",
                   tmp_path / "out", says=f"{command}: {says}")


def test_a_prompt_with_a_lone_surrogate_is_named(capsys, tmp_path):
    """Valid JSON, not text: a transformers traceback before."""
    says = "holds a lone surrogate (U+D800 at character 0), which is not text"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": "\\ud800 hi"}\n')
    one_line_error(capsys, "generate", "--prompts", prompts, "--max-new-tokens", "3",
                   says=f"{prompts}:2: the prompt {says}")
    with pytest.raises(ValueError, match=r"^prompt 1 " + re.escape(says)):
        generate("verifier", None, ["fine", "\ud800 hi"], method="ar", max_new_tokens=3)
    with pytest.raises(ValueError, match=r"^prompt 0 \(user turn\) holds a lone surrogate \(U\+DC00 at character 1\)"):
        generate("verifier", None, [[{"role": "user", "content": "a\udc00"}]], method="ar", max_new_tokens=3)



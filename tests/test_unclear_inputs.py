"""Issue 26's table of unclear errors and silent misbehaviours: each row, as a user meets it.

CLI rows go through the CLI's main() (the one-line error path, rc 2); API rows through the function."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from relaxspec.acceptance import process_logits, verify
from relaxspec.acceptance.random import derive_seed
from relaxspec.bench.report import build_rows, format_report
from relaxspec.bench.store import Store
from relaxspec.cli import main
from relaxspec.engine import generate
from relaxspec.models import load_model
from relaxspec.models.prompts import check_context
from relaxspec.tune.run import TuneConfig
from helpers import one_line_error, write_jsonl

PROMPT = "Question: 12 + 7\nAnswer:"


def test_tune_caps_follow_rungs():
    two, one = TuneConfig(sizes=(2, 4)), TuneConfig(sizes=(2,))
    two.validate()
    one.validate()
    assert (two.caps, one.caps) == ((64,), ())
    five = TuneConfig(sizes=(1, 2, 3, 4, 5))
    five.validate()
    assert five.caps == (64, 16, 4, 4)
    explicit = TuneConfig(sizes=(2, 4), caps=(2, 2))
    with pytest.raises(ValueError, match="one positive cap per rung"):
        explicit.validate()  # given caps are still checked, not replaced


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


def test_context_error_offers_nothing_that_does_not_exist():
    with pytest.raises(ValueError) as e:
        check_context([[1] * 600], 10, load_model("verifier"))
    assert "truncat" not in str(e.value) and "shorten it or lower max_new_tokens" in str(e.value)


def test_report_header_gives_the_actual_prompt_count(tmp_path):
    from test_bench_report import put

    with Store(tmp_path) as store:
        put(store, "ar", "ar", [1.0], limit=5)
        put(store, "strict", "strict", [1.0], limit=5)
        rows = build_rows(store)
    header = format_report(rows, max_drop=0.03).splitlines()[0]
    assert ": 1 prompts," in header and "5 prompts" not in header


def test_models_path_of_a_builtin_drafter_head(capsys):
    assert main(["models", "path", "drafter-mtp"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.name == "drafter-mtp" and path.is_dir()
    one_line_error(capsys, "models", "path", "nosuch", says=["unknown built-in model 'nosuch'", "drafter-mtp"])


@pytest.mark.parametrize("bad", ["nan", "negative", "zero"])
def test_verify_refuses_draft_probs_that_are_not_distributions(bad):
    g = torch.Generator().manual_seed(0)
    t, d = torch.randn(2, 3, 5, generator=g), torch.randn(2, 2, 5, generator=g)
    x = torch.randint(0, 5, (2, 2), generator=g)
    q = process_logits(d, temperature=0.7)
    q[0, 1] = {"nan": float("nan"), "negative": -0.1, "zero": 0.0}[bad]
    for temperature in (0.7, 0.0):  # the sampled and the greedy path
        with pytest.raises(ValueError, match="draft_probs must be"):
            verify("strict", t, d, x, draft_probs=q, temperature=temperature)


def test_api_arguments_of_the_wrong_kind():
    out = generate("verifier", None, (p for p in [PROMPT]), method="ar", max_new_tokens=3)  # a name, a generator
    assert len(out.results) == 1 and len(out.results[0].token_ids) == 3
    with pytest.raises(ValueError, match="got bytes"):
        generate("verifier", None, PROMPT.encode(), method="ar", max_new_tokens=3)
    g = torch.Generator().manual_seed(0)
    t, d = torch.randn(1, 3, 5, generator=g), torch.randn(1, 2, 5, generator=g)
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        verify("strict", t, d, torch.zeros(1, 2, dtype=torch.long), temperature=0.7, generator=5)


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


def test_tune_without_a_budget_is_one_line(tmp_path):
    """budget_minutes=None: TypeError: '>' not supported before; no budget is inf minutes (docs/tune.md)."""
    import relaxspec
    with pytest.raises(ValueError, match=r"^tune: budget must be > 0 minutes \(inf: no budget\), got None$"):
        relaxspec.tune(budget_minutes=None, out=str(tmp_path / "t"))
    TuneConfig(budget_minutes=math.inf, out=str(tmp_path / "t")).validate()


@pytest.mark.parametrize("on_meta", ["target_logits", "draft_logits", "draft_tokens", "draft_probs"])
def test_verify_on_meta_tensors_is_one_line(on_meta):
    """RuntimeError: Tensor.item() cannot be called on meta tensors before."""
    g = torch.Generator().manual_seed(0)
    block = {"target_logits": torch.randn(1, 3, 5, generator=g), "draft_logits": torch.randn(1, 2, 5, generator=g),
             "draft_tokens": torch.zeros(1, 2, dtype=torch.long)}
    block["draft_probs"] = process_logits(block["draft_logits"], temperature=0.7)
    every = {name: value.to("meta") for name, value in block.items()}
    for tensors in ({**block, on_meta: block[on_meta].to("meta")}, every):
        with pytest.raises(ValueError, match=r"^\w+ is on the meta device: a shape without values, nothing to "):
            verify("strict", tensors["target_logits"], tensors["draft_logits"], tensors["draft_tokens"],
                   draft_probs=tensors["draft_probs"], temperature=0.7)


@pytest.mark.parametrize("name", [None, 3, "", "  "])
def test_load_model_without_a_name_is_one_line(name):
    with pytest.raises(ValueError, match=r"^load_model needs a model's name or path \(`relaxspec models list` names "):
        load_model(name)

"""Every user-facing error is one clear line and a non-zero exit, never a traceback (issue 12 section 5),
plus the small conveniences that list names: --version, --prompts -, --show with ar, --help defaults."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from relaxspec.cli import main
from relaxspec.models import builtin_path
from relaxspec.pivot import builtin_classifier_path
from helpers import one_line_error, run_cli

PROMPT = "Question: Tom has 12 apples and buys 7 more. How many apples does Tom have?\nAnswer:"


@pytest.fixture
def model_copy(tmp_path):
    """A copy of a built-in model directory, to break."""
    path = tmp_path / "model"
    shutil.copytree(builtin_path("drafter-weak"), path)
    return path


def generate_ar(path, *extra):
    return ("generate", "--verifier", str(path), "--method", "ar", "--prompt", PROMPT, "--max-new-tokens", "4",
            *extra)


def test_broken_model_directories(capsys, model_copy, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(capsys, *generate_ar(empty), says=[str(empty), "has no config.json"])
    one_line_error(capsys, *generate_ar(tmp_path / "absent"), says="neither a built-in model")

    (model_copy / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ')
    one_line_error(capsys, *generate_ar(model_copy), says=["cannot load the tokenizer of model", "model"])
    shutil.copy(builtin_path("drafter-weak") / "tokenizer.json", model_copy / "tokenizer.json")

    (model_copy / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    one_line_error(capsys, *generate_ar(model_copy), says="cannot load model")
    shutil.copy(builtin_path("drafter-weak") / "model.safetensors", model_copy / "model.safetensors")

    (model_copy / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    one_line_error(capsys, *generate_ar(model_copy), says="cannot load model")


def test_bad_prompt_files(capsys, tmp_path):
    one_line_error(capsys, "generate", "--prompts", str(tmp_path), says=[str(tmp_path), "is a directory"])
    bad = tmp_path / "prompts.jsonl"
    bad.write_bytes(json.dumps({"prompt": "fine"}).encode() + b'\n{"prompt": "caf\xe9"}\n')
    one_line_error(capsys, "generate", "--prompts", str(bad), says=f"{bad}:2: not UTF-8 (byte 0xe9")
    one_line_error(capsys, "generate", "--prompts", str(tmp_path / "none.jsonl"), says="none.jsonl")
    one_line_error(capsys, "generate", "--prompt", "  \n ", says="prompt 0 is empty or whitespace only")


def test_pad_classifier_files_and_pairs(capsys, tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file at all")
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--method", "pad", "--param",
                          f"classifier={garbage}", says=f"{garbage} is not a relaxspec pivot classifier")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--method", "pad", "--param",
                          f"classifier={foreign}", says="is not a relaxspec pivot classifier")
    # The shipped classifier was trained for verifier + drafter-weak: none ships for another drafter ...
    pad = ("generate", "--prompt", PROMPT, "--method", "pad", "--drafter", "drafter-strong", "--max-new-tokens", "8")
    one_line_error(capsys, *pad, says=["no pivot classifier ships", "drafter-strong", "relaxspec pivot build",
                                              "--force"])
    # ... and one given for another pair is refused ...
    one_line_error(capsys, *pad, "--param", f"classifier={builtin_classifier_path()}",
                          says=["trained for another pair", "drafter-strong", "--force"])
    # ... unless forced.
    code, out, err = run_cli(capsys, *pad, "--force")
    assert code == 0 and out.strip(), err
    assert builtin_classifier_path().exists()


def test_models_train_needs_out_and_refuses_the_shipped_weights(capsys):
    with pytest.raises(SystemExit) as e:
        main(["models", "train", "--scale", "0.001"])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err
    one_line_error(capsys, "models", "train", "--out", str(builtin_path("verifier").parent),
                          says="shipped weights directory")


def test_show_with_ar_prints_the_text(capsys):
    code, shown, _ = run_cli(capsys, "generate", "--prompt", PROMPT, "--method", "ar", "--max-new-tokens", "12")
    code_show, shown_with_flag, err = run_cli(capsys, "generate", "--prompt", PROMPT, "--method", "ar",
                                              "--max-new-tokens", "12", "--show")
    assert code == code_show == 0 and shown.strip() and shown_with_flag == shown
    assert "legend" not in err


def test_version_stdin_and_help_defaults_in_real_subprocesses(tmp_path):
    from relaxspec import __version__

    run = lambda *args, **kw: subprocess.run([sys.executable, "-m", "relaxspec", *args], capture_output=True,  # noqa: E731
                                             text=True, timeout=300, **kw)
    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"relaxspec {__version__}"
    lines = json.dumps({"prompt": PROMPT}) + "\n"
    piped = run("generate", "--prompts", "-", "--method", "ar", "--max-new-tokens", "6", "--json", input=lines)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["results"][0]["prompt"] == PROMPT
    helped = run("generate", "--help")
    assert helped.returncode == 0
    assert "(default: 128)" in helped.stdout and "(default: strict)" in helped.stdout
    broken = run("generate", "--verifier", str(tmp_path), "--method", "ar", "--prompt", PROMPT)
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert broken.stderr.strip().splitlines() == [f"relaxspec: error: model directory {str(tmp_path)!r} has no "
                                                  "config.json (not a Hugging Face model directory)"]


def test_main_does_not_swallow_import_errors_of_its_own_modules(monkeypatch):
    import relaxspec.cli.pivot

    # As if the module failed to import (e.g. a syntax error or a missing dependency inside it).
    monkeypatch.delattr(relaxspec.cli, "pivot")
    monkeypatch.setitem(sys.modules, "relaxspec.cli.pivot", None)
    with pytest.raises(ImportError):
        main(["methods"])

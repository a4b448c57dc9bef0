"""The command line's rough edges: repeated grid values, values checked before any work, damaged or unwritable
result stores, signals, silent settings and small things (each a one-line message or the documented behaviour)."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import relaxspec
from relaxspec.cli import main

RELAXSPEC = str(Path(sys.executable).with_name("relaxspec"))
TINY = ["--limit", "2", "--max-new-tokens", "4", "--speed-prompts", "0", "--workers", "1", "--looks", "1",
        "--no-plots", "--no-progress"]
PROMPT = "Compute 12 + 7."


def cli(*args, env=None, timeout=120):
    """The installed `relaxspec` in a real subprocess: (exit code, stdout, stderr)."""
    done = subprocess.run([RELAXSPEC, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return done.returncode, done.stdout, done.stderr


def one_line_error(capsys, *args, says):
    """In-process main(): exit 2 and one 'relaxspec: error:' line containing every text of `says`."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's own errors (usage line + error line)
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "error: " in err.splitlines()[-1], err
    for text in [says] if isinstance(says, str) else says:
        assert text in err.splitlines()[-1], err
    return err


# ------------------------------------------------------------------ repeated grid values


def test_a_repeated_grid_value_runs_its_cell_once(tmp_path):
    code, out, err = cli("bench", *TINY, "--methods", "ar,strict,strict", "--draft-lengths", "3,3,auto,auto",
                         "--seed", "1,1", "--tasks", "arithmetic,arithmetic", "--drafter", "drafter-weak,drafter-weak",
                         "--out", tmp_path / "b")
    assert code == 0, err
    assert "bench: 3 cells" in out and "ran 3 cells" in out, out  # ar, strict N=3, strict N=auto
    with sqlite3.connect(tmp_path / "b" / "results.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 3


# ------------------------------------------------------------------ values checked before any work


def test_threads_and_counts_are_checked(capsys, tmp_path):
    for threads in ("-1", "0"):
        one_line_error(capsys, "bench", *TINY, "--threads", threads, "--out", tmp_path / "b",
                       says="--threads must be a positive integer")
    one_line_error(capsys, "tune", "--threads", "0", "--out", tmp_path / "t", says="--threads must be a positive")
    one_line_error(capsys, "models", "list", "--n", "0", says="--n must be > 0")
    for value in ("inf", "0", "nan"):
        one_line_error(capsys, "tune", "--c-block", value, says="expected a finite number > 0 or 'measured'")


@pytest.mark.parametrize("settings, says", [
    ({"budget_minutes": "5"}, "tune: budget minutes must be a number, got '5'"),
    ({"methods": "strict,cactus"}, "tune: methods must be a list of strings"),
    ({"methods": []}, "tune: methods name nothing to search"),
    ({"methods": ["ar"]}, "tune: methods name nothing to search"),
    ({"c_block": float("inf")}, "tune: c-block must be a finite number > 0"),
])
def test_python_tune_settings_of_the_wrong_kind(tmp_path, settings, says):
    with pytest.raises(ValueError) as raised:
        relaxspec.tune(out=str(tmp_path / "t"), plots=False, **settings)
    assert says in str(raised.value)


def test_config_files_of_the_wrong_kind(capsys, tmp_path):
    bench_toml = tmp_path / "bench.toml"
    bench_toml.write_text("methods = 3\n")
    one_line_error(capsys, "bench", "--config", bench_toml, "--out", tmp_path / "b",
                   says="bench: methods must be a list of strings, got [3]")
    gen_toml = tmp_path / "gen.toml"
    gen_toml.write_text("verifier = 7\n")
    one_line_error(capsys, "generate", "--config", gen_toml, "--prompt", PROMPT,
                   says=["gen.toml", "'verifier' must be a string, got 7"])
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes("system = \"caf\xe9\"\n".encode("latin-1"))
    one_line_error(capsys, "bench", "--config", latin1, "--out", tmp_path / "b", says=[str(latin1), "not UTF-8"])
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--method", "topk-delta", "--param", "topk=true",
                   says="parameter 'topk' must be an integer in [0, inf), got True")


def test_an_out_that_is_a_file(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    one_line_error(capsys, "tune", "--out", tmp_path / "file", says="is a file, not a directory")


def test_dtype_messages(capsys, monkeypatch):
    from relaxspec.models.device import resolve_format
    cpu = torch.device("cpu")
    monkeypatch.setenv("RELAXSPEC_DTYPE", "float8")
    with pytest.raises(ValueError, match=r"unknown dtype 'float8' \(from \$RELAXSPEC_DTYPE\); use one of float32, "
                                         "bfloat16, float16, int4, auto"):
        resolve_format(None, cpu)
    monkeypatch.delenv("RELAXSPEC_DTYPE")
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--dtype", "float16", "--device", "cpu",
                   says="--dtype float16 runs on a GPU only; on a CPU use float32, bfloat16, int4 or auto")


def test_tune_takes_device_and_dtype(capsys, tmp_path):
    one_line_error(capsys, "tune", "--dtype", "int4", "--device", "meta", "--out", tmp_path / "t",
                   says="--dtype int4 runs on a CPU only (device 'meta')")

"""bench and tune refuse to score model-written code where the machine allows no isolation: one
line naming --unsafe-exec, before any model loads or any store is created."""

import pytest

from relaxspec.cli import main
from relaxspec.tasks import runs_code, sandbox


@pytest.fixture
def no_isolation(monkeypatch):
    mode = "root" if sandbox.real_root() else "user"
    monkeypatch.setitem(sandbox._REFUSED, mode, "unshare: Operation not permitted")
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)


@pytest.mark.parametrize("command", [["bench", "--tasks", "arithmetic,humaneval", "--methods", "ar"],
                                     ["tune", "--task", "mbpp"],
                                     ["models", "list", "--tasks", "arithmetic", "humaneval"]])
def test_code_tasks_are_refused_without_isolation(no_isolation, tmp_path, capsys, command):
    out = tmp_path / "out"
    assert main([*command] + (["--out", str(out)] if command[0] != "models" else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith("relaxspec: error: this machine allows no isolation") and err.count("\n") == 1, err
    assert "--unsafe-exec" in err and "unshare: Operation not permitted" in err
    assert not out.exists()


def test_unsafe_exec_accepts_the_risk_for_worker_processes_too(no_isolation, monkeypatch):
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "0")  # restored afterwards
    sandbox.require_isolation(unsafe_exec=True)  # what --unsafe-exec does: no error, and the env var set
    assert sandbox.os.environ[sandbox.UNSAFE_ENV] == "1"
    assert sandbox.passes_tests("assert 1 + 1 == 2") == (True, "passed")


def test_runs_code():
    assert [runs_code(s) for s in ("humaneval", "mbpp:f.jsonl", "livecodebench", "gsm8k", "jsonl:x", "arithmetic")] \
        == [True, True, True, False, False, False]

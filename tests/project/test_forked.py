"""tests/forked.py runs a script as `python SCRIPT ARGS` would (and code and modules as -c and -m): its argv, folder
on sys.path, working directory, environment, output, exit handlers and exit code, in a process of its own that leaves
nothing for the next run."""

import os
import subprocess
import sys

import pytest

from forked import Forker

SCRIPT = """
import atexit, json, os, sys
import helper
atexit.register(lambda: print("exit handler ran"))
print(json.dumps({"argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0], "pid": os.getpid(),
                  "env": os.environ.get("FORKED_TEST"), "mark": getattr(json, "forked_mark", None)}))
json.forked_mark = "set by an earlier run"
if sys.argv[1] == "fail":
    raise ValueError("the script failed")
if sys.argv[1] == "wait":
    import time
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def forker():
    with Forker(["json"]) as server:
        yield server


def test_a_script_runs_as_python_runs_it(forker, tmp_path):
    import json

    (tmp_path / "s.py").write_text(SCRIPT)
    (tmp_path / "helper.py").write_text("")  # beside the script: importable as from its own folder
    work = tmp_path / "work"
    work.mkdir()
    runs = [forker.run([tmp_path / "s.py", code], cwd=work, env={"FORKED_TEST": "on"}) for code in ("3", "0")]
    for done, code in zip(runs, (3, 0)):
        assert done.returncode == code, done.stderr
        said = json.loads(done.stdout.splitlines()[0])
        assert said["argv"] == [str(tmp_path / "s.py"), str(code)] and said["name"] == "__main__"
        assert said["cwd"] == str(work) and said["path0"] == str(tmp_path) and said["env"] == "on"
        assert said["mark"] is None  # what a run set is gone: each child starts from the server's imports
        assert said["pid"] not in (os.getpid(), forker.server.pid)
        assert done.stdout.splitlines()[-1] == "exit handler ran"
    real = subprocess.run([sys.executable, tmp_path / "s.py", "3"], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "FORKED_TEST": "on"})
    assert (real.returncode, json.loads(real.stdout.splitlines()[0])["path0"]) == (3, str(tmp_path))


def test_code_and_a_module_run_as_with_c_and_m(forker, tmp_path):
    import json

    (tmp_path / "mod.py").write_text(SCRIPT)
    (tmp_path / "helper.py").write_text("")
    code = ("import json, os, sys; print(json.dumps([sys.argv, __name__, sys.path[0], os.getcwd(), "
            "os.environ.get('FORKED_TEST')])); sys.exit(4)")
    done = forker.run(["-c", code, "a", "b"], cwd=tmp_path, env={"FORKED_TEST": "c"})
    assert done.returncode == 4, done.stderr
    assert json.loads(done.stdout) == [["-c", "a", "b"], "__main__", "", str(tmp_path), "c"]
    module = forker.run(["-m", "mod", "5"], cwd=tmp_path)  # (found in the working directory, as -m does)
    said = json.loads(module.stdout.splitlines()[0])
    assert module.returncode == 5 and said["argv"] == [str(tmp_path / "mod.py"), "5"] and said["name"] == "__main__"


def test_a_failing_script_fails_and_a_hung_one_times_out(forker, tmp_path):
    (tmp_path / "s.py").write_text(SCRIPT)
    (tmp_path / "helper.py").write_text("")
    failed = forker.run([tmp_path / "s.py", "fail"], cwd=tmp_path)
    assert failed.returncode == 1 and "ValueError: the script failed" in failed.stderr
    assert "Traceback" in failed.stderr and failed.stdout.splitlines()[-1] == "exit handler ran"
    with pytest.raises(subprocess.TimeoutExpired):
        forker.run([tmp_path / "s.py", "wait"], cwd=tmp_path, timeout=1)
    assert forker.run([tmp_path / "s.py", "0"], cwd=tmp_path).returncode == 0  # the server goes on

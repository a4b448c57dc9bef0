"""Python scripts, modules and code run as `python SCRIPT ARGS...`, `python -m MODULE ARGS...` and `python -c CODE
ARGS...` run them, each in a process of its own, without each paying the interpreter's start and the imports of
torch and transformers (~3 s a run on a 2-core machine).

A server process (this file run as a script) imports the given modules once, then forks a child per run: the child
takes the run's argv, working directory, environment additions and output files, puts the script's folder (for -m,
the working directory; for -c, '') first on sys.path, runs the script, module or code as `__main__`, runs the exit
handlers it registered and exits with its exit code (SystemExit's, or 1 after the traceback of an uncaught
exception, as Python does). The children share nothing but the imported modules, as they were before any run: a run
leaves nothing behind for the next. The server runs no code of the scripts itself and starts no threads. What is
read once at import (OpenMP's settings, the Hugging Face hub's) is read from the server's environment.

    with Forker(["torch", "transformers"], env=...) as forker:
        done = forker.run(["benchmarks/x.py", "--n", "2"], cwd=ROOT, timeout=240)   # a CompletedProcess
        done = forker.run(["-m", "relaxspec", "methods"], cwd=tmp)
        done = forker.run(["-c", "import relaxspec; print(relaxspec.__version__)"], cwd=tmp, env={"X": "1"})
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


class Forker:
    """A server that forks a child per `run` (see the module's docstring); `preload`: the modules it imports once;
    `env`: its environment (default: this process's)."""

    def __init__(self, preload: list[str], env: dict | None = None):
        self.server = subprocess.Popen([sys.executable, __file__, *preload], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        ready = self.server.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"the fork server did not start (it said {ready!r}, exit {self.server.wait()})")

    def run(self, argv: list[str], cwd: str | os.PathLike, env: dict | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
        """`python *argv` (a script's path, -m MODULE or -c CODE, then its arguments) in `cwd`, with `env` added to the
        server's environment: a CompletedProcess (text stdout and stderr); subprocess.TimeoutExpired after `timeout`
        s (the child killed)."""
        with tempfile.TemporaryDirectory(prefix="forked-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            job = {"argv": [str(a) for a in argv], "cwd": str(cwd), "env": env or {}, "stdout": str(out),
                   "stderr": str(err)}
            self.server.stdin.write(json.dumps(job) + "\n")
            self.server.stdin.flush()
            pid = int(json.loads(self._reply(30))["pid"])
            try:
                code = json.loads(self._reply(timeout))["rc"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._reply(30)
                raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text()) from None
            return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())

    def _reply(self, timeout: float) -> str:
        ready, _, _ = select.select([self.server.stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("fork server", timeout)
        line = self.server.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server ended (exit {self.server.wait()})")
        return line

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=60)

    def __enter__(self) -> Forker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _child(job: dict) -> None:
    """Runs in the forked child: the script as `python` would run it, then exits with its code (never returns)."""
    code = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.chdir(job["cwd"])
        os.environ.update(job["env"])
        import atexit
        import runpy
        import traceback
        try:
            if job["argv"][0] == "-m":
                sys.argv = job["argv"][1:]  # (run_module puts the module's file first)
                sys.path[0] = os.getcwd()  # (the server's: this folder)
                runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
            elif job["argv"][0] == "-c":
                import types
                sys.argv = ["-c", *job["argv"][2:]]
                sys.path[0] = ""
                main = sys.modules["__main__"] = types.ModuleType("__main__")
                exec(compile(job["argv"][1], "<string>", "exec"), main.__dict__)
            else:
                sys.argv = list(job["argv"])
                sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
                runpy.run_path(sys.argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as Python reports an uncaught exception
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed or broken stream: nothing left to say
                pass
        os._exit(code)


def serve(preload: list[str]) -> None:
    for name in preload:
        importlib.import_module(name)
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(job)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1:])

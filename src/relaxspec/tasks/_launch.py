"""The sandbox launcher: isolate, limit, drop privileges, then exec the program.

Run by `relaxspec.tasks.sandbox` as a script (`python -I -S _launch.py CONFIG_JSON`) in the new
session the parent created, so nothing runs after fork in the (possibly multi-threaded) parent.
Standard library only.

Isolated modes (the config's "mode"):
  root  (running as root) new mount, network and PID namespaces; the program drops to a random
        unused uid;
  user  (any other user) the same namespaces inside a new user namespace, which the kernel
        grants without privileges where unprivileged user namespaces are enabled; the program
        keeps the caller's uid (mapped to itself), so it holds no capability once it execs.
In both, the launcher forks the program as PID 1 of the new PID namespace (when it ends, the
kernel kills everything it started, whatever its session or environment) and, before exec, makes
every mount read-only, puts a small private tmpfs on /tmp, /var/tmp and /dev/shm, hides the home
directories and /run (services' sockets) under an empty tmpfs, binds the interpreter's trees (the
virtual environment and its base installation) back read-only wherever they lie (under a home,
/tmp, /var/tmp or /dev/shm included: only those trees, nothing else of the directory around
them), makes the working directory /tmp/relaxspec-sandbox on the private /tmp (so it shares that
tmpfs's size cap, and its ".." is the private /tmp) with a copy of the program file, bound
read-only onto itself (so it cannot be changed or deleted), and mounts a /proc of its own.
Mounts copied into a namespace the program might create itself are locked by the kernel, so
it cannot unmount or make writable what hides or protects the host.

Mode "none" (only when the caller accepted the risk): no namespace, the caller's uid, the caller's
working directory; the launcher is a child subreaper, and once the program ends it kills every
process left below it (one that started a new session with an empty environment included).

The launcher writes JSON lines to `status_fd`: {"pid1": N} (the program's pid outside, as soon
as it is forked), what isolation the program got, or {"error": "..."} if it could not isolate or
could not start the program, then {"exit": {...}} once the program ended (its signal and CPU
time). The program's interpreter writes {"started": true} there itself before it reads the
program, so a program that never started is told apart from one that failed.
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 12, 1 << 14, 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY = 1
# Hidden under an empty read-only tmpfs besides the homes: /run holds the sockets of services the
# caller may reach (docker, dbus, the session bus): connecting to a socket ignores read-only mounts.
ALWAYS_HIDDEN = ("/run",)
WORKDIR = "/tmp/relaxspec-sandbox"  # the program's working directory, on the private /tmp


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class Refused(Exception):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        raise Refused(f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(libc, source, target: str, fstype, flags: int, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc.mount(enc(source), target.encode(), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def _read_only(libc, path: str, recursive: bool, clear: bool = False) -> None:
    attr = MountAttr(0 if clear else MOUNT_ATTR_RDONLY, MOUNT_ATTR_RDONLY if clear else 0, 0, 0)
    _check(libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(),
                        ctypes.c_uint(AT_RECURSIVE if recursive else 0), ctypes.byref(attr),
                        ctypes.c_size_t(ctypes.sizeof(attr))), f"mount_setattr {path}")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _send(fd: int, message: dict) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def isolate_files(libc, cfg: dict) -> None:
    """In the new mount namespace: everything read-only, private scratch directories, homes and /run
    hidden, the interpreter's trees bound back read-only, the working directory on the private /tmp
    with a read-only copy of the program, a /proc of the new PID namespace."""
    name = cfg["argv"][-1]
    with open(name, "rb") as f:  # the caller's copy, read before /tmp (where it may lie) is covered
        source = f.read()
    hide = [h for h in [*cfg["hide"], *ALWAYS_HIDDEN] if os.path.isdir(h) and h != "/"]
    private = cfg["private"]  # the world-writable places a program could otherwise write to
    covered = [*private, *hide]
    keep = []  # the interpreter's trees that a tmpfs below would cover, outermost first
    for path in sorted(p for p in cfg["keep"] if os.path.isdir(p) and any(_under(p, c) for c in covered)):
        if _under(path, WORKDIR) or _under(WORKDIR, path):
            raise Refused(f"the interpreter's tree {path} overlaps the sandbox's working directory {WORKDIR}")
        if not any(_under(path, k) for k, _ in keep):
            keep.append((path, os.open(path, os.O_PATH | os.O_DIRECTORY)))
    os.umask(0o022)  # the directories made below on the tmpfs: searchable by the program's uid
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    _read_only(libc, "/", recursive=True)
    options = f"size={cfg['tmpfs_mb']}m,mode=1777"
    for path in private:
        if os.path.isdir(path):
            _mount(libc, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)
    hidden = []
    for home in hide:  # sorted: a home inside one hidden already (or inside the private /tmp) is gone
        if os.path.isdir(home):
            _mount(libc, "tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
            hidden.append(home)
    for path, fd in keep:  # only the tree itself, not what lies next to it
        os.makedirs(path, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
        _read_only(libc, path, recursive=True)
    for home in hidden:
        _read_only(libc, home, recursive=True)
    os.makedirs(WORKDIR)
    if cfg["mode"] == "root":
        os.chown(WORKDIR, cfg["uid"], cfg["uid"])
    os.chdir(WORKDIR)
    with open(name, "wb") as f:
        f.write(source)
    os.chmod(name, 0o444)
    program = os.path.join(WORKDIR, name)  # read-only, and a mount point cannot be deleted
    _mount(libc, program, program, None, MS_BIND)
    _read_only(libc, program, recursive=False)
    try:  # a /proc showing only the run's processes (a kernel may refuse it: then the host's)
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except Refused:
        pass


def enter_namespaces(libc, mode: str) -> None:
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
    _check(libc.unshare(flags | (CLONE_NEWUSER if mode == "user" else 0)), "unshare")
    if mode == "user":  # the caller's ids, mapped to themselves, never to root inside (root: to nobody)
        inner_uid, inner_gid = uid or 65534, gid or 65534
        for name, text in (("setgroups", "deny"), ("uid_map", f"{inner_uid} {uid} 1"),
                           ("gid_map", f"{inner_gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def program(libc, cfg: dict, status: dict, alive_r: int) -> None:
    """In the forked child (PID 1 of the new namespace when isolated): finish and exec. The status
    descriptor stays open through exec: the interpreter reports there that it started."""
    status_fd = cfg["status_fd"]
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([alive_r], [], [], 0)[0]:  # the launcher died before PDEATHSIG was set
        os._exit(1)
    os.close(alive_r)
    mode = cfg["mode"]
    if mode != "none":
        try:
            isolate_files(libc, cfg)
        except (Refused, OSError) as e:  # e.g. a user namespace granted without mount rights (AppArmor)
            _send(status_fd, {"error": str(e), "refused": True})
            os._exit(1)
        status.update(network="namespace", pid="namespace", files="read-only", tmp="private")
    for name, value in cfg["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if mode == "root":
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    status["uid"] = os.getuid()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _send(status_fd, status)
    try:
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except OSError as e:  # e.g. the interpreter out of sight: an error of the sandbox, not of the program
        _send(status_fd, {"error": f"cannot start {cfg['argv'][0]} in the sandbox: {type(e).__name__}: "
                                   f"{e.strerror or e}"})
    os._exit(127)


def _children(parent: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == parent:
                        found.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def sweep() -> None:
    """As a child subreaper: SIGKILL every process left below the launcher (each one's children come
    to it when it dies) and reap them, until it has no child."""
    me = os.getpid()
    while True:
        for pid in _children(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            pass


def main() -> None:
    cfg = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    status_fd = cfg["status_fd"]
    status = {"mode": cfg["mode"], "network": "audit-hook", "pid": "session", "files": "shared", "tmp": "shared"}
    try:
        if cfg["mode"] != "none":
            enter_namespaces(libc, cfg["mode"])
        else:  # unisolated: a process that calls setsid still ends below the launcher
            _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "child subreaper")
    except (Refused, OSError) as e:
        _send(status_fd, {"error": str(e)})
        sys.exit(1)
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        try:
            program(libc, cfg, status, alive_r)
        except (Refused, OSError) as e:
            _send(status_fd, {"error": str(e)})
        os._exit(127)
    os.close(alive_r)
    for fd in cfg["program_fds"]:  # the program's, not the launcher's
        os.close(fd)
    _send(status_fd, {"pid1": pid})
    while True:
        try:
            _, wait_status, usage = os.wait4(pid, 0)
            break
        except InterruptedError:
            continue
    if cfg["mode"] == "none":
        sweep()
    signum = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
    _send(status_fd, {"exit": {"signal": signum, "cpu_s": usage.ru_utime + usage.ru_stime}})
    os._exit(os.waitstatus_to_exitcode(wait_status) if signum is None else 128 + signum)


if __name__ == "__main__":
    main()

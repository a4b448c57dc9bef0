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
every mount read-only except a bind mount of the working directory (seen at /tmp/relaxspec-sandbox,
so that its ".." is the private /tmp, not the directory it lives in), puts a small private tmpfs
on /tmp, /var/tmp and /dev/shm, hides the home directories and /run (services' sockets) under an
empty tmpfs (only the interpreter's installation is bound back, read-only), bind-mounts the program file
read-only onto itself (so it cannot be changed or deleted) and mounts a /proc of its own.
Mounts copied into a namespace the program might create itself are locked by the kernel, so
it cannot unmount or make writable what hides or protects the host.

Mode "none" (only when the caller accepted the risk): no namespace, the caller's uid.

The launcher writes JSON lines to `status_fd`: {"pid1": N} (the program's pid outside, as soon
as it is forked), then what isolation the program got, or {"error": "..."} if it failed.
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
PR_SET_NO_NEW_PRIVS = 38
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY = 1
# The world-writable places a program could otherwise write to: each gets a private tmpfs.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")
# Hidden under an empty read-only tmpfs besides the homes: /run holds the sockets of services the
# caller may reach (docker, dbus, the session bus): connecting to a socket ignores read-only mounts.
ALWAYS_HIDDEN = ("/run",)
WORKDIR = "/tmp/relaxspec-sandbox"  # where the program sees its working directory


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


def isolate_files(libc, cfg: dict) -> None:
    """In the new mount namespace: everything read-only but the working directory, private
    scratch directories, homes hidden except the interpreter, a /proc of the new PID namespace."""
    work_fd = os.open(".", os.O_PATH | os.O_DIRECTORY)
    hide = [h for h in [*cfg["hide"], *ALWAYS_HIDDEN] if os.path.isdir(h) and h != "/"]
    keep = [p for p in cfg["keep"] if os.path.isdir(p) and any(_under(p, h) for h in hide)]
    keep_fds = [(p, os.open(p, os.O_PATH)) for p in keep]
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing propagates back to the host
    _read_only(libc, "/", recursive=True)
    options = f"size={cfg['tmpfs_mb']}m,mode=1777"
    for path in SHARED_WRITABLE:
        if os.path.isdir(path):
            _mount(libc, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)
    # The working directory, writable, at a fresh place in the private /tmp: its parent ("..") is that
    # tmpfs, not the directory it really lives in (which may hold other files, or lie in a home).
    work = WORKDIR
    os.makedirs(work)
    _mount(libc, f"/proc/self/fd/{work_fd}", work, None, MS_BIND)
    os.close(work_fd)
    _read_only(libc, work, recursive=False, clear=True)
    os.chdir(work)
    program = os.path.join(work, cfg["argv"][-1])  # read-only, and a mount point cannot be deleted
    _mount(libc, program, program, None, MS_BIND)
    _read_only(libc, program, recursive=False)
    for home in hide:
        if os.path.isdir(home):  # not already under a tmpfs mounted above
            _mount(libc, "tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path, fd in keep_fds:
        os.makedirs(path, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    for home in hide:
        if os.path.isdir(home):
            _read_only(libc, home, recursive=True)
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
    """In the forked child (PID 1 of the new namespace when isolated): finish and exec."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([alive_r], [], [], 0)[0]:  # the launcher died before PDEATHSIG was set
        os._exit(1)
    mode = cfg["mode"]
    if mode != "none":
        try:
            isolate_files(libc, cfg)
        except (Refused, OSError) as e:  # e.g. a user namespace granted without mount rights (AppArmor)
            os.write(cfg["status_fd"], (json.dumps({"error": str(e), "refused": True}) + "\n").encode())
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
    os.write(cfg["status_fd"], (json.dumps(status) + "\n").encode())
    os.close(cfg["status_fd"])
    os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])


def main() -> None:
    cfg = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    status_fd = cfg["status_fd"]
    status = {"mode": cfg["mode"], "network": "audit-hook", "pid": "session", "files": "shared", "tmp": "shared"}
    try:
        if cfg["mode"] == "root":
            os.chown(".", cfg["uid"], cfg["uid"])
        if cfg["mode"] != "none":
            enter_namespaces(libc, cfg["mode"])
    except (Refused, OSError) as e:
        os.write(status_fd, (json.dumps({"error": str(e)}) + "\n").encode())
        sys.exit(1)
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        try:
            program(libc, cfg, status, alive_r)
        except (Refused, OSError) as e:
            os.write(status_fd, (json.dumps({"error": str(e)}) + "\n").encode())
        os._exit(1)
    os.write(status_fd, (json.dumps({"pid1": pid}) + "\n").encode())
    os.close(status_fd)
    while True:
        try:
            _, wait_status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(wait_status):
        signal.signal(os.WTERMSIG(wait_status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(wait_status))
    os._exit(os.waitstatus_to_exitcode(wait_status) if os.WIFEXITED(wait_status) else 1)


if __name__ == "__main__":
    main()

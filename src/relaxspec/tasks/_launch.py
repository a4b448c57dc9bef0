"""The sandbox launcher: isolate, limit, drop privileges, then exec the program.

Run by `relaxspec.tasks.sandbox` as a script (`python -I -S _launch.py CONFIG_JSON`) in the new
session the parent created, so nothing runs after fork in the (possibly multi-threaded) parent.
Standard library only. It writes one JSON line to `status_fd` saying which isolation it got,
then replaces itself with the program (execve), so the program keeps its pid and session.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 1 << 14, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
# The world-writable places a program without privileges could still write to.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm")


def private_tmp(libc, size_mb: int) -> bool:
    """Make mounts private to the new mount namespace and hide every world-writable directory
    under a small fresh tmpfs that disappears with the namespace."""
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    options = f"size={size_mb}m,mode=1777".encode()
    return all(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) == 0
               for path in SHARED_WRITABLE if os.path.isdir(path))


def main() -> None:
    cfg = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    uid = cfg["uid"]  # None: stay the calling user (not root)
    status = {"network": "audit-hook", "tmp": "shared", "uid": os.getuid()}
    # As root: new network + mount namespaces. Otherwise: a user namespace makes a network
    # namespace possible where the kernel allows unprivileged user namespaces.
    if libc.unshare(CLONE_NEWNET | (CLONE_NEWNS if uid is not None else CLONE_NEWUSER)) == 0:
        status["network"] = "namespace"
        if uid is not None and private_tmp(libc, cfg["tmpfs_mb"]):
            status["tmp"] = "private"
    for name, value in cfg["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        status["uid"] = uid
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.write(cfg["status_fd"], (json.dumps(status) + "\n").encode())
    os.close(cfg["status_fd"])
    os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])


if __name__ == "__main__":
    main()

"""Landlock (Linux 5.13+): an unprivileged process restricts its own file-system (and, from ABI 4,
TCP) access, without namespaces. The ``process`` isolation uses it so that model-written code reads
only the system directories and the interpreter, and writes only its own directory.

The ruleset is built in the parent (:func:`ruleset`); the child applies it between fork and exec
(:func:`restrict_self`), and it holds across exec and the uid switch, for every descendant.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

_SYSCALLS = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}  # one number on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
READ = EXECUTE | READ_FILE | READ_DIR
_ALL_FS_ABI1 = (1 << 13) - 1  # execute ... make_sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | _TRUNCATE | _IOCTL_DEV  # rights a rule on a file may carry

_libc = None


def _syscall(name: str, *args) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.syscall(_SYSCALLS[name], *args)


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    if platform.system() != "Linux":
        return 0
    try:
        version = _syscall(
            "create_ruleset", None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
        )
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def handled_fs(version: int) -> int:
    """Every file-system right this ABI knows: all of them are denied unless a rule allows them."""
    rights = _ALL_FS_ABI1
    if version >= 2:
        rights |= _REFER
    if version >= 3:
        rights |= _TRUNCATE
    if version >= 5:
        rights |= _IOCTL_DEV
    return rights


def ruleset(version: int, read: list[str], write: list[str]) -> int:
    """A ruleset fd: read (and execute) beneath ``read``, everything beneath ``write``; every other
    path is denied, and from ABI 4 so are TCP bind and connect (no rule allows a port). Paths that
    do not exist are skipped. The caller closes the fd."""
    fs = handled_fs(version)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if version >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if version >= 6 else 0
    if version >= 6:
        attr = struct.pack("QQQ", fs, net, scoped)
    elif version >= 4:
        attr = struct.pack("QQ", fs, net)
    else:
        attr = struct.pack("Q", fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _syscall("create_ruleset", buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset: " + os.strerror(ctypes.get_errno()))
    try:
        for paths, rights in ((read, READ & fs), (write, fs)):
            for path in paths:
                _add_path(fd, path, rights)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _add_path(fd: int, path: str, rights: int) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not os.path.isdir(path):
            rights &= _FILE_ONLY
        rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, target), 12)  # packed: u64, s32
        if (
            _syscall("add_rule", ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH), rule, ctypes.c_uint32(0))
            != 0
        ):
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_add_rule({path}): {os.strerror(err)}")
    finally:
        os.close(target)


def restrict_self(fd: int) -> None:
    """In the child, before exec: no new privileges, then the ruleset. Raises when it fails (the
    child must not run unrestricted)."""
    if _libc is None:
        raise OSError("landlock: the parent never loaded libc")
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if _syscall("restrict_self", ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")

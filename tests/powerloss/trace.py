"""Recording a workload's file-system operations with ``strace`` and parsing them.

The workload runs under ``strace -f -y -xx -s 16M`` (every thread, file descriptors shown
with their paths, every string argument in full as ``\\xNN`` escapes), restricted to the
calls that change files or make them durable. That records eventlane's own writes and
SQLite's (the read models, the key indexes) alike, with no change to the code under test.
Memory-mapped stores (the partitions' ``state`` files, ``.notify``, group liveness words,
SQLite's ``-shm``) are not system calls; the explorer treats their contents as arbitrary.

:func:`parse` turns the trace into :class:`Op` objects for paths under the data directory,
plus ``ack`` operations for writes to the acknowledgement log (their text is the JSON line),
in the order the calls *completed*. Calls that failed are dropped. Anything the file-system
model does not understand on a data path (``sendfile``, ``link``, ``fallocate``...) raises,
so the model can never silently diverge from what ran.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

TRACED = (
    "open,openat,creat,write,pwrite64,writev,pwritev,pwritev2,lseek,ftruncate,truncate,"
    "fsync,fdatasync,sync,syncfs,sync_file_range,msync,rename,renameat,renameat2,unlink,"
    "unlinkat,mkdir,mkdirat,rmdir,link,linkat,symlink,symlinkat,fallocate,copy_file_range,"
    "sendfile,splice,dup,dup2,dup3,close,bind,clone,clone3,fork,vfork"
)


def strace_available() -> bool:
    return shutil.which("strace") is not None


def record(argv: list[str], trace_path: Path, *, env: dict[str, str], timeout: float) -> None:
    """Run ``argv`` under strace, writing the trace to ``trace_path``; raise if it fails."""
    cmd = [
        "strace",
        "-f",
        "-y",
        "-xx",
        "-qq",
        "-s",
        str(1 << 24),
        "-e",
        f"trace={TRACED}",
        "-o",
        str(trace_path),
        *argv,
    ]
    proc = subprocess.run(
        cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"traced workload failed (rc={proc.returncode}): {proc.stderr[-3000:]}")


@dataclass(frozen=True)
class Op:
    """One completed call on a data path, or an acknowledgement.

    ``kind``: ``open`` (path, flags, fd), ``write`` (fd, data, offset or None for the fd's
    position), ``lseek`` (fd, offset, whence), ``truncate`` (path or fd, size), ``fsync``
    (fd), ``rename`` (path → path2), ``unlink``, ``mkdir``, ``rmdir`` (path), ``close`` (fd),
    ``ack`` (text).
    """

    kind: str
    path: str = ""
    path2: str = ""
    fd: int = -1
    data: bytes = b""
    offset: int | None = None
    flags: str = ""
    size: int = 0
    text: str = ""


_LINE = re.compile(r"^(\d+) +(\w+)\((.*)\) += (.*)$")
_UNFINISHED = re.compile(r"^(\d+) +(\w+)\((.*) <unfinished \.\.\.>$")
_RESUMED = re.compile(r"^(\d+) +<\.\.\. (\w+) resumed>(.*)\) += (.*)$")
_FD = re.compile(r"^(-?\d+|AT_FDCWD)(?:<(.*)>)?(?:\(deleted\))?$")
_HEX = re.compile(r"\\x([0-9a-f]{2})")


def _unescape(s: str) -> bytes:
    """``\\x2f\\x74`` → ``b"/t"`` (``-xx`` escapes every byte)."""
    return bytes(int(h, 16) for h in _HEX.findall(s))


def _split(args: str) -> list[str]:
    """Top-level comma-separated arguments (brackets and strings kept whole)."""
    out, depth, cur, quoted = [], 0, [], False
    for ch in args:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "[{":
            depth += 1
        elif not quoted and ch in "]}":
            depth -= 1
        if ch == "," and depth == 0 and not quoted:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur).strip())
    return out


def _string(arg: str) -> bytes:
    if not arg.startswith('"'):
        raise ValueError(f"expected a string argument, got {arg[:80]!r}")
    if arg.endswith("..."):
        raise ValueError("a string argument was truncated; raise strace -s")
    return _unescape(arg)


PER_PROCESS = 1 << 20
"""Descriptors of the n-th process are ``n * PER_PROCESS + fd`` in :class:`Op`."""


def _fd_of(arg: str) -> tuple[int, str]:
    m = _FD.match(arg)
    if m is None:
        raise ValueError(f"expected a file descriptor, got {arg[:80]!r}")
    fd = -100 if m.group(1) == "AT_FDCWD" else int(m.group(1))
    path = _unescape(m.group(2)).decode(errors="surrogateescape") if m.group(2) else ""
    return fd, path


def _at(dirfd_arg: str, path_arg: str) -> str:
    path = _string(path_arg).decode(errors="surrogateescape")
    if path.startswith("/"):
        return path
    _, base = _fd_of(dirfd_arg)
    return str(Path(base) / path)


def _joined(lines: list[str]) -> list[tuple[str, str, str, str]]:
    """(thread id, name, args, result) per completed call, unfinished/resumed pairs
    joined."""
    pending: dict[str, tuple[str, str]] = {}
    calls = []
    for line in lines:
        m = _LINE.match(line)
        if m:
            calls.append((m.group(1), m.group(2), m.group(3), m.group(4)))
            continue
        m = _UNFINISHED.match(line)
        if m:
            pending[m.group(1)] = (m.group(2), m.group(3))
            continue
        m = _RESUMED.match(line)
        if m:
            name, head = pending.pop(m.group(1))
            calls.append((m.group(1), name, head + m.group(3), m.group(4)))
            continue
        # signals, exits, "???" and the like carry no file-system effect
    return calls


def _processes(calls: list[tuple[str, str, str, str]]) -> dict[str, int]:
    """Each thread id's process as a small number (0: the workload's own process; then
    the processes it started, such as the relay, in order of appearance). A child's calls
    may be printed before its parent's ``clone`` returns, hence this pass first."""
    parents: dict[str, tuple[str, bool]] = {}
    for tid, name, args, result in calls:
        if name in ("clone", "clone3", "fork", "vfork") and not result.startswith(("-1", "?")):
            parents[result.split()[0]] = (tid, "CLONE_THREAD" in args)
    numbers: dict[str, int] = {}
    found: dict[str, int] = {}
    for tid, *_ in calls:
        leader = tid
        while leader in parents and parents[leader][1]:
            leader = parents[leader][0]
        found[tid] = numbers.setdefault(leader, len(numbers))
    return found


_SUN_PATH = re.compile(r'sun_path=("[^"]*")')


def parse(trace_path: Path, data: Path, acks: Path) -> list[Op]:
    """The operations on ``data`` (and acknowledgements written to ``acks``), in order."""
    root, ack_path = str(data), str(acks)
    ops: list[Op] = []
    tracked: set[int] = set()  # fds open on data paths (closing others is not interesting)

    def mine(path: str) -> bool:
        return path == root or path.startswith(root + "/")

    text = trace_path.read_text(errors="surrogateescape")
    calls = _joined(text.splitlines())
    process_of = _processes(calls)
    process = 0

    def _fd(arg: str) -> tuple[int, str]:
        # descriptors are per process: another process's are numbered apart (a process
        # started by the workload, the relay, begins with none of this model's files)
        fd, path = _fd_of(arg)
        return (fd if process == 0 or fd < 0 else process * PER_PROCESS + fd), path

    for tid, name, args, result in calls:
        if result.startswith(("-1 ", "?")):
            continue
        a = _split(args)
        process = process_of[tid]

        if name in ("write", "pwrite64", "writev", "pwritev", "pwritev2"):
            fd, path = _fd(a[0])
            if path == ack_path:
                ops.append(Op("ack", text=_string(a[1]).decode()))
                continue
            if not mine(path.removesuffix(" (deleted)")) and fd not in tracked:
                continue
            if name in ("write", "pwrite64"):
                data_ = _string(a[1])
                offset = int(a[3]) if name == "pwrite64" else None
            else:
                data_ = b"".join(_unescape(m) for m in re.findall(r'iov_base="([^"]*)"', a[1]))
                offset = int(a[3]) if name != "writev" else None
            written = int(result.split()[0])
            ops.append(Op("write", path=path, fd=fd, data=data_[:written], offset=offset))
        elif name in ("open", "openat", "creat"):
            path = _string(a[0]).decode() if name != "openat" else _at(a[0], a[1])
            flags = "O_WRONLY|O_CREAT|O_TRUNC" if name == "creat" else a[1 if name == "open" else 2]
            fd, _ = _fd(result.split()[0])
            if mine(path):
                tracked.add(fd)
                ops.append(Op("open", path=path, fd=fd, flags=flags))
            else:
                tracked.discard(fd)
        elif name == "close":
            fd, _ = _fd(a[0])
            if fd in tracked:
                tracked.discard(fd)
                ops.append(Op("close", fd=fd))
        elif name == "lseek":
            fd, path = _fd(a[0])
            if fd in tracked:
                ops.append(Op("lseek", fd=fd, offset=int(result.split()[0])))
        elif name in ("sync_file_range", "msync"):
            continue  # neither flushes the disk's cache nor metadata: not a barrier
        elif name in ("fsync", "fdatasync"):
            fd, path = _fd(a[0])
            if fd in tracked or mine(path.removesuffix(" (deleted)")):
                ops.append(Op("fsync", path=path, fd=fd))
        elif name in ("ftruncate", "truncate"):
            if name == "ftruncate":
                fd, path = _fd(a[0])
                if fd in tracked or mine(path):
                    ops.append(Op("truncate", path=path, fd=fd, size=int(a[1])))
            else:
                path = _string(a[0]).decode()
                if mine(path):
                    ops.append(Op("truncate", path=path, size=int(a[1])))
        elif name in ("rename", "renameat", "renameat2"):
            if name == "rename":
                src, dst = _string(a[0]).decode(), _string(a[1]).decode()
            else:
                src, dst = _at(a[0], a[1]), _at(a[2], a[3])
            if mine(src) or mine(dst):
                if not (mine(src) and mine(dst)):
                    raise ValueError(f"rename across the data directory: {src} -> {dst}")
                ops.append(Op("rename", path=src, path2=dst))
        elif name in ("unlink", "unlinkat", "rmdir"):
            path = _string(a[0]).decode() if name != "unlinkat" else _at(a[0], a[1])
            if mine(path):
                is_dir = name == "rmdir" or (name == "unlinkat" and "AT_REMOVEDIR" in a[2])
                ops.append(Op("rmdir" if is_dir else "unlink", path=path))
        elif name in ("mkdir", "mkdirat"):
            path = _string(a[0]).decode() if name == "mkdir" else _at(a[0], a[1])
            if mine(path):
                ops.append(Op("mkdir", path=path))
        elif name in ("sync", "syncfs"):
            ops.append(Op("fsync", path="*"))
        elif name in ("clone", "clone3", "fork", "vfork"):
            continue  # read by _processes
        elif name == "bind":
            m = _SUN_PATH.search(args)
            path = _string(m.group(1)).decode(errors="surrogateescape") if m else ""
            if mine(path):  # a Unix socket's file (the relay's): an empty file to the model
                fd, _ = _fd(a[0])
                ops.append(Op("open", path=path, fd=fd, flags="O_CREAT"))
                ops.append(Op("close", fd=fd))
        elif name in ("dup", "dup2", "dup3"):
            fd, path = _fd(a[0])
            if fd in tracked:
                raise ValueError(f"{name} of a data file is not modelled: {path}")
        else:  # link, symlink, fallocate, copy_file_range, sendfile, splice
            joined = args
            if root in joined or _hex_path(root) in joined:
                raise ValueError(f"{name} on the data directory is not modelled: {args[:200]}")
    return ops


def _hex_path(path: str) -> str:
    return "".join(f"\\x{b:02x}" for b in path.encode())

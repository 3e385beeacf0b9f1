"""A model of what a power loss leaves on disk, and the crash states it allows.

The model replays the recorded operations (:mod:`tests.powerloss.trace`) and, at any point
of the trace, knows what is **durable** and what is not, under these assumptions (ext4,
``data=ordered``, a disk that honours flushes; ``docs/reliability.md`` states them too):

* **File data.** A write is durable once an ``fsync``/``fdatasync`` of the same file (any
  descriptor) has completed after it. Writes not yet synced may each be lost, or written in
  part: every 512-byte sector of a write (aligned to the file offset) independently, in any
  order (so a later write can survive an earlier one; a lost sector inside a file's new size
  reads as zeros). ``ftruncate``/``O_TRUNC`` are ordered with the writes of their file.
* **Directory entries.** Creates, renames, unlinks and directory creation and removal are
  journaled in order: what survives is a **prefix** of them, at least up to the last one
  made durable by an ``fsync`` of its parent directory (of the destination's, for a
  rename). An ``fsync`` of a regular file is not counted as making its directory entry
  durable (POSIX does not promise it, even where ext4 happens to).
* **Memory-mapped files** are never synced by design: a partition's ``state`` may hold any
  copy it had before the crash (the workload records each), zeros, or nothing valid; it
  always says it was written before the reboot.
* The disk neither lies about flushes nor corrupts synced data (that is what ``verify``
  and the corruption tests cover).

:class:`Replay` walks the trace once; :meth:`Replay.snapshot` captures the model at a crash
point; :func:`crash_states` draws states from a snapshot; :func:`materialise` writes one
into a fresh directory.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from pathlib import Path

from tests.powerloss.trace import Op

SECTOR = 512
"""Granularity of torn writes: a sector (any 4 KiB page is 8 of them, torn independently)."""


@dataclass
class Inode:
    ident: int
    is_dir: bool
    durable: bytes = b""
    content: bytearray = field(default_factory=bytearray)
    pending: list[tuple[str, int, bytes]] = field(default_factory=list)
    """Unsynced data operations: ("w", offset, data) per sector piece, or ("t", size, b"")."""


@dataclass
class MetaOp:
    kind: str  # create | mkdir | rename | unlink | rmdir
    path: str
    path2: str = ""
    ino: int = -1
    parent: int = -1
    """Inode of the directory whose fsync makes this op durable (the destination's)."""


@dataclass
class Snapshot:
    """The model at a crash point: enough to build any state a power loss may leave."""

    index: int
    acks: list[str]
    inodes: dict[int, Inode]
    meta: list[MetaOp]
    meta_min: int
    """Length of the metadata prefix that is guaranteed durable."""
    root: str


@dataclass
class CrashState:
    """One concrete state: a durable metadata prefix, a choice of unsynced data, state files."""

    label: str
    files: dict[str, bytes]
    dirs: list[str]


def _pieces(offset: int, data: bytes) -> list[tuple[str, int, bytes]]:
    """Split a write at sector boundaries of the file."""
    out = []
    pos = 0
    while pos < len(data):
        start = offset + pos
        room = SECTOR - start % SECTOR
        out.append(("w", start, data[pos : pos + room]))
        pos += room
    return out


def _apply(buf: bytearray, op: tuple[str, int, bytes]) -> None:
    kind, where, data = op
    if kind == "t":
        if where < len(buf):
            del buf[where:]
        else:
            buf.extend(b"\0" * (where - len(buf)))
    else:
        if len(buf) < where:
            buf.extend(b"\0" * (where - len(buf)))
        buf[where : where + len(data)] = data


class Replay:
    """Replays the trace, tracking volatile and durable state per inode and the namespace."""

    def __init__(self, root: Path, *, strict_dirs: bool = True, lying_disk: bool = False) -> None:
        self.root = str(root)
        self.strict_dirs = strict_dirs
        self.lying_disk = lying_disk
        """True: an fsync of a segment (``*.log``) returns but makes nothing durable (a disk
        that ignores flushes): the explorer's own check that its oracle notices lost data."""
        """False: an fsync of a file also commits every earlier directory change, as ext4's
        journal does in practice (not promised by POSIX; the default assumes it is not)."""
        self.inodes: dict[int, Inode] = {0: Inode(0, True)}
        self.names: dict[str, int] = {self.root: 0}
        self.meta: list[MetaOp] = []
        self.meta_min = 0
        self.fds: dict[int, tuple[int, int, bool]] = {}  # fd -> (ino, position, append)
        self.acks: list[str] = []
        self.index = 0
        self._next = 1

    # ------------------------------------------------------------------ helpers
    def _new(self, is_dir: bool) -> Inode:
        node = Inode(self._next, is_dir)
        self._next += 1
        self.inodes[node.ident] = node
        return node

    def _parent(self, path: str) -> int:
        return self.names[str(Path(path).parent)]

    def _data(self, node: Inode, op: tuple[str, int, bytes]) -> None:
        _apply(node.content, op)
        node.pending.append(op)

    def _rename_names(self, names: dict[str, int], src: str, dst: str) -> None:
        moved = {p: i for p, i in names.items() if p == src or p.startswith(src + "/")}
        for p in moved:
            del names[p]
        for p in [p for p in names if p == dst or p.startswith(dst + "/")]:
            del names[p]
        for p, i in moved.items():
            names[dst + p[len(src) :]] = i

    # ------------------------------------------------------------------ replay
    def step(self, op: Op) -> None:
        self.index += 1
        if op.kind == "ack":
            self.acks.append(op.text)
        elif op.kind == "open":
            ino = self.names.get(op.path)
            if ino is None:
                if "O_CREAT" not in op.flags:
                    raise ValueError(f"open of a file the model does not have: {op.path}")
                node = self._new(is_dir=False)
                parent = self._parent(op.path)
                self.names[op.path] = node.ident
                self.meta.append(MetaOp("create", op.path, ino=node.ident, parent=parent))
                ino = node.ident
            elif "O_TRUNC" in op.flags and not self.inodes[ino].is_dir:
                self._data(self.inodes[ino], ("t", 0, b""))
            self.fds[op.fd] = (ino, 0, "O_APPEND" in op.flags)
        elif op.kind == "close":
            self.fds.pop(op.fd, None)
        elif op.kind == "lseek":
            ino, _, app = self.fds[op.fd]
            self.fds[op.fd] = (ino, op.offset or 0, app)
        elif op.kind == "write":
            ino, pos, app = self.fds[op.fd]
            node = self.inodes[ino]
            if op.offset is not None:
                where = op.offset
            else:
                where = len(node.content) if app else pos
                self.fds[op.fd] = (ino, where + len(op.data), app)
            for piece in _pieces(where, op.data):
                self._data(node, piece)
        elif op.kind == "truncate":
            ino = self.fds[op.fd][0] if op.fd >= 0 else self.names[op.path]
            self._data(self.inodes[ino], ("t", op.size, b""))
        elif op.kind == "fsync":
            if op.path == "*":
                for node in self.inodes.values():
                    self._sync(node)
                self.meta_min = len(self.meta)
                return
            ino = self.fds[op.fd][0] if op.fd in self.fds else self.names[op.path]
            node = self.inodes[ino]
            if node.is_dir:
                # every entry change made in this directory so far is now durable
                for i in range(len(self.meta) - 1, self.meta_min - 1, -1):
                    if self.meta[i].parent == ino:
                        self.meta_min = i + 1
                        break
            else:
                if not (self.lying_disk and op.path.endswith(".log")):
                    self._sync(node)
                if not self.strict_dirs:
                    self.meta_min = len(self.meta)
        elif op.kind == "mkdir":
            node = self._new(is_dir=True)
            parent = self._parent(op.path)
            self.names[op.path] = node.ident
            self.meta.append(MetaOp("mkdir", op.path, ino=node.ident, parent=parent))
        elif op.kind in ("unlink", "rmdir"):
            self.meta.append(MetaOp(op.kind, op.path, parent=self._parent(op.path)))
            del self.names[op.path]
        elif op.kind == "rename":
            self.meta.append(MetaOp("rename", op.path, op.path2, parent=self._parent(op.path2)))
            self._rename_names(self.names, op.path, op.path2)
        else:
            raise ValueError(f"unknown op {op.kind}")

    def _sync(self, node: Inode) -> None:
        node.durable = bytes(node.content)
        node.pending = []

    def snapshot(self) -> Snapshot:
        return Snapshot(
            index=self.index,
            acks=list(self.acks),
            inodes=copy.deepcopy({i: n for i, n in self.inodes.items() if not n.is_dir}),
            meta=list(self.meta),
            meta_min=self.meta_min,
            root=self.root,
        )


def _namespace(snap: Snapshot, count: int) -> tuple[dict[str, int], list[str]]:
    """Files (path → inode) and directories after the first ``count`` metadata ops."""
    names: dict[str, int] = {snap.root: 0}
    dirs = {snap.root}
    for m in snap.meta[:count]:
        if m.kind == "create":
            names[m.path] = m.ino
        elif m.kind == "mkdir":
            names[m.path] = m.ino
            dirs.add(m.path)
        elif m.kind in ("unlink", "rmdir"):
            names.pop(m.path, None)
            dirs.discard(m.path)
        elif m.kind == "rename":
            moved = {p: i for p, i in names.items() if p == m.path or p.startswith(m.path + "/")}
            for p in moved:
                names.pop(p)
            for p in [p for p in names if p == m.path2 or p.startswith(m.path2 + "/")]:
                names.pop(p)
            dirs = {d for d in dirs if not (d == m.path2 or d.startswith(m.path2 + "/"))}
            for p, i in moved.items():
                new = m.path2 + p[len(m.path) :]
                names[new] = i
                if p in dirs:
                    dirs.discard(p)
                    dirs.add(new)
            dirs = {d for d in dirs if d in names}
    files = {p: i for p, i in names.items() if p not in dirs}
    return files, sorted(dirs)


def crash_states(snap: Snapshot, rng: random.Random, count: int) -> list[CrashState]:
    """``count`` states a power loss at ``snap`` may leave: the first two are "every unsynced
    change lost" and "every change survived"; the rest draw a metadata prefix and, per file,
    a strategy for its unsynced sectors (all, none, a prefix, or a random subset)."""
    out = []
    for n in range(count):
        if n == 0:
            meta_count, mode = snap.meta_min, "none"
        elif n == 1:
            meta_count, mode = len(snap.meta), "all"
        else:
            meta_count = rng.randint(snap.meta_min, len(snap.meta))
            mode = "mixed"
        files, dirs = _namespace(snap, meta_count)
        contents: dict[str, bytes] = {}
        for path, ino in files.items():
            node = snap.inodes[ino]
            buf = bytearray(node.durable)
            strategy = mode if mode != "mixed" else rng.choice(["none", "all", "prefix", "subset"])
            if strategy == "all":
                chosen = node.pending
            elif strategy == "none":
                chosen = []
            elif strategy == "prefix":
                chosen = node.pending[: rng.randint(0, len(node.pending))]
            else:
                chosen = [op for op in node.pending if rng.random() < 0.5]
            for op in chosen:
                _apply(buf, op)
            contents[path] = bytes(buf)
        label = f"op {snap.index} meta {meta_count}/{len(snap.meta)} (min {snap.meta_min}) {mode}"
        out.append(CrashState(label, contents, dirs))
    return out


def materialise(state: CrashState, root: str, target: Path) -> None:
    """Write ``state`` into ``target`` (which stands for the recorded data directory)."""
    target.mkdir(parents=True, exist_ok=True)
    for d in state.dirs:
        (target / Path(d).relative_to(root)).mkdir(parents=True, exist_ok=True)
    for path, content in state.files.items():
        (target / Path(path).relative_to(root)).write_bytes(content)

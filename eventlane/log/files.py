"""Durable file primitives shared by the log's modules."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson


def fsync_dir(path: Path) -> None:
    """fsync a directory, making renames and creations inside it durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably: write a temp file, fsync, rename, fsync dir.

    The temp file's name is unique to this call (``<name>.<pid>-<random>.tmp``; recovery
    deletes ``.tmp`` leftovers of a crash): two writers, in one process or several, never
    write into or rename each other's file, so a reader sees one complete version or
    another, never a torn or empty one. A failed write removes its temp file. Which version
    stays is the last rename's: callers that read-modify-write hold a lock around it."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def read_int_file(path: Path, default: int) -> int:
    """The integer stored as text in ``path``, or ``default`` if the file does not exist."""
    try:
        return int(path.read_text().strip() or default)
    except FileNotFoundError:
        return default


def read_json_file(path: Path, default: Any) -> Any:
    """The JSON value stored in ``path``, or ``default`` if it is missing or unreadable."""
    try:
        return orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return default

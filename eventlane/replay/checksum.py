"""Table-by-table content checksums of read models, independent of row order.

A table's checksum is the sum modulo 2**64 of one 64-bit BLAKE2b digest per row (a
multiset hash: row order, rowids and page layout do not matter; a duplicated or missing
row does). A row's digest covers its values in column-name order, each tagged with its
SQLite storage class (``1`` and ``1.0`` and ``'1'`` differ), so two tables agree only if
they hold the same rows.

What is compared:

* every user table (all columns; the implicit rowid is not a column);
* ``_eventlane_positions`` as ``(topic, partition, next_offset)``: the offset vector the
  file stands at (the generation is a fencing token of the live group, not content);
* ``_eventlane_dead_letters`` as ``(topic, partition, offset, key, value, event_type,
  status)``: which events the model skipped (ids, times, error texts, attempts and the
  outbox flag depend on when and where they failed, not on the history).

Everything is read inside one read transaction, so a live file's positions and tables are
one consistent snapshot.

    >>> import sqlite3
    >>> a, b = sqlite3.connect(":memory:"), sqlite3.connect(":memory:")
    >>> for conn, rows in ((a, [(1, "x"), (2, "y")]), (b, [(2, "y"), (1, "x")])):
    ...     _ = conn.execute("CREATE TABLE t (id INT, v TEXT)")
    ...     _ = conn.executemany("INSERT INTO t VALUES (?, ?)", rows)
    >>> table_checksums(a) == table_checksums(b)
    True
    >>> _ = b.execute("UPDATE t SET v = 'z' WHERE id = 2")
    >>> [d.table for d in compare(table_checksums(a), table_checksums(b)) if not d.equal]
    ['t']
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from eventlane.log import TopicPartition

__all__ = [
    "DEAD_LETTERS",
    "FRAMEWORK_COLUMNS",
    "POSITIONS",
    "TableChecksum",
    "TableDiff",
    "compare",
    "file_checksums",
    "positions_of",
    "table_checksums",
    "table_sum",
]

POSITIONS = "_eventlane_positions"
DEAD_LETTERS = "_eventlane_dead_letters"
FRAMEWORK_COLUMNS = {
    POSITIONS: ("topic", "partition", "next_offset"),
    DEAD_LETTERS: ("topic", "partition", "offset", "key", "value", "event_type", "status"),
}
_MASK = (1 << 64) - 1
_LEN = struct.Struct(">I")


class TableChecksum(NamedTuple):
    table: str
    rows: int
    checksum: int

    @property
    def hex(self) -> str:
        return f"{self.checksum:016x}"


class TableDiff(NamedTuple):
    """One table compared between two models (``None``: the table is missing there)."""

    table: str
    left: TableChecksum | None
    right: TableChecksum | None

    @property
    def equal(self) -> bool:
        return self.left is not None and self.right is not None and self.left[1:] == self.right[1:]


def _encode(value: Any) -> bytes:
    if value is None:
        return b"n"
    if isinstance(value, int):
        return b"i" + str(value).encode()
    if isinstance(value, float):
        return b"f" + value.hex().encode()
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        return b"s" + _LEN.pack(len(raw)) + raw
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return b"b" + _LEN.pack(len(raw)) + raw
    # other types a PostgreSQL driver returns (Decimal, datetime, UUID, JSON values)
    text = f"{type(value).__name__}:{value!r}".encode("utf-8", "surrogatepass")
    return b"o" + _LEN.pack(len(text)) + text


def table_sum(
    conn: Any, table: str, columns: Iterable[str], *, schema: str | None = None
) -> TableChecksum:
    """The checksum of one table (``conn``: a DB-API connection with ``execute``; ``schema``
    qualifies the table's name, for PostgreSQL)."""
    cols = sorted(columns)
    select = ", ".join('"' + c.replace('"', '""') + '"' for c in cols)
    total = 0
    rows = 0
    blake = hashlib.blake2b
    encode = _encode
    source = f'"{table}"' if schema is None else f'"{schema}"."{table}"'
    for row in conn.execute(f"SELECT {select} FROM {source}"):
        digest = blake(b"\x00".join([encode(v) for v in row]), digest_size=8).digest()
        total += int.from_bytes(digest, "big")
        rows += 1
    return TableChecksum(table, rows, total & _MASK)


def table_checksums(
    conn: sqlite3.Connection, *, framework: bool = True
) -> dict[str, TableChecksum]:
    """Checksums of every user table (and, with ``framework``, positions and dead letters)."""
    out: dict[str, TableChecksum] = {}
    started = not conn.in_transaction
    if started:
        conn.execute("BEGIN")
    try:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"
            ).fetchall()
        ]
        for name in names:
            if name in FRAMEWORK_COLUMNS:
                if framework:
                    out[name] = table_sum(conn, name, FRAMEWORK_COLUMNS[name])
                continue
            if name.startswith(("sqlite_", "_sqlite_migrations", "_eventlane_")):
                continue
            info = conn.execute(f'PRAGMA table_info("{name}")').fetchall()
            out[name] = table_sum(conn, name, [r[1] for r in info])
    finally:
        if started:
            conn.execute("COMMIT")
    return out


def file_checksums(
    path: str | os.PathLike[str], *, framework: bool = True
) -> dict[str, TableChecksum]:
    """:func:`table_checksums` of a read-model file (a path or its text), opened read-only."""
    conn = sqlite3.connect(
        Path(path).resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None
    )
    try:
        return table_checksums(conn, framework=framework)
    finally:
        conn.close()


def positions_of(conn: sqlite3.Connection) -> dict[TopicPartition, int]:
    rows = conn.execute(f"SELECT topic, partition, next_offset FROM {POSITIONS}")
    return {TopicPartition(t, p): int(o) for t, p, o in rows}


def compare(
    left: Mapping[str, TableChecksum],
    right: Mapping[str, TableChecksum],
    *,
    only: Iterable[str] | None = None,
) -> list[TableDiff]:
    """Per table (sorted by name; ``only`` restricts the names) whether both sides agree."""
    names = sorted(set(only) if only is not None else set(left) | set(right))
    return [TableDiff(n, left.get(n), right.get(n)) for n in names]

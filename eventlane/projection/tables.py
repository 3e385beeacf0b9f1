"""The portable table API of a handler: what most projectors do, by column, on any engine.

``ctx.table("invoices")`` inside a handler (or ``table(readmodel_db, "invoices")`` in a
migration or a query) gives a :class:`Table` bound to the batch's transaction; the same
calls run unchanged on SQLite and PostgreSQL read models:

* ``insert(row)``; ``upsert(row, key=("id",), add=("total",))``: insert, or on a conflict of
  ``key`` replace the other columns, except those in ``add``, which are *incremented* by the
  row's value (a running total written from several partitions without a read first);
* ``update(where, set={...}, add={...})``, ``delete(**where)``: by equality of columns, the
  number of rows touched returned;
* ``get(**where)``: one row as a dict (``None``: none); ``query(order_by=..., **where)``:
  every matching row as dicts.

Only identifiers that are plain names (letters, digits, ``_``) are accepted, and every one is
quoted, so a column called ``offset`` or ``order`` works on both engines; values always go as
parameters. Anything else (joins, ``CASE``, window functions) is raw SQL through ``ctx.db``
in the engine's own dialect (``?`` placeholders on SQLite, ``%s`` on PostgreSQL).

Both engines take ``INSERT ... ON CONFLICT (...) DO UPDATE SET c = excluded.c`` (SQLite
>= 3.24), so one statement text serves both; only the placeholder differs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

from eventlane.errors import ConfigError, ProjectionError

__all__ = ["Dialect", "Executor", "Table", "dialect_of"]

IN_FAILED_TRANSACTION = "25P02"
"""PostgreSQL's SQLSTATE for a statement in a transaction an earlier failure aborted."""

Dialect = Literal["sqlite", "postgresql"]
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Executor(Protocol):
    """A DB-API connection with ``execute`` (``sqlite3.Connection``, ``psycopg.Connection``)."""

    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...


def dialect_of(db: Any) -> Dialect:
    """The engine of a migration's or handler's ``db`` (``sqlite_utils.Database`` or a
    ``sqlite3`` connection: ``"sqlite"``; a psycopg connection: ``"postgresql"``), for the
    few DDL words that differ (``WITHOUT ROWID`` exists on SQLite only)."""
    module = type(db).__module__
    return "sqlite" if module.startswith(("sqlite_utils", "sqlite3")) else "postgresql"


def quote(name: str) -> str:
    """``name`` as a quoted identifier; :class:`ConfigError` unless it is a plain name."""
    if not _NAME.match(name):
        raise ConfigError(f"not a plain table or column name: {name!r}")
    return f'"{name}"'


class Table:
    """One table of a read model, on the connection of the current transaction."""

    __slots__ = ("_conn", "_mark", "_name", "dialect", "name")

    def __init__(self, conn: Executor, name: str, dialect: Dialect) -> None:
        self._conn = conn
        self.name = name
        self._name = quote(name)
        self.dialect = dialect
        self._mark = "?" if dialect == "sqlite" else "%s"

    def _run(self, sql: str, params: Sequence[Any]) -> Any:
        try:
            return self._conn.execute(sql, tuple(params))
        except Exception as exc:
            if getattr(exc, "sqlstate", None) == IN_FAILED_TRANSACTION:  # PostgreSQL's 25P02
                raise ProjectionError(
                    f"a statement on {self.name!r} ran after an earlier one of this handler"
                    " failed and was caught: PostgreSQL aborts the transaction at a failed"
                    " statement (SQLite goes on), so a handler cannot catch a database error"
                    " and continue there; write it without the failure (upsert(...) instead of"
                    " insert then update, get(...) before insert)"
                ) from exc
            raise

    def _where(self, where: Mapping[str, Any]) -> tuple[str, list[Any]]:
        if not where:
            return "", []
        parts, params = [], []
        for col, value in where.items():
            if value is None:
                parts.append(f"{quote(col)} IS NULL")
            else:
                parts.append(f"{quote(col)} = {self._mark}")
                params.append(value)
        return " WHERE " + " AND ".join(parts), params

    def insert(self, row: Mapping[str, Any]) -> None:
        """``INSERT`` one row (an existing key raises the engine's integrity error)."""
        cols = ", ".join(quote(c) for c in row)
        marks = ", ".join([self._mark] * len(row))
        self._run(f"INSERT INTO {self._name} ({cols}) VALUES ({marks})", list(row.values()))

    def upsert(
        self, row: Mapping[str, Any], *, key: Sequence[str], add: Iterable[str] = ()
    ) -> None:
        """Insert ``row``; on a conflict of ``key``, set its other columns to the row's
        values, except the columns in ``add``, which grow by the row's value."""
        adding = set(add)
        cols = ", ".join(quote(c) for c in row)
        marks = ", ".join([self._mark] * len(row))
        keys = ", ".join(quote(c) for c in key)
        sets = []
        for col in row:
            if col in key:
                continue
            q = quote(col)
            sets.append(
                f"{q} = {self._name}.{q} + excluded.{q}" if col in adding else f"{q} = excluded.{q}"
            )
        action = "DO UPDATE SET " + ", ".join(sets) if sets else "DO NOTHING"
        self._run(
            f"INSERT INTO {self._name} ({cols}) VALUES ({marks}) ON CONFLICT ({keys}) {action}",
            list(row.values()),
        )

    def update(
        self,
        where: Mapping[str, Any],
        set: Mapping[str, Any] | None = None,
        add: Mapping[str, Any] | None = None,
    ) -> int:
        """``UPDATE`` the rows matching ``where``: columns of ``set`` take its values, those
        of ``add`` grow by its values (negative to shrink); returns the rows touched."""
        parts, params = [], []
        for col, value in (set or {}).items():
            parts.append(f"{quote(col)} = {self._mark}")
            params.append(value)
        for col, value in (add or {}).items():
            q = quote(col)
            parts.append(f"{q} = {q} + {self._mark}")
            params.append(value)
        if not parts:
            return 0
        clause, more = self._where(where)
        cur = self._run(f"UPDATE {self._name} SET {', '.join(parts)}{clause}", params + more)
        return int(cur.rowcount)

    def delete(self, **where: Any) -> int:
        """``DELETE`` the rows matching ``where`` (all rows: none given); rows deleted."""
        clause, params = self._where(where)
        return int(self._run(f"DELETE FROM {self._name}{clause}", params).rowcount)

    def get(self, **where: Any) -> dict[str, Any] | None:
        """The first row matching ``where`` as a dict, or ``None``."""
        rows = self.query(limit=1, **where)
        return rows[0] if rows else None

    def query(
        self, *, order_by: str | Sequence[str] = (), limit: int | None = None, **where: Any
    ) -> list[dict[str, Any]]:
        """The rows matching ``where`` as dicts, in ``order_by`` order (column names)."""
        clause, params = self._where(where)
        order = [order_by] if isinstance(order_by, str) else list(order_by)
        sql = f"SELECT * FROM {self._name}{clause}"
        if order:
            sql += " ORDER BY " + ", ".join(quote(c) for c in order)
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        cur = self._run(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

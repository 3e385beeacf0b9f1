"""The portable table API (``ctx.table``) against a dict model, on both engines: the same
sequence of upserts (some adding), inserts, updates, deletes and reads gives the model's
rows on a real SQLite file and in a real PostgreSQL schema."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlane.errors import ConfigError
from eventlane.projection import Table, dialect_of

KEYS = st.sampled_from(["a", "b", "c", "offset", "o'q"])
AMOUNTS = st.integers(-1000, 1000)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("upsert_add"), KEYS, AMOUNTS),
        st.tuples(st.just("upsert_set"), KEYS, AMOUNTS),
        st.tuples(st.just("update_add"), KEYS, AMOUNTS),
        st.tuples(st.just("update_set"), KEYS, AMOUNTS),
        st.tuples(st.just("delete"), KEYS, st.just(0)),
        st.tuples(st.just("get"), KEYS, st.just(0)),
    ),
    max_size=40,
)
DDL = 'CREATE TABLE "t" ("id" TEXT PRIMARY KEY, "total" BIGINT NOT NULL, "n" BIGINT NOT NULL)'


def run(table: Table, ops: list[tuple[str, str, int]]) -> dict[str, tuple[int, int]]:
    """Apply ``ops`` to ``table`` and to a dict; assert every read agrees; return the model."""
    model: dict[str, tuple[int, int]] = {}
    for op, key, amount in ops:
        if op == "upsert_add":
            table.upsert({"id": key, "total": amount, "n": 1}, key=("id",), add=("total", "n"))
            total, n = model.get(key, (0, 0))
            model[key] = (total + amount, n + 1)
        elif op == "upsert_set":
            table.upsert({"id": key, "total": amount, "n": 0}, key=("id",))
            model[key] = (amount, 0)
        elif op == "update_add":
            touched = table.update({"id": key}, add={"total": amount, "n": 1})
            assert touched == (key in model)
            if key in model:
                model[key] = (model[key][0] + amount, model[key][1] + 1)
        elif op == "update_set":
            assert table.update({"id": key}, set={"total": amount}) == (key in model)
            if key in model:
                model[key] = (amount, model[key][1])
        elif op == "delete":
            assert table.delete(id=key) == (key in model)
            model.pop(key, None)
        else:
            row = table.get(id=key)
            expected = None if key not in model else {"id": key, "total": model[key][0]}
            got = None if row is None else {"id": row["id"], "total": row["total"]}
            assert got == expected
    rows = table.query(order_by="id")
    assert [(r["id"], (r["total"], r["n"])) for r in rows] == sorted(model.items())
    return model


def test_sqlite_table_api_follows_the_model(tmp_path: Path) -> None:
    """Each example in its own rolled-back transaction of one real file."""
    conn = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    try:
        assert dialect_of(conn) == "sqlite"
        conn.execute(DDL)
        table = Table(conn, "t", "sqlite")

        @settings(max_examples=60)
        @given(ops=OPS)
        def check(ops: list[tuple[str, str, int]]) -> None:
            conn.execute("BEGIN")
            try:
                run(table, ops)
            finally:
                conn.execute("ROLLBACK")

        check()
    finally:
        conn.close()


def test_postgresql_table_api_follows_the_model(postgres_url: str) -> None:
    """The same property on PostgreSQL (each example in its own rolled-back transaction)."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert dialect_of(conn) == "postgresql"
        conn.execute(DDL)
        table = Table(conn, "t", "postgresql")

        @settings(max_examples=60)
        @given(ops=OPS)
        def check(ops: list[tuple[str, str, int]]) -> None:
            conn.execute("BEGIN")
            try:
                run(table, ops)
            finally:
                conn.execute("ROLLBACK")

        check()


def test_only_plain_names_are_accepted() -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.raises(ConfigError):
        Table(conn, 't"; DROP TABLE x; --', "sqlite")
    with pytest.raises(ConfigError):
        Table(conn, "t", "sqlite").get(**{"id = 1 OR 1": 1})

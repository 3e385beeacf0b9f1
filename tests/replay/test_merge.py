"""Merge rules and the merge of partial read models (no Spark needed), on both engines:
SQLite files, and schemas of a PostgreSQL database (:func:`merge_schemas`, the session's
server).

The SQL merge is checked against the pure reference :func:`merge_rows` on random rows
(Hypothesis), and the failure modes are pinned: a collision without a rule names the table,
the key and both partitions; a ``same`` column that differs; a collision on a second unique
constraint; seeded rows counted once.
"""

from __future__ import annotations

import doctest
import itertools
import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlane.errors import ReplayError
from eventlane.replay import build, checksum, merge, ranges, task
from eventlane.replay.merge import (
    MergeConflictError,
    Partial,
    merge_partials,
    merge_rows,
    merge_schemas,
    parse_rule,
    user_tables,
)
from eventlane.testing.postgres import PostgresServer


@pytest.mark.parametrize("module", [build, checksum, merge, ranges, task])
def test_docstring_examples(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0


def make_db(path: Path, schema: str, rows: list[tuple[object, ...]] = (), table: str = "t") -> Path:
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(schema)
    if rows:
        marks = ", ".join("?" * len(rows[0]))
        conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    # the framework tables every read model has
    conn.execute(
        "CREATE TABLE IF NOT EXISTS _eventlane_dead_letters (id INTEGER PRIMARY KEY, topic TEXT,"
        " partition INT, offset INT, key BLOB, value BLOB, headers TEXT, event_type TEXT,"
        " error TEXT, attempts INT, status TEXT, created_ms INT, published INT,"
        " UNIQUE (topic, partition, offset))"
    )
    conn.commit()
    conn.close()
    return path


def run_merge(
    tmp_path: Path,
    schema: str,
    partials: list[list[tuple[object, ...]]],
    rules: dict[str, str],
    seed: list[tuple[object, ...]] = (),
) -> list[tuple[object, ...]]:
    target = make_db(tmp_path / "target.sqlite", schema, list(seed))
    parts = [
        Partial(make_db(tmp_path / f"p{i}.sqlite", schema, list(seed) + rows), f"orders/{i}")
        for i, rows in enumerate(partials)
    ]
    conn = sqlite3.connect(target, isolation_level=None)
    try:
        merge_partials(conn, parts, rules, projector="test")
        return sorted(conn.execute("SELECT * FROM t").fetchall(), key=repr)
    finally:
        conn.close()


_pg_runs = itertools.count()
PG_DEAD_LETTERS = (
    "CREATE TABLE _eventlane_dead_letters (id BIGSERIAL PRIMARY KEY, topic TEXT, partition"
    ' BIGINT, "offset" BIGINT, key BYTEA, value BYTEA, headers TEXT, event_type TEXT, error'
    " TEXT, attempts BIGINT, status TEXT, created_ms BIGINT, published BIGINT, UNIQUE (topic,"
    ' partition, "offset"))'
)


def run_merge_pg(
    url: str,
    schema: str,
    partials: list[list[tuple[object, ...]]],
    rules: dict[str, str],
    seed: list[tuple[object, ...]] = (),
    *,
    add: bool = False,
) -> list[tuple[object, ...]]:
    """:func:`run_merge` with schemas of a PostgreSQL database for files; ``add``: each
    partial's ``(k, n)`` rows are its seed row of ``k`` plus ``n`` (a partial that started
    from the seed and added to it)."""
    prefix = f"m{next(_pg_runs)}"
    names = [f"{prefix}_target"] + [f"{prefix}_p{i}" for i in range(len(partials))]
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            seeds = dict(seed)  # type: ignore[arg-type]
            for i, (name, rows) in enumerate(zip(names, [[], *partials], strict=True)):
                conn.execute(f'CREATE SCHEMA "{name}"')
                conn.execute(f'SET search_path TO "{name}"')
                conn.execute(schema)
                conn.execute(PG_DEAD_LETTERS)
                content = [*seed, *rows]
                if add and i > 0:
                    content = [(k, seeds[k] + n) for k, n in rows]  # type: ignore[operator]
                for r in content:
                    conn.execute(f"INSERT INTO t VALUES ({', '.join(['%s'] * len(r))})", r)
            conn.execute("SET search_path TO public")
            parts = [Partial(Path(n), f"orders/{i}") for i, n in enumerate(names[1:])]
            merge_schemas(conn, names[0], parts, rules, projector="test")
            return sorted(conn.execute(f'SELECT * FROM "{names[0]}".t').fetchall(), key=repr)
        finally:
            for name in names:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


Merge = Callable[..., list[tuple[object, ...]]]


@pytest.fixture(params=["sqlite", "postgresql"])
def merge_on(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Merge:
    """``run_merge`` on either engine (a fresh directory or fresh schemas per call)."""
    if request.param == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        return lambda *args, **kw: run_merge_pg(server.url, *args, **kw)
    return lambda *args, **kw: run_merge(tmp_path_factory.mktemp("m"), *args, **kw)


SCHEMA = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT, hi INT, lo INT, name TEXT, ts INT);"
RULE = "n=sum, hi=max, lo=min, name=first-non-null, ts=max"

maybe_int = st.one_of(st.none(), st.integers(-1000, 1000))
row = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    maybe_int,
    maybe_int,
    maybe_int,
    st.one_of(st.none(), st.sampled_from(["x", "y"])),
    maybe_int,
)


def reference(partials: list[list[tuple[object, ...]]]) -> list[tuple[object, ...]]:
    rule = parse_rule(RULE)
    expected: dict[str, dict[str, object]] = {}
    cols = ("k", "n", "hi", "lo", "name", "ts")
    for rows in partials:
        for r in rows:
            new = dict(zip(cols[1:], r[1:], strict=True))
            old = expected.get(r[0])
            expected[r[0]] = new if old is None else merge_rows(rule, old, new)
    return sorted(((k, *v.values()) for k, v in expected.items()), key=repr)


partial_lists = st.lists(
    st.lists(row, max_size=4, unique_by=lambda r: r[0]), min_size=1, max_size=4
)


@settings(max_examples=60, deadline=None)
@given(partial_lists)
def test_sql_merge_matches_the_reference(
    tmp_path_factory: pytest.TempPathFactory, partials
) -> None:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("m")
    assert run_merge(tmp, SCHEMA, partials, {"t": RULE}) == reference(partials)


@settings(max_examples=40, deadline=None)
@given(partial_lists)
def test_postgresql_merge_matches_the_reference(postgres_server: PostgresServer, partials) -> None:  # type: ignore[no-untyped-def]
    assert run_merge_pg(postgres_server.url, SCHEMA, partials, {"t": RULE}) == reference(partials)


def test_latest_by_takes_the_whole_newest_row(merge_on: Merge) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT, ts INT);"
    got = merge_on(
        schema,
        [[("a", "old", 1), ("b", "b1", 9)], [("a", "new", 5), ("b", "b2", 3)]],
        {"t": "latest-by:ts"},
    )
    assert got == [("a", "new", 5), ("b", "b1", 9)]


def test_collision_without_rule_names_table_key_and_partitions(merge_on: Merge) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT);"
    with pytest.raises(MergeConflictError) as err:
        merge_on(schema, [[("a", 1), ("b", 1)], [("c", 1)], [("b", 2)]], {})
    assert err.value.table == "t"
    assert err.value.key == {"k": "b"}
    text = str(err.value)
    assert "table 't'" in text and "k='b'" in text
    assert "orders/2" in text and "orders/0" in text  # both writers named
    assert "merge_rules" in text


def test_rows_of_distinct_keys_need_no_rule(merge_on: Merge) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT);"
    got = merge_on(schema, [[("a", 1)], [("b", 2)], [("c", 3)]], {})
    assert got == [("a", 1), ("b", 2), ("c", 3)]


def test_same_rule_refuses_different_values(merge_on: Merge) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT, name TEXT);"
    rules = {"t": "n=sum, name=same"}
    assert merge_on(schema, [[("a", 1, "x")], [("a", 2, "x")]], rules) == [("a", 3, "x")]
    with pytest.raises(MergeConflictError, match="column 'name'"):
        merge_on(schema, [[("a", 1, "x")], [("a", 2, "y")]], rules)


def test_second_unique_constraint_collision_is_named(merge_on: Merge) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT, event_id TEXT UNIQUE);"
    with pytest.raises(MergeConflictError, match=r"unique columns \(event_id\)"):
        merge_on(schema, [[("a", 1, "e1")], [("b", 1, "e1")]], {"t": "n=sum, event_id=same"})


def test_seeded_rows_count_once(tmp_path: Path, postgres_server: PostgresServer) -> None:
    """setup seeds (1, 100) in every partial; each partial adds to it; the merge must give
    100 + the additions, not 100 per partial; an untouched seed is not a write."""
    schema = "CREATE TABLE t (k INTEGER PRIMARY KEY, n INT);"
    pg = run_merge_pg(
        postgres_server.url,
        schema,
        [[(1, 5)], [(1, 0)], [(1, 7)]],
        {"t": "sum"},
        seed=[(1, 100)],
        add=True,
    )
    assert pg == [(1, 112)]
    got = run_merge(
        tmp_path,
        schema,
        [[], [], []],
        {"t": "sum"},
        seed=[(1, 100)],
    )
    assert got == [(1, 100)]
    # the partials start from the seed and add 5, 0 and 7
    target = make_db(tmp_path / "target2.sqlite", schema, [(1, 100)])
    parts = [
        Partial(make_db(tmp_path / f"q{i}.sqlite", schema, [(1, 100 + add)]), f"p/{i}")
        for i, add in enumerate((5, 0, 7))
    ]
    conn = sqlite3.connect(target, isolation_level=None)
    merge_partials(conn, parts, {"t": "sum"})
    assert conn.execute("SELECT * FROM t").fetchall() == [(1, 112)]
    conn.close()


def test_seeded_row_changed_by_one_partial_needs_no_rule(tmp_path: Path) -> None:
    schema = "CREATE TABLE t (k INTEGER PRIMARY KEY, n INT);"
    target = make_db(tmp_path / "target.sqlite", schema, [(1, 100)])
    parts = [
        Partial(make_db(tmp_path / "a.sqlite", schema, [(1, 100)]), "p/0"),
        Partial(make_db(tmp_path / "b.sqlite", schema, [(1, 140)]), "p/1"),
    ]
    conn = sqlite3.connect(target, isolation_level=None)
    merge_partials(conn, parts, {})
    assert conn.execute("SELECT * FROM t").fetchall() == [(1, 140)]
    conn.close()


def test_rules_are_checked_against_the_schema(merge_on: Merge) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT);"
    with pytest.raises(ReplayError, match="no_such_table"):
        merge_on(schema, [[("a", 1)]], {"no_such_table": "sum"})
    with pytest.raises(ReplayError, match="column 'k'"):
        merge_on(schema, [[("a", 1)]], {"t": "k=sum"})
    with pytest.raises(ReplayError, match="unknown merge rule 'avg'"):
        parse_rule("n=avg")


def test_keyless_tables_are_a_bag_union(merge_on: Merge) -> None:
    schema = "CREATE TABLE t (k TEXT, n INT);"
    got = merge_on(schema, [[("a", 1), ("a", 1)], [("a", 1)]], {})
    assert got == [("a", 1)] * 3


def test_user_tables_skip_framework_tables(tmp_path: Path) -> None:
    path = make_db(tmp_path / "x.sqlite", SCHEMA + "CREATE TABLE _sqlite_migrations (x);")
    conn = sqlite3.connect(path)
    assert [t.name for t in user_tables(conn)] == ["t"]
    conn.close()

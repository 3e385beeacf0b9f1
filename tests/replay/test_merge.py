"""Merge rules and the SQLite merge of partial read models (no Spark needed).

The SQL merge is checked against the pure reference :func:`merge_rows` on random rows
(Hypothesis), and the failure modes are pinned: a collision without a rule names the table,
the key and both partitions; a ``same`` column that differs; a collision on a second unique
constraint; seeded rows counted once.
"""

from __future__ import annotations

import doctest
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from framework.errors import ReplayError
from framework.replay import build, checksum, merge, ranges, task
from framework.replay.merge import (
    MergeConflictError,
    Partial,
    merge_partials,
    merge_rows,
    parse_rule,
    user_tables,
)


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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(row, max_size=4, unique_by=lambda r: r[0]), min_size=1, max_size=4))
def test_sql_merge_matches_the_reference(
    tmp_path_factory: pytest.TempPathFactory, partials
) -> None:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("m")
    got = run_merge(tmp, SCHEMA, partials, {"t": RULE})
    rule = parse_rule(RULE)
    expected: dict[str, dict[str, object]] = {}
    cols = ("k", "n", "hi", "lo", "name", "ts")
    for rows in partials:
        for r in rows:
            new = dict(zip(cols[1:], r[1:], strict=True))
            old = expected.get(r[0])
            expected[r[0]] = new if old is None else merge_rows(rule, old, new)
    want = sorted(((k, *v.values()) for k, v in expected.items()), key=repr)
    assert got == want


def test_latest_by_takes_the_whole_newest_row(tmp_path: Path) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT, ts INT);"
    got = run_merge(
        tmp_path,
        schema,
        [[("a", "old", 1), ("b", "b1", 9)], [("a", "new", 5), ("b", "b2", 3)]],
        {"t": "latest-by:ts"},
    )
    assert got == [("a", "new", 5), ("b", "b1", 9)]


def test_collision_without_rule_names_table_key_and_partitions(tmp_path: Path) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT);"
    with pytest.raises(MergeConflictError) as err:
        run_merge(tmp_path, schema, [[("a", 1), ("b", 1)], [("c", 1)], [("b", 2)]], {})
    assert err.value.table == "t"
    assert err.value.key == {"k": "b"}
    text = str(err.value)
    assert "table 't'" in text and "k='b'" in text
    assert "orders/2" in text and "orders/0" in text  # both writers named
    assert "merge_rules" in text


def test_rows_of_distinct_keys_need_no_rule(tmp_path: Path) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT);"
    got = run_merge(tmp_path, schema, [[("a", 1)], [("b", 2)], [("c", 3)]], {})
    assert got == [("a", 1), ("b", 2), ("c", 3)]


def test_same_rule_refuses_different_values(tmp_path: Path) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT, name TEXT);"
    first, second = tmp_path / "1", tmp_path / "2"
    first.mkdir()
    second.mkdir()
    rules = {"t": "n=sum, name=same"}
    assert run_merge(first, schema, [[("a", 1, "x")], [("a", 2, "x")]], rules) == [("a", 3, "x")]
    with pytest.raises(MergeConflictError, match="column 'name'"):
        run_merge(second, schema, [[("a", 1, "x")], [("a", 2, "y")]], rules)


def test_second_unique_constraint_collision_is_named(tmp_path: Path) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT, event_id TEXT UNIQUE);"
    with pytest.raises(MergeConflictError, match=r"unique columns \(event_id\)"):
        run_merge(tmp_path, schema, [[("a", 1, "e1")], [("b", 1, "e1")]], {"t": "sum"})


def test_seeded_rows_count_once(tmp_path: Path) -> None:
    """setup seeds (1, 100) in every partial; each partial adds to it; the merge must give
    100 + the additions, not 100 per partial; an untouched seed is not a write."""
    schema = "CREATE TABLE t (k INTEGER PRIMARY KEY, n INT);"
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


def test_rules_are_checked_against_the_schema(tmp_path: Path) -> None:
    schema = "CREATE TABLE t (k TEXT PRIMARY KEY, n INT);"
    with pytest.raises(ReplayError, match="no_such_table"):
        run_merge(tmp_path, schema, [[("a", 1)]], {"no_such_table": "sum"})
    with pytest.raises(ReplayError, match="column 'k'"):
        run_merge(tmp_path, schema, [[("a", 1)]], {"t": "k=sum"})
    with pytest.raises(ReplayError, match="unknown merge rule 'avg'"):
        parse_rule("n=avg")


def test_keyless_tables_are_a_bag_union(tmp_path: Path) -> None:
    schema = "CREATE TABLE t (k TEXT, n INT);"
    got = run_merge(tmp_path, schema, [[("a", 1), ("a", 1)], [("a", 1)]], {})
    assert got == [("a", 1)] * 3


def test_user_tables_skip_framework_tables(tmp_path: Path) -> None:
    path = make_db(tmp_path / "x.sqlite", SCHEMA + "CREATE TABLE _sqlite_migrations (x);")
    conn = sqlite3.connect(path)
    assert [t.name for t in user_tables(conn)] == ["t"]
    conn.close()

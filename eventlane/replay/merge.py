"""Merge rules, and the merge of partial read models into one, streamed inside SQLite.

A parallel rebuild replays each log partition (or key group) into its own *partial* file,
every partial starting from the same empty schema. Rows only one partial wrote are copied
as they are. A row (same primary key) written by several partials is merged by the rule the
projector declares for its table in ``Projector.merge_rules``; a table without a rule whose
rows collide fails the rebuild with :class:`MergeConflictError` naming the table, the key
and the partitions — never a silent last-writer-wins.

Rule syntax (one string per table)::

    "sum"                                   every non-key column: the same rule
    "latest-by:updated_ms"                  the whole row with the greatest updated_ms
    "total=sum, events=sum, name=same, *=max"   per column; ``*`` = the other columns

Column rules: ``sum`` (NULL counts as nothing), ``max``, ``min`` (NULLs ignored),
``first-non-null`` (the first partial's non-NULL value, partials taken in topic/partition
order), ``same`` (the values must be equal, else :class:`MergeConflictError`). Row rules:
``latest-by:COL`` / ``earliest-by:COL`` (ties keep the row merged first). Rules must match
what the handlers do: ``sum`` for counters and totals, ``max`` for high-water values, and so
on; a rule states how to combine two *independent* partial states of one key.

Rows a projector's ``setup`` (or migrations) seeds are the common starting point of every
partial: a partial's row that still equals the seeded one is not a write; for ``sum`` the
seeded value is counted once (``seed + Σ (partial - seed)``).

The merge streams: each partial is ``ATTACH``-ed in turn and merged with
``INSERT … SELECT … ON CONFLICT DO UPDATE``; no row passes through Python. A read model in
PostgreSQL merges the same way inside the server (:func:`merge_schemas`): each partial is a
schema of the output's database, the statements differ only by dialect (null-safe
``IS NOT DISTINCT FROM``, ``greatest``/``least``, the existing row named ``cur``).

Reference semantics of two rows (the SQL does the same)::

    >>> rule = parse_rule("total=sum, name=first-non-null, seen=max")
    >>> merge_rows(rule, {"total": 5, "name": None, "seen": 3},
    ...                  {"total": 7, "name": "ada", "seen": 9})
    {'total': 12, 'name': 'ada', 'seen': 9}
    >>> merge_rows(parse_rule("latest-by:ts"), {"ts": 2, "v": "old"}, {"ts": 5, "v": "new"})
    {'ts': 5, 'v': 'new'}
    >>> merge_rows(parse_rule("sum"), {"n": None}, {"n": 4})
    {'n': 4}
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from eventlane.errors import MergeConflictError, ReplayError
from eventlane.observability import get_logger
from eventlane.projection.postgres import integrity_error

log = get_logger("eventlane.replay")

__all__ = [
    "COLUMN_RULES",
    "MergeConflictError",
    "MergeRule",
    "MergeStats",
    "Partial",
    "TableInfo",
    "merge_partials",
    "merge_rows",
    "merge_schemas",
    "parse_rule",
    "update_clause",
    "user_tables",
]

COLUMN_RULES = ("sum", "max", "min", "first-non-null", "same")
ROW_RULES = ("latest-by", "earliest-by")


class MergeRule(NamedTuple):
    """A parsed rule: per-column rules (``default`` for the rest) or a row rule."""

    columns: Mapping[str, str]
    default: str | None
    row_by: tuple[str, str] | None = None
    """``("latest-by", column)`` or ``("earliest-by", column)``."""

    def column_rule(self, column: str) -> str | None:
        return self.columns.get(column, self.default)


def parse_rule(text: str) -> MergeRule:
    """Parse a rule string (see the module docstring).

    >>> parse_rule("sum")
    MergeRule(columns={}, default='sum', row_by=None)
    >>> parse_rule("latest-by:updated")
    MergeRule(columns={}, default=None, row_by=('latest-by', 'updated'))
    >>> parse_rule("total = sum, *=max")
    MergeRule(columns={'total': 'sum'}, default='max', row_by=None)
    >>> parse_rule("total=avg")
    Traceback (most recent call last):
    ...
    eventlane.errors.ReplayError: unknown merge rule 'avg' for column 'total' in 'total=avg'; ...
    """
    spec = text.strip()
    for row_rule in ROW_RULES:
        if spec.startswith(row_rule + ":"):
            column = spec[len(row_rule) + 1 :].strip()
            if not column.isidentifier():
                raise ReplayError(f"merge rule {text!r}: {row_rule} needs a column name")
            return MergeRule({}, None, (row_rule, column))
    if spec in COLUMN_RULES:
        return MergeRule({}, spec)
    columns: dict[str, str] = {}
    default = None
    for part in spec.split(","):
        if "=" not in part:
            raise ReplayError(
                f"cannot parse merge rule {text!r}: expected a rule ({', '.join(COLUMN_RULES)},"
                " latest-by:COL, earliest-by:COL) or 'column=rule, ...'"
            )
        column, _, rule = (s.strip() for s in part.partition("="))
        if rule not in COLUMN_RULES:
            raise ReplayError(
                f"unknown merge rule {rule!r} for column {column!r} in {text!r}; use one of"
                f" {', '.join(COLUMN_RULES)}"
            )
        if column == "*":
            default = rule
        else:
            columns[column] = rule
    return MergeRule(columns, default)


def _combine(rule: str, old: Any, new: Any, column: str) -> Any:
    if rule == "sum":
        return new if old is None else old if new is None else old + new
    if rule in ("max", "min"):
        if old is None or new is None:
            return new if old is None else old
        return max(old, new) if rule == "max" else min(old, new)
    if rule == "first-non-null":
        return new if old is None else old
    if old != new:  # same
        raise ReplayError(f"column {column!r} must be the same in every partition")
    return old


def merge_rows(rule: MergeRule, old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Merge two versions of one row (``old`` merged first). Columns without a rule keep
    ``old`` only if equal to ``new``; otherwise :class:`ReplayError`."""
    if rule.row_by is not None:
        kind, column = rule.row_by
        a, b = old[column], new[column]
        newer = a is None or (b is not None and (b > a if kind == "latest-by" else b < a))
        return dict(new if newer else old)
    out: dict[str, Any] = {}
    for column, value in old.items():
        col_rule = rule.column_rule(column)
        out[column] = _combine(col_rule or "same", value, new[column], column)
    return out


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def update_clause(
    rule: MergeRule,
    columns: Sequence[str],
    *,
    seeded: str | None = None,
    target: str | None = None,
    dialect: str = "sqlite",
) -> str:
    """The ``SET …`` list of ``ON CONFLICT DO UPDATE`` for ``rule`` over non-key ``columns``.

    ``seeded`` is a SQL expression template (``{col}`` replaced by the column) giving the
    seeded value of the conflicting row, subtracted once per merged partial for ``sum``.
    ``target`` qualifies the existing row's columns (PostgreSQL needs it: a bare column
    there is ambiguous with ``excluded``); ``dialect`` ``postgresql`` writes the two-value
    ``max``/``min`` as ``greatest``/``least``.

    >>> print(update_clause(parse_rule("n=first-non-null, m=max"), ["n", "m"]))
    "n" = coalesce("n", excluded."n"), "m" = CASE WHEN excluded."m" IS NULL THEN "m" ...
    >>> print(update_clause(parse_rule("m=max"), ["m"], target="cur", dialect="postgresql"))
    "m" = CASE WHEN excluded."m" IS NULL THEN cur."m" ... ELSE greatest(cur."m", excluded."m") END
    """
    pg = dialect == "postgresql"
    functions = {"max": "greatest", "min": "least"} if pg else {"max": "max", "min": "min"}

    def cur(column: str) -> str:
        return f"{target}.{_q(column)}" if target else _q(column)

    sets = []
    if rule.row_by is not None:
        kind, by = rule.row_by
        op = ">" if kind == "latest-by" else "<"
        qb, ex = cur(by), f"excluded.{_q(by)}"
        cond = f"({qb} IS NULL AND {ex} IS NOT NULL) OR {ex} {op} {qb}"
        for c in columns:
            sets.append(f"{_q(c)} = CASE WHEN {cond} THEN excluded.{_q(c)} ELSE {cur(c)} END")
        return ", ".join(sets)
    for c in columns:
        col_rule = rule.column_rule(c) or "same"
        qc, ex = cur(c), f"excluded.{_q(c)}"
        if col_rule == "sum":
            add = f"{qc} + {ex}"
            if seeded is not None:
                add = f"{add} - coalesce(({seeded.format(col=_q(c))}), 0)"
            expr = f"CASE WHEN {ex} IS NULL THEN {qc} WHEN {qc} IS NULL THEN {ex} ELSE {add} END"
        elif col_rule in ("max", "min"):
            expr = (
                f"CASE WHEN {ex} IS NULL THEN {qc} WHEN {qc} IS NULL THEN {ex}"
                f" ELSE {functions[col_rule]}({qc}, {ex}) END"
            )
        elif col_rule == "first-non-null":
            expr = f"coalesce({qc}, {ex})"
        else:  # same: checked before the upsert
            expr = qc
        sets.append(f"{_q(c)} = {expr}")
    return ", ".join(sets)


# ---------------------------------------------------------------------------- tables
class TableInfo(NamedTuple):
    """A user table of a read model: its columns, primary key and unique column sets."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    """Primary-key columns (empty: a rowid table without a declared key)."""
    uniques: tuple[tuple[str, ...], ...]
    """Column sets of every UNIQUE constraint/index, the primary key included."""


def _is_framework_table(name: str) -> bool:
    return name.startswith(("sqlite_", "_eventlane_", "_sqlite_migrations"))


def user_tables(conn: sqlite3.Connection, schema: str = "main") -> list[TableInfo]:
    """The projector's tables (not SQLite's, not the framework's, not migration records)."""
    rows = conn.execute(
        f"SELECT name, sql FROM {schema}.sqlite_master WHERE type='table' ORDER BY name"
    ).fetchall()
    out = []
    for name, sql in rows:
        if _is_framework_table(name):
            continue
        if sql and sql.upper().startswith("CREATE VIRTUAL"):
            raise ReplayError(f"table {name!r} is a virtual table; the merge cannot combine it")
        info = conn.execute(f"PRAGMA {schema}.table_info({_q(name)})").fetchall()
        columns = tuple(r[1] for r in info)
        key = tuple(r[1] for r in sorted((r for r in info if r[5] > 0), key=lambda r: r[5]))
        uniques = [key] if key else []
        for idx in conn.execute(f"PRAGMA {schema}.index_list({_q(name)})").fetchall():
            if idx[2] and idx[3] != "pk":
                cols = tuple(
                    r[2]
                    for r in conn.execute(f"PRAGMA {schema}.index_info({_q(idx[1])})").fetchall()
                )
                if None not in cols:
                    uniques.append(cols)
        out.append(TableInfo(name, columns, key, tuple(uniques)))
    return out


# ---------------------------------------------------------------------------- the merge
class Partial(NamedTuple):
    """A partial read model and what it covers (for error messages)."""

    path: Path
    label: str
    """e.g. ``orders/3`` or ``orders/3 keys 1/4``."""


class MergeStats(NamedTuple):
    partials: int
    rows: int
    """Rows of the partials inserted into, or merged with, the output's tables."""
    seconds: float


def _key_text(key: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in key.items())


def _fetch_key(conn: Any, cols: Sequence[str], sql: str) -> dict[str, Any] | None:
    row = conn.execute(sql).fetchone()
    return None if row is None else dict(zip(cols, row, strict=True))


class _Merger:
    """The merge of partials into the database of ``conn``, in SQLite's dialect; a
    subclass gives PostgreSQL's (:class:`_PgMerger`). Names: ``main`` (the output),
    ``part`` (the partial being merged), ``prior`` (one merged before), ``seed_<n>`` (a
    copy of a seeded table); ``same``/``differ``: null-safe (in)equality."""

    main = "main"
    part = "part"
    same = "IS"
    differ = "IS NOT"
    dialect = "sqlite"
    integrity_errors: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)

    def __init__(self, conn: Any, rules: Mapping[str, str], projector: str) -> None:
        self.conn = conn
        self.projector = projector
        self.tables = self._user_tables()
        self.rules = {t: parse_rule(r) for t, r in rules.items()}
        known = {t.name for t in self.tables}
        for ruled in self.rules:
            if ruled not in known:
                raise ReplayError(
                    f"projector {projector!r} declares a merge rule for table {ruled!r}, which its"
                    f" read model does not have (tables: {', '.join(sorted(known)) or 'none'})"
                )
        for t in self.tables:
            rule = self.rules.get(t.name)
            if rule is None:
                continue
            if not t.key:
                raise ReplayError(
                    f"merge rule for table {t.name!r}: the table has no primary key, so rows"
                    " never collide; remove the rule or declare a key"
                )
            named = set(rule.columns) | ({rule.row_by[1]} if rule.row_by else set())
            for c in named:
                if c not in t.columns or c in t.key:
                    raise ReplayError(
                        f"merge rule for table {t.name!r} names column {c!r}, which is not a"
                        " non-key column of the table"
                    )
        self.seeded = self._snapshot_seeds()
        self.done: list[Partial] = []

    # ------------------------------------------------------------ dialect hooks
    def _user_tables(self) -> list[TableInfo]:
        return user_tables(self.conn)

    @contextmanager
    def _opened(self, partial: Partial, name: str) -> Iterator[str]:
        """``partial`` readable as ``<qualifier>.<table>``; yields the qualifier."""
        self.conn.execute(f"ATTACH DATABASE ? AS {name}", (str(partial.path),))
        try:
            yield name
        finally:
            self.conn.execute(f"DETACH DATABASE {name}")

    def _in_transaction(self) -> bool:
        return bool(self.conn.in_transaction)

    def _seed_name(self, t: TableInfo) -> str:
        return f"temp.seed_{self.tables.index(t)}"

    def drop_seeds(self) -> None:
        for t in self.tables:
            self.conn.execute(f"DROP TABLE IF EXISTS {self._seed_name(t)}")

    # ------------------------------------------------------------ the merge
    def _snapshot_seeds(self) -> set[str]:
        """Tables ``setup`` seeded: copy their rows into temporary tables ``seed_<n>``."""
        seeded = set()
        for i, t in enumerate(self.tables):
            found = self.conn.execute(f"SELECT 1 FROM {self.main}.{_q(t.name)} LIMIT 1")
            if found.fetchone() is None:
                continue
            if not t.key:
                raise ReplayError(
                    f"table {t.name!r} has rows after setup but no primary key: the partials'"
                    " copies of those rows cannot be told apart; give it a primary key"
                )
            self.conn.execute(
                f"CREATE TEMP TABLE seed_{i} AS SELECT * FROM {self.main}.{_q(t.name)}"
            )
            seeded.add(t.name)
        return seeded

    def merge(self, partial: Partial) -> int:
        conn = self.conn
        with self._opened(partial, "part") as part:
            self.part = part
            conn.execute("BEGIN")
            try:
                rows = sum(self._table(t, partial) for t in self.tables)
                conn.execute(
                    f"INSERT INTO {self.main}._eventlane_dead_letters (topic, partition,"
                    ' "offset", key, value, headers, event_type, error, attempts, status,'
                    ' created_ms, published) SELECT topic, partition, "offset", key, value,'
                    " headers, event_type, error, attempts, status, created_ms, published FROM"
                    f' {part}._eventlane_dead_letters ORDER BY topic, partition, "offset"'
                )
            except BaseException:
                if self._in_transaction():
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        self.done.append(partial)
        return rows

    def _source(self, t: TableInfo) -> str:
        cols = ", ".join(_q(c) for c in t.columns)
        src = f"SELECT {cols} FROM {self.part}.{_q(t.name)}"
        if t.name in self.seeded:  # a row still equal to its seed was not written
            src = f"SELECT * FROM ({src} EXCEPT SELECT {cols} FROM {self._seed_name(t)}) AS u"
        return src

    def _table(self, t: TableInfo, partial: Partial) -> int:
        conn = self.conn
        if conn.execute(f"SELECT 1 FROM {self.part}.{_q(t.name)} LIMIT 1").fetchone() is None:
            return 0
        rule = self.rules.get(t.name)
        cols = ", ".join(_q(c) for c in t.columns)
        pg = self.dialect == "postgresql"
        into = f"{self.main}.{_q(t.name)}" + (" AS cur" if pg else "")
        insert = f"INSERT INTO {into} ({cols}) SELECT * FROM ({self._source(t)}) AS src WHERE true"
        if rule is None or not t.key:
            if t.name in self.seeded:
                self._replace_seeds(t, partial)
            try:
                return int(conn.execute(insert).rowcount)
            except self.integrity_errors as exc:
                self._conflict(t, partial, exc)
        for c in t.columns:
            if c not in t.key and rule.row_by is None and (rule.column_rule(c) or "same") == "same":
                self._check_same(t, c, partial)
        rest = [c for c in t.columns if c not in t.key]
        seeded = None
        if t.name in self.seeded:
            match = " AND ".join(f"s.{_q(k)} {self.same} excluded.{_q(k)}" for k in t.key)
            seeded = f"SELECT s.{{col}} FROM {self._seed_name(t)} s WHERE {match}"
        if rest:
            sets = update_clause(
                rule, rest, seeded=seeded, target="cur" if pg else None, dialect=self.dialect
            )
            action = f"DO UPDATE SET {sets}"
        else:
            action = "DO NOTHING"
        keys = ", ".join(_q(k) for k in t.key)
        try:
            return int(conn.execute(f"{insert} ON CONFLICT ({keys}) {action}").rowcount)
        except self.integrity_errors as exc:
            self._conflict(t, partial, exc, skip_key=True)

    def _replace_seeds(self, t: TableInfo, partial: Partial) -> None:
        """No rule: a seeded row one partial changed replaces the seed; a second change of
        the same row is a conflict (found by the plain insert that follows)."""
        join = " AND ".join(f"a.{_q(k)} {self.same} b.{_q(k)}" for k in t.key)
        same_as_seed = " AND ".join(f"s.{_q(c)} {self.same} a.{_q(c)}" for c in t.columns)
        self.conn.execute(
            f"DELETE FROM {self.main}.{_q(t.name)} AS a WHERE EXISTS (SELECT 1 FROM"
            f" ({self._source(t)}) b WHERE {join}) AND EXISTS (SELECT 1 FROM"
            f" {self._seed_name(t)} s WHERE {same_as_seed})"
        )

    def _check_same(self, t: TableInfo, column: str, partial: Partial) -> None:
        join = " AND ".join(f"a.{_q(k)} {self.same} b.{_q(k)}" for k in t.key)
        select = ", ".join(f"a.{_q(k)}" for k in t.key)
        sql = (
            f"SELECT {select} FROM {self.main}.{_q(t.name)} a JOIN ({self._source(t)}) b ON"
            f" {join} WHERE a.{_q(column)} {self.differ} b.{_q(column)} LIMIT 1"
        )
        key = _fetch_key(self.conn, t.key, sql)
        if key is not None:
            self.conn.execute("ROLLBACK")  # the diagnosis below attaches other files
            raise MergeConflictError(
                f"table {t.name!r}: column {column!r} of key ({_key_text(key)}) differs between"
                f" partition {partial.label} and {self._writers(t, t.key, key)}, and its merge"
                " rule is 'same'",
                table=t.name,
                key=key,
            )

    def _writers(self, t: TableInfo, cols: Sequence[str], key: Mapping[str, Any]) -> str:
        """Which partials merged before wrote ``key`` (for the error message)."""
        found = []
        mark = "%s" if self.dialect == "postgresql" else "?"
        where = " AND ".join(f"{_q(c)} {self.same} {mark}" for c in cols)
        for done in self.done:
            with self._opened(done, "prior") as prior:
                hit = self.conn.execute(
                    f"SELECT 1 FROM {prior}.{_q(t.name)} WHERE {where} LIMIT 1",
                    [key[c] for c in cols],
                ).fetchone()
            if hit:
                found.append(done.label)
        return "partition " + ", ".join(found) if found else "the rows setup created"

    def _overlap_sql(self, table: str, cols: Sequence[str]) -> str:
        select = ", ".join(f"a.{_q(c)}" for c in cols)
        join = " AND ".join(f"a.{_q(c)} {self.same} b.{_q(c)}" for c in cols)
        return (
            f"SELECT {select} FROM {self.main}.{_q(table)} a JOIN {self.part}.{_q(table)} b"
            f" ON {join} LIMIT 1"
        )

    def _conflict(
        self, t: TableInfo, partial: Partial, exc: Exception, skip_key: bool = False
    ) -> NoReturn:
        self.conn.execute("ROLLBACK")  # the diagnosis below attaches other files
        for cols in t.uniques:
            if skip_key and cols == t.key:
                continue
            key = _fetch_key(self.conn, cols, self._overlap_sql(t.name, cols))
            if key is None:
                continue
            what = "key" if cols == t.key else f"unique columns ({', '.join(cols)})"
            if cols == t.key:
                fix = (
                    f"declare how to merge it: merge_rules = {{{t.name!r}: 'sum' | 'max' | 'min'"
                    " | 'first-non-null' | 'same' | 'latest-by:COLUMN' | 'col=rule, ...'} on"
                    f" projector {self.projector!r}"
                )
            else:
                fix = "rows of different keys collide on a unique constraint"
            raise MergeConflictError(
                f"table {t.name!r}: {what} ({_key_text(key)}) was written by partition"
                f" {partial.label} and by {self._writers(t, cols, key)}; {fix}",
                table=t.name,
                key=key,
            ) from exc
        raise ReplayError(f"table {t.name!r}: merging partition {partial.label} failed: {exc}")


class _PgMerger(_Merger):
    """The same merge inside PostgreSQL: the output is schema ``schema`` of the
    connection's database and each partial is another schema of it (``Partial.path`` is
    its name); no row leaves the server."""

    same = "IS NOT DISTINCT FROM"
    differ = "IS DISTINCT FROM"
    dialect = "postgresql"

    def __init__(self, raw: Any, schema: str, rules: Mapping[str, str], projector: str) -> None:
        self.integrity_errors = (integrity_error(),)
        self.schema = schema
        self.main = _q(schema)
        super().__init__(raw, rules, projector)

    def _user_tables(self) -> list[TableInfo]:
        return pg_user_tables(self.conn, self.schema)

    @contextmanager
    def _opened(self, partial: Partial, name: str) -> Iterator[str]:
        yield _q(str(partial.path))

    def _in_transaction(self) -> bool:
        return int(self.conn.info.transaction_status) != 0  # not IDLE

    def _seed_name(self, t: TableInfo) -> str:
        return f"pg_temp.seed_{self.tables.index(t)}"


def pg_user_tables(raw: Any, schema: str) -> list[TableInfo]:
    """:func:`user_tables` of a PostgreSQL schema: its tables but the framework's, with
    their columns in order, primary key and unique column sets (expression indexes left
    out, as on SQLite)."""
    names = [
        str(r[0])
        for r in raw.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
        )
    ]
    out = []
    for name in names:
        if _is_framework_table(name):
            continue
        relation = f"{_q(schema)}.{_q(name)}"
        columns = tuple(
            str(r[0])
            for r in raw.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                " AND NOT attisdropped ORDER BY attnum",
                (relation,),
            )
        )
        key: tuple[str, ...] = ()
        uniques: list[tuple[str, ...]] = []
        indexes = raw.execute(
            "SELECT i.indisprimary, ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH"
            " ORDINALITY AS k(attnum, n) JOIN pg_attribute a ON a.attrelid = i.indrelid AND"
            " a.attnum = k.attnum ORDER BY k.n) FROM pg_index i WHERE i.indrelid ="
            " %s::regclass AND i.indisunique AND i.indexprs IS NULL ORDER BY"
            " i.indisprimary DESC, i.indexrelid",
            (relation,),
        ).fetchall()
        for primary, cols in indexes:
            if primary:
                key = tuple(cols)
            uniques.append(tuple(cols))
        out.append(TableInfo(name, columns, key, tuple(uniques)))
    return out


def merge_partials(
    conn: sqlite3.Connection,
    partials: Sequence[Partial],
    rules: Mapping[str, str],
    *,
    projector: str = "?",
) -> MergeStats:
    """Merge ``partials`` into the database of ``conn`` (same schema, fresh: only what the
    projector's ``setup`` seeded). Partials are merged in the given order."""
    return _run(_Merger(conn, rules, projector), partials)


def merge_schemas(
    raw: Any,
    schema: str,
    partials: Sequence[Partial],
    rules: Mapping[str, str],
    *,
    projector: str = "?",
) -> MergeStats:
    """:func:`merge_partials` inside PostgreSQL: ``partials`` are schemas of the database of
    ``raw`` (a psycopg connection in autocommit mode; ``Partial.path`` is a schema's name),
    merged into schema ``schema`` with the same rules and the same failures."""
    return _run(_PgMerger(raw, schema, rules, projector), partials)


def _run(merger: _Merger, partials: Sequence[Partial]) -> MergeStats:
    t0 = time.perf_counter()
    rows = 0
    for partial in partials:
        rows += merger.merge(partial)
    merger.drop_seeds()
    stats = MergeStats(len(partials), rows, time.perf_counter() - t0)
    log.info(
        "partials merged",
        projector=merger.projector,
        partials=stats.partials,
        rows=stats.rows,
        seconds=round(stats.seconds, 3),
    )
    return stats

"""A projector's read model in PostgreSQL: one schema holding its tables, positions and
dead letters (the engine chosen by a ``postgresql://`` URL; see :mod:`.store`).

Layout: one schema per projection, named after the projector's local name (its app's
namespace included) made a plain identifier (:func:`schema_name`: ``acme.invoices`` ->
``acme_invoices``). The connection's ``search_path`` is that schema alone, so the
projector's SQL names its tables unqualified, as on SQLite, and two projections never see
each other's tables. The framework's tables (``_eventlane_positions``,
``_eventlane_dead_letters``, ``_eventlane_owner``, ``_eventlane_waiting``,
``_eventlane_parallel_done``) and the record of applied migrations
(``_eventlane_migrations``) live in the same schema, so the schema is the whole read model:
dropping it forgets the projection, renaming it swaps one in.

The promises of the SQLite read model (:mod:`.readmodel`) hold here, by the same code: a
batch, its positions and its dead letters commit in one transaction; inside it each
partition's stored position is checked first (what was applied is skipped), and a writer
whose group generation is older than the stored one is refused (:class:`FencedError`).

Writers of one read model take turns: every transaction begins with
``pg_advisory_xact_lock`` on the schema's key (released by ``COMMIT``/``ROLLBACK``, or by
the server when the session dies), the counterpart of SQLite's write lock and of the lock
file, so handlers' read-modify-write statements never lose an update whatever isolation
they assume, on any number of hosts. A writer waits at most ``lock_timeout``
(:data:`~eventlane.projection.readmodel.BUSY_TIMEOUT_S`), then fails with
:class:`~eventlane.errors.ProjectionError`; the server ends a session idle inside a
transaction for as long (``idle_in_transaction_session_timeout``), so a worker frozen by
SIGSTOP while holding the lock loses its transaction (nothing of it is kept) instead of
stopping the others.

The framework's own statements are written once, in SQLite's dialect; :func:`pg_sql`
rewrites the few differences (placeholders, the ``offset`` column name, ``INTEGER`` widths,
``WITHOUT ROWID``, ``INSERT OR IGNORE``) for the connection :attr:`PgReadModel.conn` that the
framework uses. A projector's handlers get the driver's own connection (``ctx.db`` /
``ctx.conn``, a ``psycopg.Connection``: ``%s`` placeholders) and the portable table API
(``ctx.table``, :mod:`.tables`).

Migrations: a projector's ``Migrations`` set (the same object as on SQLite) is applied by
:func:`apply_pg_migrations`: each migration function gets the psycopg connection, runs in
the read-model transaction (under the lock) and is recorded in ``_eventlane_migrations``.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from eventlane.errors import (
    ConfigError,
    FencedError,
    ProjectionError,
    ReadModelUnavailableError,
    error_chain,
)
from eventlane.log import TopicPartition
from eventlane.observability import get_logger
from eventlane.projection import fencing
from eventlane.projection._sqlite_utils import Migrations
from eventlane.projection.tables import Dialect

log = get_logger("eventlane.projection")

BUSY_TIMEOUT_S = 60.0
FRAMEWORK_SET = "eventlane.read_model"

_FRAMEWORK_DDL: list[tuple[str, list[str]]] = [
    (
        "m001_positions_and_dead_letters",
        [
            """CREATE TABLE IF NOT EXISTS _eventlane_positions (
                topic TEXT NOT NULL, partition BIGINT NOT NULL, next_offset BIGINT NOT NULL,
                generation BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (topic, partition))""",
            """CREATE TABLE IF NOT EXISTS _eventlane_dead_letters (
                id BIGSERIAL PRIMARY KEY, topic TEXT NOT NULL, partition BIGINT NOT NULL,
                "offset" BIGINT NOT NULL, key BYTEA, value BYTEA, headers TEXT NOT NULL,
                event_type TEXT, error TEXT NOT NULL, attempts BIGINT NOT NULL,
                status TEXT NOT NULL, created_ms BIGINT NOT NULL,
                published BIGINT NOT NULL DEFAULT 0, UNIQUE (topic, partition, "offset"))""",
            "CREATE INDEX IF NOT EXISTS _eventlane_dead_letters_key ON _eventlane_dead_letters"
            " (key, status)",
        ],
    ),
    (
        "m002_dead_letter_status_index",
        [
            "CREATE INDEX IF NOT EXISTS _eventlane_dead_letters_status ON"
            " _eventlane_dead_letters (status, topic, key)"
        ],
    ),
    (
        "m003_owner_and_waiting",
        [
            "CREATE TABLE IF NOT EXISTS _eventlane_owner (app TEXT NOT NULL)",
            """CREATE TABLE IF NOT EXISTS _eventlane_waiting (
                topic TEXT NOT NULL, partition BIGINT NOT NULL, "offset" BIGINT NOT NULL,
                event_type TEXT NOT NULL, version BIGINT NOT NULL,
                known_version BIGINT NOT NULL, since_ms BIGINT NOT NULL,
                PRIMARY KEY (topic, partition))""",
        ],
    ),
]
"""The framework's tables, by migration name (recorded under :data:`FRAMEWORK_SET`)."""


def _psycopg() -> Any:
    try:
        import psycopg  # noqa: PLC0415 (an extra: imported when a URL names it)
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ConfigError(
            "a postgresql:// read model needs psycopg: pip install 'eventlane[postgres]'"
        ) from exc
    return psycopg


def integrity_error() -> type[Exception]:
    """psycopg's base class of constraint violations (for code that may not import it)."""
    return _psycopg().errors.IntegrityError  # type: ignore[no-any-return]


def is_postgres_url(url: str | None) -> bool:
    return bool(url) and str(url).startswith(("postgresql://", "postgres://"))


def schema_name(local_name: str) -> str:
    """The schema of a projection: its local name, lower case, other characters ``_``."""
    name = re.sub(r"[^a-z0-9_]", "_", local_name.lower())
    if not name or name[0].isdigit():
        name = f"p_{name}"
    if len(name.encode()) > 63:
        digest = hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
        name = f"{name[:54]}_{digest}"
    return name


def derived_schema(schema: str, suffix: str) -> str:
    """A schema beside ``schema`` for one of its rebuilds (``suffix``: ``shadow``,
    ``rebuild``, ``old``): ``<schema>__<suffix>``, shortened as :func:`schema_name` does."""
    name = f"{schema}__{suffix}"
    if len(name.encode()) > 63:
        digest = hashlib.blake2b(schema.encode(), digest_size=4).hexdigest()
        name = f"{schema[: 62 - len(suffix) - 11]}_{digest}__{suffix}"
    return name


def _stage_base(schema: str) -> str:
    """The common start of the stage names of builds of ``schema`` (at most 44 bytes, so a
    stage name fits PostgreSQL's 63)."""
    if len(schema.encode()) <= 41:
        return f"{schema}__p"
    digest = hashlib.blake2b(schema.encode(), digest_size=4).hexdigest()
    return f"{schema[:32]}_{digest}__p"


def stage_schema(schema: str, task: int, attempt: int) -> str:
    """The schema one attempt of one Spark task of a build of ``schema`` writes
    (:mod:`eventlane.replay.pg_build`).

    >>> stage_schema("balances__shadow", 3, 0)
    'balances__shadow__p00003a0'
    """
    return f"{_stage_base(schema)}{task:05d}a{attempt}"


def stage_schemas(raw: Any, schema: str) -> list[str]:
    """The stage schemas of builds of ``schema`` in the database of ``raw``."""
    pattern = _stage_base(schema).replace("_", "\\_") + "%"
    rows = raw.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s ORDER BY 1", (pattern,)
    )
    return [str(r[0]) for r in rows]


def lock_key(schema: str) -> int:
    """The advisory-lock key of a schema (a signed 64-bit integer)."""
    digest = hashlib.blake2b(f"eventlane:{schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


_OFFSET = re.compile(r'(?<!["\w])offset(?!["\w])')
_IGNORE = re.compile(r"^\s*INSERT OR IGNORE INTO (.*)$", re.S)


@functools.lru_cache(maxsize=512)
def pg_sql(sql: str) -> str:
    """One of the framework's statements (SQLite dialect) in PostgreSQL's."""
    out = sql.replace("?", "%s").replace(" WITHOUT ROWID", "")
    out = _OFFSET.sub('"offset"', out)
    out = re.sub(r"\bINTEGER\b", "BIGINT", out)
    found = _IGNORE.match(out)
    if found:
        out = f"INSERT INTO {found.group(1)} ON CONFLICT DO NOTHING"
    return out


class FrameworkConnection:
    """The framework's view of the read model's connection: SQLite's dialect in, rewritten
    by :func:`pg_sql`; ``in_transaction`` as on ``sqlite3``. Handlers never get it."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        return self.raw.execute(pg_sql(sql), tuple(params) if params else None)

    def executemany(self, sql: str, rows: Any) -> None:
        rows = list(rows)
        if rows:
            with self.raw.cursor() as cur:
                cur.executemany(pg_sql(sql), rows)

    @property
    def in_transaction(self) -> bool:
        """Inside a usable transaction (a failed statement outside a savepoint aborts it:
        ``ROLLBACK TO`` a savepoint makes it usable again)."""
        from psycopg.pq import TransactionStatus  # noqa: PLC0415 (the extra)

        return bool(self.raw.info.transaction_status == TransactionStatus.INTRANS) or bool(
            self.raw.info.transaction_status == TransactionStatus.INERROR
        )


def _connect(url: str, schema: str) -> Any:
    psycopg = _psycopg()
    try:
        conn = psycopg.connect(url, autocommit=True, application_name="eventlane")
    except psycopg.OperationalError as exc:
        raise ReadModelUnavailableError(
            f"cannot connect to the read model's database: {exc}"
        ) from exc
    ms = int(BUSY_TIMEOUT_S * 1000)
    conn.execute(f"SET lock_timeout = {ms}")
    conn.execute(f"SET idle_in_transaction_session_timeout = {ms}")
    # concurrent CREATE ... IF NOT EXISTS can collide in the catalog: under the schema's lock
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema),))
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(
            "CREATE TABLE IF NOT EXISTS _eventlane_migrations (id BIGSERIAL PRIMARY KEY,"
            " migration_set TEXT NOT NULL, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL"
            " DEFAULT now(), UNIQUE (migration_set, name))"
        )
    return conn


class PgReadModel:
    """An open PostgreSQL read model (see the module docstring): the same methods as
    :class:`~eventlane.projection.readmodel.ReadModel`. One connection; thread-safe
    through a lock.

    Every transaction checks, under the lock, that the schema is still the one opened
    (its OID): after a rebuild's swap renamed another schema to this name, a transaction
    raises :class:`FencedError` and sets :attr:`replaced`, so a worker never applies a
    batch with caches (parked keys, waits) of the schema that was swapped out; it reopens
    the read model and seeks to the positions stored in the new one."""

    dialect: Dialect = "postgresql"

    def __init__(self, url: str, schema: str, path: Path) -> None:
        self.url = url
        self.schema = schema
        self.path = path
        """Where the projection's local files are (the breaker record): not the data."""
        self.raw = _connect(url, schema)
        self.conn = FrameworkConnection(self.raw)
        self.db = self.raw
        """What handlers and migrations get: the psycopg connection itself."""
        self.user_conn = self.raw
        self._lock = threading.RLock()
        self._depth = 0
        self._key = lock_key(schema)
        self._oid = self._schema_oid()
        self.replaced = False
        """Set when a transaction found the schema replaced (a rebuild's swap renamed
        another schema to this name): this object's caches describe the old one."""
        self.framework_migrations_applied: list[str] = []
        if self._pending_framework():
            with self.transaction():
                names = self._pending_framework()
                for name, statements in _FRAMEWORK_DDL:
                    if name in names:
                        for ddl in statements:
                            self.raw.execute(ddl)
                        _record(self.raw, FRAMEWORK_SET, name)
            self.framework_migrations_applied = names

    def __repr__(self) -> str:
        return f"PgReadModel(schema={self.schema!r})"

    @property
    def location(self) -> str:
        """Where the read model is, for messages: its schema and database (no password)."""
        info = self.raw.info
        return f"schema {self.schema} of postgresql://{info.host}:{info.port}/{info.dbname}"

    def _schema_oid(self) -> int | None:
        # a scan of pg_namespace locks it, which makes the server read the catalog
        # changes committed meanwhile (a swap's rename)
        row = self.raw.execute(
            "SELECT oid FROM pg_namespace WHERE nspname = %s", (self.schema,)
        ).fetchone()
        return None if row is None else int(row[0])

    def _pending_framework(self) -> list[str]:
        done = set(applied_names(self.raw, FRAMEWORK_SET))
        return [name for name, _ in _FRAMEWORK_DDL if name not in done]

    # ------------------------------------------------------------------ transactions
    @contextmanager
    def transaction(self) -> Iterator[FrameworkConnection]:
        """``BEGIN`` + the schema's advisory lock … ``COMMIT`` (``ROLLBACK`` on any
        exception). A lost connection raises
        :class:`~eventlane.errors.ReadModelUnavailableError` (the outcome is unknown)."""
        psycopg = _psycopg()
        with self._lock:
            if self._depth:
                raise ProjectionError(f"nested read-model transaction on {self.location}")
            self._depth += 1
            try:
                self.raw.execute("BEGIN")
                try:
                    try:
                        self.raw.execute("SELECT pg_advisory_xact_lock(%s)", (self._key,))
                    except psycopg.errors.LockNotAvailable as exc:
                        raise ProjectionError(
                            f"the writer lock of {self.location} was held for"
                            f" {BUSY_TIMEOUT_S:.0f} s by another session (a writer frozen"
                            " inside its transaction?)"
                        ) from exc
                    if self._schema_oid() != self._oid:
                        self.replaced = True
                        raise FencedError(
                            f"schema {self.schema} was replaced (a rebuild's swap) since this"
                            " connection opened it: reopen the read model"
                        )
                    yield self.conn
                except BaseException:
                    if not self._broken() and self.raw.info.transaction_status != 0:
                        self.raw.execute("ROLLBACK")
                    raise
                self.raw.execute("COMMIT")
            except psycopg.OperationalError as exc:
                if self._broken():
                    raise ReadModelUnavailableError(
                        f"lost the connection to {self.location} ({str(exc).strip()});"
                        " whether the transaction committed is unknown: its positions say"
                    ) from exc
                raise
            finally:
                self._depth -= 1

    def _broken(self) -> bool:
        return bool(self.raw.closed or self.raw.broken)

    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def transient(self, exc: BaseException) -> bool:
        """Whether a handler's ``exc`` is the server's doing, not the handler's, on a
        connection still up: psycopg's ``OperationalError`` family (a lock wait past
        ``lock_timeout``, a deadlock, a serialization failure, a cancelled statement, a full
        disk, out of memory) — :class:`~eventlane.errors.ReadModelBusyError`, never a dead
        letter; a cause or context chained to it counts. A broken connection is not this
        (the transaction reports it: :class:`~eventlane.errors.ReadModelUnavailableError`)."""
        operational = _psycopg().OperationalError
        return not self._broken() and any(isinstance(e, operational) for e in error_chain(exc))

    # ------------------------------------------------------------------ positions
    def positions(self) -> dict[TopicPartition, int]:
        rows = self.raw.execute("SELECT topic, partition, next_offset FROM _eventlane_positions")
        return {TopicPartition(t, int(p)): int(o) for t, p, o in rows}

    def position(self, tp: TopicPartition) -> int | None:
        row = self.raw.execute(
            "SELECT next_offset FROM _eventlane_positions WHERE topic=%s AND partition=%s",
            (tp.topic, tp.partition),
        ).fetchone()
        return None if row is None else int(row[0])

    def is_fresh(self) -> bool:
        return self.raw.execute("SELECT 1 FROM _eventlane_positions LIMIT 1").fetchone() is None

    def claim(
        self,
        tp: TopicPartition,
        generation: int,
        start: int,
        still_owned: Callable[[], bool] | None = None,
        floor: int | None = None,
    ) -> int:
        """As :meth:`ReadModel.claim <eventlane.projection.readmodel.ReadModel.claim>`."""
        with self.transaction() as conn:
            return fencing.claim(conn, tp, generation, start, still_owned, floor)

    def check_and_advance(
        self,
        conn: Any,
        tp: TopicPartition,
        generation: int,
        first: int,
        next_offset: int,
    ) -> int:
        """As :meth:`ReadModel.check_and_advance
        <eventlane.projection.readmodel.ReadModel.check_and_advance>`."""
        return fencing.check_and_advance(conn, tp, generation, first, next_offset)

    def close(self) -> None:
        with self._lock:
            self.raw.close()


# ---------------------------------------------------------------------------- schemas
def connect_admin(url: str) -> Any:
    """A plain autocommit connection (no schema, no lock): for reading or dropping schemas.
    Use it as a context manager (closed on exit)."""
    psycopg = _psycopg()
    try:
        conn = psycopg.connect(url, autocommit=True, application_name="eventlane-admin")
    except psycopg.OperationalError as exc:
        raise ReadModelUnavailableError(
            f"cannot connect to the read model's database: {exc}"
        ) from exc
    conn.execute(f"SET lock_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return conn


def schema_exists(raw: Any, schema: str) -> bool:
    row = raw.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row is not None


def drop_schema(url: str, schema: str) -> bool:
    """Drop ``schema`` and everything in it, under its writer lock (a writer of it finishes
    its transaction first); return whether it existed.

    A session that keeps one of its tables locked (a reader's open transaction) for
    ``lock_timeout`` refuses it: :class:`~eventlane.errors.ProjectionError` (as a writer
    lock held too long), nothing dropped; a lost connection:
    :class:`ReadModelUnavailableError` (whether it was dropped is unknown)."""
    psycopg = _psycopg()
    try:
        with connect_admin(url) as raw, raw.transaction():
            raw.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema),))
            existed = schema_exists(raw, schema)
            raw.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except psycopg.errors.LockNotAvailable as exc:
        raise ProjectionError(
            f"schema {schema} not dropped: another session kept it locked for"
            f" {BUSY_TIMEOUT_S:g} s (a reader's open transaction?); try again once it ends"
        ) from exc
    except psycopg.Error as exc:
        raise ReadModelUnavailableError(
            f"dropping schema {schema}: the database connection failed ({exc}); whether it"
            " was dropped is unknown"
        ) from exc
    return existed


class SchemaCheck(NamedTuple):
    """What ``eventlane verify`` found in one read-model schema."""

    schema: str
    tables: int
    positions: int
    problems: list[str]

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


def check_schemas(url: str, hwm: Callable[[str, int], int | None]) -> list[SchemaCheck]:
    """Check every eventlane read model of the database at ``url`` (each schema holding
    ``_eventlane_positions``, rebuild schemas included), read-only with a statement
    timeout: each table reads in full (a heap scan: what a damaged page breaks), and no
    stored position is past its partition's high-water mark (``hwm(topic, partition)``;
    ``None``: no such partition), which would mean the log lost records the read model
    had applied (e.g. a log restored from an older backup)."""
    out: list[SchemaCheck] = []
    with connect_admin(url) as raw:
        raw.execute("SET default_transaction_read_only = on")
        raw.execute(f"SET statement_timeout = {PgReadModelView.STATEMENT_TIMEOUT_MS}")
        schemas = [
            str(r[0])
            for r in raw.execute(
                "SELECT table_schema FROM information_schema.tables WHERE"
                " table_name = '_eventlane_positions' ORDER BY 1"
            )
        ]
        psycopg = _psycopg()
        for schema in schemas:
            problems: list[str] = []
            tables = [
                str(r[0])
                for r in raw.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
                )
            ]
            for table in tables:
                try:
                    raw.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()
                except psycopg.Error as exc:
                    problems.append(f"table {table} does not read in full: {exc}")
            rows = raw.execute(
                f'SELECT topic, partition, next_offset FROM "{schema}"._eventlane_positions'
                " ORDER BY 1, 2"
            ).fetchall()
            for topic, partition, position in rows:
                end = hwm(str(topic), int(partition))
                if end is None:
                    problems.append(
                        f"position of {topic}/{partition}: no such partition in the log"
                    )
                elif int(position) > end:
                    problems.append(
                        f"position of {topic}/{partition} is {position}, past the log's"
                        f" high-water mark {end}: the log lost records this read model applied"
                    )
            out.append(SchemaCheck(schema, len(tables), len(rows), problems))
    return out


# ---------------------------------------------------------------------------- erasure
_SEGMENT = "^[0-9A-F]{24}$"
_STATISTICS = ("pg_catalog.pg_statistic", "pg_catalog.pg_statistic_ext_data")


def erase_dropped(url: str) -> list[str]:
    """After schemas that held erased data were dropped (committed): remove what is left of
    their rows in the database's files, and say what may still hold it (empty: nothing).

    A dropped table's files are truncated at commit and unlinked at the next checkpoint;
    two other places keep copies of its values:

    * the planner's statistics (``pg_statistic``: most common values and histogram bounds
      that ``ANALYZE``, autovacuum's included, copied from the table). Dropping the table
      deletes its statistics rows, but a deleted row keeps its bytes in the catalog's file
      until the file is rewritten: so ``VACUUM FULL`` both statistics catalogs (a new file;
      the old one is unlinked at the checkpoint);
    * the write-ahead log: this switches to a new WAL segment and checkpoints, twice, so
      every segment up to the one current at the start is removed; then it checks that
      none of those is left in ``pg_wal`` (``wal_keep_size``, a replication slot or an
      archiver behind keeps them) and that the server runs with ``wal_recycle = off``
      (otherwise a removed segment is renamed for reuse and keeps its old bytes until it is
      overwritten, under a future name no check can tell).

    Needs a superuser (``VACUUM FULL`` of a catalog, ``CHECKPOINT``, ``pg_switch_wal()``,
    ``pg_ls_waldir()``); a refusal is reported, never taken as done. Standbys, archives and
    backups hold their own copies, beyond its reach.
    """
    psycopg = _psycopg()
    problems: list[str] = []
    try:
        with connect_admin(url) as raw:
            for catalog in _STATISTICS:
                raw.execute(f"VACUUM FULL {catalog}")
            first = str(raw.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()[0])
            for _ in range(2):
                raw.execute("SELECT pg_switch_wal()")
                raw.execute("CHECKPOINT")
            if str(raw.execute("SHOW wal_recycle").fetchone()[0]) != "off":
                problems.append(
                    "the server runs with wal_recycle = on: the WAL segments that held the"
                    " rows are renamed for reuse and keep their bytes until overwritten; set"
                    " wal_recycle = off (ALTER SYSTEM, then SELECT pg_reload_conf()) and run"
                    " forget again"
                )
            kept = raw.execute(
                "SELECT count(*), min(name) FROM pg_ls_waldir() WHERE name ~ %s AND name <= %s",
                (_SEGMENT, first),
            ).fetchone()
            if int(kept[0]):
                problems.append(
                    f"{kept[0]} WAL segment(s) from {kept[1]} that may hold the rows are still"
                    " kept in pg_wal (wal_keep_size, a replication slot or an archiver behind"
                    " keeps them): run forget again once they are released"
                )
    except (psycopg.Error, ReadModelUnavailableError) as exc:
        problems.append(
            f"cannot erase the dropped rows' copies ({exc}): forget needs a superuser role"
            " (VACUUM FULL of pg_statistic, CHECKPOINT, pg_switch_wal(), pg_ls_waldir())"
        )
    return problems


# ---------------------------------------------------------------------------- migrations
def applied_names(raw: Any, migration_set: str) -> list[str]:
    """Names of ``migration_set`` applied to the connection's schema, in order."""
    rows = raw.execute(
        "SELECT name FROM _eventlane_migrations WHERE migration_set=%s ORDER BY id",
        (migration_set,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def _record(raw: Any, migration_set: str, name: str) -> None:
    raw.execute(
        "INSERT INTO _eventlane_migrations (migration_set, name) VALUES (%s, %s)",
        (migration_set, name),
    )


def pending_pg_migrations(migrations: Migrations | None, readmodel: PgReadModel) -> list[str]:
    if migrations is None:
        return []
    done = set(applied_names(readmodel.raw, migrations.name))
    return [m.name for m in migrations._migrations if m.name not in done]


def any_pg_applied(migrations: Migrations, readmodel: PgReadModel) -> bool:
    return bool(applied_names(readmodel.raw, migrations.name))


def apply_pg_migrations(migrations: Migrations | None, readmodel: PgReadModel) -> list[str]:
    """Apply the pending ``migrations`` in one read-model transaction (under the lock);
    return the names applied. PostgreSQL's DDL is transactional: a failing migration leaves
    nothing behind, ``transactional=False`` ones included."""
    if migrations is None or not pending_pg_migrations(migrations, readmodel):
        return []
    with readmodel.transaction():
        names = pending_pg_migrations(migrations, readmodel)  # again, under the lock
        by_name = {m.name: m for m in migrations._migrations}
        for name in names:
            by_name[name].fn(readmodel.raw)
            _record(readmodel.raw, migrations.name, name)
    if names:
        log.info("read-model migrations applied", schema=readmodel.schema, migrations=names)
    return names


# ---------------------------------------------------------------------------- read-only
class PgReadModelView:
    """A read-only session on a PostgreSQL read model (status, lag, dead letters): a
    ``READ ONLY`` session with a statement timeout; a schema that does not exist yet reads
    as "nothing applied"."""

    STATEMENT_TIMEOUT_MS = 5000

    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self.schema = schema
        self.path = Path(f"postgresql:{schema}")
        self._raw: Any = None

    def _connect(self) -> FrameworkConnection | None:
        if self._raw is None:
            psycopg = _psycopg()
            raw = psycopg.connect(self.url, autocommit=True, application_name="eventlane-view")
            raw.execute("SET default_transaction_read_only = on")
            raw.execute(f"SET statement_timeout = {self.STATEMENT_TIMEOUT_MS}")
            found = raw.execute(
                "SELECT 1 FROM information_schema.tables WHERE table_schema=%s AND"
                " table_name='_eventlane_positions'",
                (self.schema,),
            ).fetchone()
            if found is None:
                raw.close()
                return None
            raw.execute(f'SET search_path TO "{self.schema}"')
            self._raw = raw
        return FrameworkConnection(self._raw)

    @property
    def conn(self) -> FrameworkConnection | None:
        return self._connect()

    def positions(self) -> dict[TopicPartition, int]:
        conn = self._connect()
        if conn is None:
            return {}
        rows = conn.execute("SELECT topic, partition, next_offset FROM _eventlane_positions")
        return {TopicPartition(t, int(p)): int(o) for t, p, o in rows}

    def generations(self) -> dict[TopicPartition, int]:
        conn = self._connect()
        if conn is None:
            return {}
        rows = conn.execute("SELECT topic, partition, generation FROM _eventlane_positions")
        return {TopicPartition(t, int(p)): int(g) for t, p, g in rows}

    def dead_letter_counts(self) -> dict[str, int]:
        conn = self._connect()
        if conn is None:
            return {}
        rows = conn.execute("SELECT status, count(*) FROM _eventlane_dead_letters GROUP BY status")
        return {str(s): int(n) for s, n in rows}

    def table_rows(self) -> dict[str, int]:
        """Rows per table of the projector (the framework's tables left out); each count
        bounded by the statement timeout."""
        conn = self._connect()
        if conn is None:
            return {}
        names = [
            str(r[0])
            for r in self._raw.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (self.schema,)
            )
            if not str(r[0]).startswith("_eventlane_")
        ]
        return {
            n: int(self._raw.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0]) for n in names
        }

    def pending_migrations(self, migrations: Migrations) -> list[str]:
        conn = self._connect()
        if conn is None:
            return [m.name for m in migrations._migrations]
        done = set(applied_names(self._raw, migrations.name))
        return [m.name for m in migrations._migrations if m.name not in done]

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None

    def __enter__(self) -> PgReadModelView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

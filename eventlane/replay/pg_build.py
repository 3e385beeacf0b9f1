"""Rebuilds of a read model kept in PostgreSQL: build into a schema, compare two schemas.

A projection whose read model is in PostgreSQL (:mod:`eventlane.projection.postgres`, a
schema per projection) is rebuilt into another schema of the same database, beside the
live one (:func:`~eventlane.projection.postgres.derived_schema`):

* ``<schema>__rebuild``: ``eventlane rebuild`` without ``--swap`` (``--as-of`` included),
  a read model users query next to the live one; replaced by the next rebuild;
* ``<schema>__shadow``: the hand-off's build (:func:`eventlane.replay.handoff.rebuild_and_swap`),
  renamed to the live name by the swap.

A build schema is an ordinary read-model schema (the framework's tables, the projector's
migrations) written by the projector's own handlers through
:class:`~eventlane.projection.BatchApplier` with ``replaying=True``, exactly as a build file
(:mod:`.build`). Its finished form matches a finished build file: ``_eventlane_positions``
holds the end vector ``E`` (generation 0), the dead letters of the build are marked
published (reported, never copied to the live ``<group>.dlq`` topic). Only durability is
relaxed while building (``synchronous_commit = off``): a build that dies is dropped and
started again, and the swap's own commit flushes the log up to it.

A Spark rebuild (:mod:`.spark`) builds the same schema from *stage* schemas: each task
replays its partition (or key group) into its own ``<schema>__p<task>a<attempt>``
(:func:`~eventlane.projection.postgres.stage_schema`, an ordinary build schema written by
the same handlers), and the driver merges them inside the server
(:func:`~eventlane.replay.merge.merge_schemas`, the projector's ``merge_rules``) into the
freshly made schema, then finalizes it as above. A build of a schema replaces any earlier
build of it, as the local engine does: its stages (those of a build killed before it could
drop them included) are dropped when it starts and when it ends (:func:`drop_stages`).

Comparisons (``--verify``): :func:`schema_checksums` reads every table of a schema with the
checksums of :mod:`.checksum` (the same multiset hash; values as psycopg returns them), and
:func:`compare_live_schema` compares a rebuilt schema with the live one inside one
``REPEATABLE READ`` snapshot, when the live positions stand at the build's end vector.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from eventlane.app import App
from eventlane.log import TopicPartition
from eventlane.projection import Projector, apply_migrations
from eventlane.projection.postgres import (
    PgReadModel,
    connect_admin,
    drop_schema,
    stage_schema,
    stage_schemas,
)
from eventlane.replay.build import DeadLetterReport
from eventlane.replay.checksum import DEAD_LETTERS, FRAMEWORK_COLUMNS, TableChecksum, table_sum

__all__ = [
    "PgTarget",
    "drop_stages",
    "finalize_schema",
    "open_schema_build",
    "schema_checksums",
    "schema_dead_letters",
    "schema_positions",
    "stage_schema",
]


class PgTarget(NamedTuple):
    """Where a rebuild of a PostgreSQL read model writes: ``schema`` of the database at
    ``url``; ``path`` is the projection's local file path (its breaker record only)."""

    url: str
    schema: str
    path: Path

    @property
    def display(self) -> Path:
        """How results name it (:attr:`RebuildResult.path <eventlane.replay.rebuild.
        RebuildResult.path>`): ``postgresql:<schema>``."""
        return Path(f"postgresql:{self.schema}")


def open_schema_build(target: PgTarget, app: App, name: str) -> tuple[Projector, PgReadModel]:
    """A fresh build schema (any old one is dropped) with the projector's migrations."""
    drop_schema(target.url, target.schema)
    readmodel = PgReadModel(target.url, target.schema, target.path)
    try:
        readmodel.raw.execute("SET synchronous_commit = off")
        cls = app.projector(name)
        apply_migrations(cls.migrations, readmodel)
    except BaseException:
        readmodel.close()
        raise
    return cls(), readmodel


def drop_stages(url: str, schema: str) -> list[str]:
    """Drop every stage schema of builds of ``schema``; return their names."""
    with connect_admin(url) as raw:
        names = stage_schemas(raw, schema)
    for name in names:
        drop_schema(url, name)
    return names


def finalize_schema(
    readmodel: PgReadModel,
    end: Mapping[TopicPartition, int],
) -> None:
    """Store positions ``end`` (generation 0) and mark the build's dead letters published."""
    with readmodel.transaction() as conn:
        conn.execute("DELETE FROM _eventlane_positions")
        conn.executemany(
            "INSERT INTO _eventlane_positions (topic, partition, next_offset, generation)"
            " VALUES (?, ?, ?, 0)",
            [(tp.topic, tp.partition, off) for tp, off in sorted(end.items())],
        )
        conn.execute("UPDATE _eventlane_dead_letters SET published=1 WHERE published=0")


def schema_dead_letters(url: str, schema: str) -> list[DeadLetterReport]:
    """The dead letters of a build schema, in source order."""
    with connect_admin(url) as raw:
        rows = raw.execute(
            f'SELECT topic, partition, "offset", event_type, status, error FROM "{schema}".'
            f'{DEAD_LETTERS} ORDER BY topic, partition, "offset"'
        ).fetchall()
    return [DeadLetterReport(t, int(p), int(o), e, s, err) for t, p, o, e, s, err in rows]


def schema_positions(raw: Any, schema: str) -> dict[TopicPartition, int]:
    """The positions stored in ``schema`` ({} where it has no positions table)."""
    return stored_positions(raw, schema) or {}


def stored_positions(raw: Any, schema: str) -> dict[TopicPartition, int] | None:
    """The positions stored in ``schema``; None where it has no positions table (no read
    model there)."""
    rows = raw.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = '_eventlane_positions'",
        (schema,),
    ).fetchone()
    if rows is None:
        return None
    found = raw.execute(
        f'SELECT topic, partition, next_offset FROM "{schema}"._eventlane_positions'
    )
    return {TopicPartition(t, int(p)): int(o) for t, p, o in found}


def schema_checksums(raw: Any, schema: str, *, framework: bool = True) -> dict[str, TableChecksum]:
    """:func:`~eventlane.replay.checksum.table_checksums` of every table of ``schema``
    (run it inside one transaction for one snapshot)."""
    tables = [
        str(r[0])
        for r in raw.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
        )
    ]
    out: dict[str, TableChecksum] = {}
    for name in tables:
        if name in FRAMEWORK_COLUMNS:
            if framework:
                out[name] = table_sum(raw, name, FRAMEWORK_COLUMNS[name], schema=schema)
            continue
        if name.startswith("_eventlane_"):
            continue
        columns = [
            str(r[0])
            for r in raw.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
                " AND table_name = %s",
                (schema, name),
            )
        ]
        out[name] = table_sum(raw, name, columns, schema=schema)
    return out

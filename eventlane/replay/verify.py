"""Verification: a rebuilt model against the reference engine and against the live model.

* **engine**: the same history ``[LWM, E)`` rebuilt by the local engine (one process, no
  merge) must give the same checksum for every table — user tables, positions and dead
  letters (see :mod:`.checksum`); for a schema, the local engine builds the scratch schema
  ``<schema>__verify`` beside it (dropped afterwards).
* **live**: the live read model (its file, or its PostgreSQL schema: :mod:`.pg_build`),
  when it stands at ``E`` (for every partition its position
  is ``E``, or only compacted-away offsets lie between), must hold the same user tables.
  A live model elsewhere (lagging, or already past ``E``) is reported as not comparable,
  which is not a difference.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path

import attrs

from eventlane.app import App, Runtime
from eventlane.log import Log, TopicPartition
from eventlane.projection.postgres import (
    connect_admin,
    derived_schema,
    drop_schema,
    schema_exists,
    schema_name,
)
from eventlane.projection.store import app_readmodel_url
from eventlane.replay.build import remove_db
from eventlane.replay.checksum import (
    DEAD_LETTERS,
    POSITIONS,
    TableDiff,
    compare,
    file_checksums,
    positions_of,
    table_checksums,
)
from eventlane.replay.pg_build import PgTarget, schema_checksums, schema_positions
from eventlane.replay.rebuild import RebuildResult, rebuild

__all__ = [
    "Comparison",
    "compare_files",
    "compare_live",
    "compare_live_schema",
    "compare_local_schema",
    "live_at",
    "verify_rebuild",
]


@attrs.frozen
class Comparison:
    """One comparison: ``what`` (``local engine``, ``live``), per-table results, and why it
    was skipped when it was (``skipped`` set, ``tables`` empty)."""

    what: str
    tables: list[TableDiff]
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return self.skipped is not None or all(d.equal for d in self.tables)

    @property
    def differences(self) -> list[TableDiff]:
        return [d for d in self.tables if not d.equal]


def compare_files(what: str, left: Path, right: Path) -> Comparison:
    """Every table of two read-model files (user tables, positions, dead letters)."""
    return Comparison(what, compare(file_checksums(left), file_checksums(right)))


def live_at(
    log: Log, live: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
) -> str | None:
    """``None`` if positions ``live`` stand at ``end``; otherwise why not."""
    for tp, target in sorted(end.items()):
        pos = live.get(tp)
        if pos is None:
            if target > log.offsets(tp.topic, tp.partition).lwm:
                return f"the live model never applied {tp.topic}/{tp.partition}"
            continue
        if pos > target:
            return f"the live model is past E at {tp.topic}/{tp.partition} ({pos} > {target})"
        if pos < target:
            records, _ = log.read(tp.topic, tp.partition, pos, max_bytes=1, upto=target)
            if records:
                return f"the live model lags at {tp.topic}/{tp.partition} ({pos} < {target})"
    return None


def compare_live(
    log: Log, rebuilt: Path, live_path: Path, end: Mapping[TopicPartition, int]
) -> Comparison:
    """User tables of ``rebuilt`` against the live file, if the live file stands at ``end``."""
    if not live_path.exists():
        return Comparison("live", [], skipped="there is no live read model")
    conn = sqlite3.connect(
        live_path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None, timeout=60
    )
    try:
        conn.execute("BEGIN")  # one snapshot: positions and tables agree
        try:
            why = live_at(log, positions_of(conn), end)
            if why is not None:
                return Comparison("live", [], skipped=why)
            live = table_checksums(conn, framework=False)
        finally:
            conn.execute("COMMIT")
    finally:
        conn.close()
    mine = {k: v for k, v in file_checksums(rebuilt).items() if k not in (POSITIONS, DEAD_LETTERS)}
    return Comparison("live", compare(mine, live))


def compare_live_schema(
    log: Log, url: str, rebuilt: str, live: str, end: Mapping[TopicPartition, int]
) -> Comparison:
    """User tables of schema ``rebuilt`` against the live schema, if the live positions
    stand at ``end`` (both read in one ``REPEATABLE READ`` snapshot)."""
    with connect_admin(url) as raw:
        if not schema_exists(raw, live):
            return Comparison("live", [], skipped="there is no live read model")
        raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            why = live_at(log, schema_positions(raw, live), end)
            if why is not None:
                return Comparison("live", [], skipped=why)
            theirs = schema_checksums(raw, live, framework=False)
            mine = schema_checksums(raw, rebuilt, framework=False)
        finally:
            raw.execute("COMMIT")
    return Comparison("live", compare(mine, theirs))


def compare_local_schema(app: App, log: Log, url: str, result: RebuildResult) -> Comparison:
    """Every table of schema ``result.schema`` (a Spark build) against the local engine's
    build of the same ``E`` into a scratch schema ``<schema>__verify``, dropped after."""
    assert result.schema is not None
    stem = app.names.local(result.projection)
    scratch = derived_schema(schema_name(stem), "verify")
    target = PgTarget(url, scratch, log.local.readmodel(stem))
    try:
        rebuild(app, result.projection, engine="local", end=result.end, output=target, data=log)
        with connect_admin(url) as raw:
            theirs = schema_checksums(raw, scratch)
            mine = schema_checksums(raw, result.schema)
    finally:
        drop_schema(url, scratch)
    return Comparison("local engine", compare(mine, theirs))


def verify_rebuild(runtime: Runtime, result: RebuildResult) -> list[Comparison]:
    """``--verify``: a Spark result against the local engine at the same ``E`` (skipped for
    a local result: it is the reference), and against the live model when it is at ``E``."""
    return verify_replay(runtime.app, runtime.log, result)


def verify_replay(app: App, log: Log, result: RebuildResult) -> list[Comparison]:
    """:func:`verify_rebuild` for an app and an open log (a log an app cannot run on, such
    as Kafka's core log, still replays: no :class:`~eventlane.app.Runtime` needed)."""
    out = []
    stem = app.names.local(result.projection)
    live = log.local.readmodel(stem)
    url = app_readmodel_url(app, result.projection)
    if result.schema is not None and url is not None:
        if result.engine == "local":
            out.append(Comparison("local engine", [], skipped="the result is the local engine's"))
        else:
            out.append(compare_local_schema(app, log, url, result))
        out.append(compare_live_schema(log, url, result.schema, schema_name(stem), result.end))
        return out
    if result.engine == "local":
        out.append(Comparison("local engine", [], skipped="the result is the local engine's"))
    else:
        scratch = live.with_suffix(".verify.sqlite")
        try:
            local = rebuild(
                app, result.projection, engine="local", end=result.end, output=scratch, data=log
            )
            out.append(compare_files("local engine", result.path, local.path))
        finally:
            remove_db(scratch)
    out.append(compare_live(log, result.path, live, result.end))
    return out

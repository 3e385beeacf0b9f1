"""Retiring (or renaming) a projector: remove everything it left in a data directory.

A projector's name is its consumer group and its read model, so a renamed projector starts
afresh under the new name and the old one's state stays behind. :func:`retire_projector`
removes, for one name, in this order: the consumer group (its committed offsets and state;
refused while it has live members), the ``<name>.dlq`` topic, and the files under
``<data>/readmodels/``: ``<name>.sqlite`` with its ``-wal``/``-shm``/``-journal``/``.lock``
siblings (the read model, its positions and its dead letters), ``<name>.rebuild.sqlite``,
``<name>.log``, ``<name>.pause``/``.pause-acks`` and ``<name>.breaker.json``; and, given the
URL of a PostgreSQL database (``readmodels``: ``project remove --readmodels URL`` or
``$EVENTLANE_READMODELS``), the read model's schema there with its rebuild's schemas
(``<schema>``, ``<schema>__rebuild``, ``__shadow``, ``__old``, ``__verify``, and the stage
schemas a killed Spark build left: :mod:`.postgres`). With
``dry_run`` it only reports what it would remove. Nothing else is touched: the events stay
in their topics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from eventlane.consumer.admin import delete_group, group_exists
from eventlane.errors import ProjectionError
from eventlane.log import Log
from eventlane.observability import get_logger
from eventlane.projection.dead_letters import dlq_topic
from eventlane.projection.postgres import (
    PgReadModelView,
    connect_admin,
    derived_schema,
    drop_schema,
    is_postgres_url,
    schema_exists,
    schema_name,
    stage_schemas,
)
from eventlane.projection.readmodel import ReadModelView, readmodel_path
from eventlane.projection.status import projection_status
from eventlane.projection.store import AnyReadModelView

log = get_logger("eventlane.projection")

_SUFFIXES = (
    ".sqlite",
    ".sqlite-wal",
    ".sqlite-shm",
    ".sqlite-journal",
    ".sqlite.lock",
    ".rebuild.sqlite",
    ".log",
    ".pause",
    ".pause-acks",
    ".breaker.json",
)


class RetireReport(NamedTuple):
    """What was (or, with ``dry_run``, would be) removed."""

    projector: str
    group: bool
    dlq_topic: str | None
    files: list[str]
    dead_letters: int
    dry_run: bool
    schemas: tuple[str, ...] = ()
    """PostgreSQL schemas (of the database ``readmodels`` names)."""

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


def retire_projector(
    log_: Log,
    data: Path,
    name: str,
    *,
    dry_run: bool = False,
    readmodels: str | None = None,
) -> RetireReport:
    """Remove projector ``name``'s group, dead-letter topic and read-model files (the data
    directory ``data`` is where ``log_`` keeps them), and its schemas in the PostgreSQL
    database ``readmodels`` (a ``postgresql://`` URL) when given."""
    path = readmodel_path(data, name)
    url = readmodels if is_postgres_url(readmodels) else None
    schemas = [] if url is None else _schemas(url, name)
    view: AnyReadModelView = (
        PgReadModelView(url, schema_name(name)) if url is not None else ReadModelView(path)
    )
    doc = projection_status(log_, name, (), path, None)
    live = [m["member_id"] for m in doc["members"] if m["alive"]]
    if live:
        raise ProjectionError(
            f"projector {name!r} has {len(live)} live worker(s) ({', '.join(live)}):"
            " stop them first"
        )
    folder = path.parent
    files = [folder / f"{name}{suffix}" for suffix in _SUFFIXES]
    files = [f for f in files if f.exists()]
    with view:
        dead = sum(view.dead_letter_counts().values())
    has_group = group_exists(log_, name)
    topic = dlq_topic(name) if log_.topic_exists(dlq_topic(name)) else None
    if not (files or has_group or topic or schemas):
        raise ProjectionError(
            f"nothing to remove: no group, read model or dead letters named {name!r}"
        )
    if not dry_run:
        if has_group:
            delete_group(log_, name)
        if topic is not None:
            log_.delete_topic(topic)
        for f in files:
            f.unlink(missing_ok=True)
        for schema in schemas:
            assert url is not None
            drop_schema(url, schema)
        log.info(
            "projector removed",
            projector=name,
            files=len(files),
            schemas=schemas,
            dead_letters=dead,
        )
    return RetireReport(
        name, has_group, topic, [str(f) for f in files], dead, dry_run, tuple(schemas)
    )


def _schemas(url: str, name: str) -> list[str]:
    live = schema_name(name)
    builds = [derived_schema(live, s) for s in ("rebuild", "shadow")]
    names = [live, *builds] + [derived_schema(live, s) for s in ("old", "verify")]
    with connect_admin(url) as raw:
        stages = [stage for build in builds for stage in stage_schemas(raw, build)]
        return [s for s in names if schema_exists(raw, s)] + stages

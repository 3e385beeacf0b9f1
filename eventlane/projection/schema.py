"""Read-model schemas: the projector's ``sqlite_utils.Migrations`` set, applied or refused.

Rules (``eventlane migrate APP`` applies; a worker checks on start):

* A worker refuses to start while one of its projector's migrations is pending on an
  existing read model, with an error naming them: applying a schema change is a deliberate
  step, taken while the projection is stopped.
* A new read model (nothing ever applied to it, none of the set applied yet) is created at
  its latest schema on first open: there is nothing to migrate.
* Migrations run under the read model's write lock (``BEGIN IMMEDIATE``; each migration in
  a savepoint, so a failing one leaves nothing behind), so workers and ``migrate`` starting
  together never apply one twice. A migration declared ``transactional=False`` (``VACUUM``)
  runs outside any transaction, as sqlite-utils runs it.
* A read model belongs to the app that first opened it (its ``App`` name, kept in
  ``_eventlane_owner``): another app whose projector has the same name on the same data
  directory is refused, by workers and by ``migrate``, before anything is applied, so one
  app's migrations are never grafted onto another app's read model.

The same rules hold for a read model in PostgreSQL (:mod:`.postgres`, chosen by
:mod:`.store`): the same ``Migrations`` set, applied in one transaction under the schema's
lock and recorded in ``_eventlane_migrations``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from eventlane.errors import ProjectionError
from eventlane.observability import get_logger
from eventlane.projection._sqlite_utils import Migrations
from eventlane.projection.host import ProjectionHost
from eventlane.projection.postgres import (
    PgReadModel,
    any_pg_applied,
    apply_pg_migrations,
    pending_pg_migrations,
)
from eventlane.projection.store import AnyReadModel, open_store

__all__ = ["apply_migrations", "migrate_all", "open_readmodel", "pending_migrations"]

log = get_logger("eventlane.projection")


def pending_migrations(migrations: Migrations | None, readmodel: AnyReadModel) -> list[str]:
    """Names of ``migrations`` not applied to ``readmodel`` yet, in order."""
    if migrations is None:
        return []
    if isinstance(readmodel, PgReadModel):
        return pending_pg_migrations(migrations, readmodel)
    return [m.name for m in migrations.pending(readmodel.db)]


def _any_applied(migrations: Migrations, readmodel: AnyReadModel) -> bool:
    if isinstance(readmodel, PgReadModel):
        return any_pg_applied(migrations, readmodel)
    return bool(migrations.applied(readmodel.db))


def apply_migrations(migrations: Migrations | None, readmodel: AnyReadModel) -> list[str]:
    """Apply the pending ``migrations`` under the write lock; return the names applied."""
    if isinstance(readmodel, PgReadModel):
        return apply_pg_migrations(migrations, readmodel)
    if migrations is None or not migrations.pending(readmodel.db):
        return []
    if not all(m.transactional for m in migrations.pending(readmodel.db)):
        names = pending_migrations(migrations, readmodel)
        migrations.apply(readmodel.db)
    else:
        with readmodel.transaction():
            names = pending_migrations(migrations, readmodel)  # again, under the lock
            migrations.apply(readmodel.db)
    if names:
        log.info("read-model migrations applied", path=str(readmodel.path), migrations=names)
    return names


def _owner(readmodel: AnyReadModel) -> str | None:
    try:
        row = readmodel.conn.execute("SELECT app FROM _eventlane_owner").fetchone()
    except sqlite3.OperationalError:  # no such table: a SQLite read model from before owners
        return None
    return None if row is None else str(row[0])


def claim_owner(readmodel: AnyReadModel, app: str, name: str) -> None:
    """Record ``app`` as the owner of a new read model; refuse one another app owns.

    Reads first, without the write lock (a worker starting while another one holds it, even
    a frozen one, must not wait here); writes only to claim a read model nobody owns yet."""
    owner = _owner(readmodel)
    if owner is None:
        with readmodel.transaction() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS _eventlane_owner (app TEXT NOT NULL)")
            row = conn.execute("SELECT app FROM _eventlane_owner").fetchone()
            if row is None:
                conn.execute("INSERT INTO _eventlane_owner VALUES (?)", (app,))
            owner = app if row is None else str(row[0])
    if owner != app:
        raise ProjectionError(
            f"read model {name!r} belongs to app {owner!r}, not to app {app!r}: two apps"
            " share this data directory and a projector name; nothing was applied. Give"
            " this app its own namespace (App(..., namespace=...)) or data directory"
            " (--data), or its projector another name",
            path=readmodel.path,
        )


def readmodel_file(runtime: ProjectionHost, name: str) -> Path:
    """Where projector ``name``'s read model is: in the log's local directory, under the
    name the app's namespace gives it."""
    return runtime.log.local.readmodel(runtime.names.local(name))


def open_readmodel(runtime: ProjectionHost, name: str, *, migrate: bool = False) -> AnyReadModel:
    """Open projector ``name``'s read model on its engine (:mod:`.store`), refusing pending
    migrations (see the module docstring); ``migrate=True`` applies them instead."""
    migrations = runtime.app.projector(name).migrations
    readmodel = open_store(runtime, name)
    try:
        claim_owner(readmodel, runtime.app.name, name)
        # "fresh" is read before "pending": another worker starting on the same fresh file
        # may migrate it and apply events in between, which must leave nothing pending here
        # rather than pending migrations on a file no longer fresh (a refusal: exit 2)
        fresh = (
            migrations is not None
            and readmodel.is_fresh()
            and not _any_applied(migrations, readmodel)
        )
        pending = pending_migrations(migrations, readmodel)
        if not pending:
            return readmodel
        assert migrations is not None
        if not (migrate or fresh):
            raise ProjectionError(
                f"read model {name!r} ({readmodel.location}) has pending migrations:"
                f" {', '.join(pending)}; stop its workers and run `eventlane migrate APP` first"
            )
        apply_migrations(migrations, readmodel)
    except BaseException:
        readmodel.close()
        raise
    return readmodel


def migrate_all(runtime: ProjectionHost) -> dict[str, list[str]]:
    """Apply the pending migrations of every projector's read model (the framework's own
    tables included); return ``{projector: [migration names applied]}``."""
    done: dict[str, list[str]] = {}
    for name in sorted(runtime.app.projectors):
        readmodel = open_store(runtime, name)
        try:
            claim_owner(readmodel, runtime.app.name, name)
            own = [f"eventlane.read_model:{m}" for m in readmodel.framework_migrations_applied]
            migrations = runtime.app.projector(name).migrations
            theirs = apply_migrations(migrations, readmodel)
            prefix = "" if migrations is None else f"{migrations.name}:"
            done[name] = own + [prefix + m for m in theirs]
        finally:
            readmodel.close()
    return done

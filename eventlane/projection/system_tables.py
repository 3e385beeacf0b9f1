"""The framework's own tables in every read-model file.

``_eventlane_positions``: per ``(topic, partition)`` the next offset to apply and the group
generation of the worker that last owned it (a fencing token: a worker whose generation is
older than the stored one may no longer write that partition).

``_eventlane_dead_letters``: events a handler could not apply (or that could not be
decoded), with their raw bytes and headers, source coordinates, the error, and a status:
``dead``, ``parked`` (held behind an earlier dead letter of the same key), or ``retried``.
``published`` is 1 once the row was copied to the ``<group>.dlq`` topic (an outbox).
``headers`` is a JSON array of ``[name, value]`` pairs, each value decoded as Latin-1 (so
any bytes survive the round trip) or null.

These migrations run automatically whenever a read model is opened (under its write lock);
migrations only ever add to this set, never change an applied one. The set keeps its name
``eventlane.read_model`` (recorded in every read model's ``_sqlite_migrations`` table).
"""

from __future__ import annotations

from eventlane.projection._sqlite_utils import Database, Migrations

read_model = Migrations("eventlane.read_model")


@read_model()
def m001_positions_and_dead_letters(db: Database) -> None:
    db.execute(
        """CREATE TABLE IF NOT EXISTS _eventlane_positions (
            topic TEXT NOT NULL,
            partition INTEGER NOT NULL,
            next_offset INTEGER NOT NULL,
            generation INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (topic, partition)
        ) WITHOUT ROWID"""
    )
    db.execute(
        """CREATE TABLE IF NOT EXISTS _eventlane_dead_letters (
            id INTEGER PRIMARY KEY,
            topic TEXT NOT NULL,
            partition INTEGER NOT NULL,
            offset INTEGER NOT NULL,
            key BLOB,
            value BLOB,
            headers TEXT NOT NULL,
            event_type TEXT,
            error TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            status TEXT NOT NULL,
            created_ms INTEGER NOT NULL,
            published INTEGER NOT NULL DEFAULT 0,
            UNIQUE (topic, partition, offset)
        )"""
    )
    db.execute(
        "CREATE INDEX IF NOT EXISTS _eventlane_dead_letters_key ON _eventlane_dead_letters"
        " (key, status)"
    )


@read_model()
def m002_dead_letter_status_index(db: Database) -> None:
    """Workers of a projector that parks keys look up open letters by status every batch."""
    db.execute(
        "CREATE INDEX IF NOT EXISTS _eventlane_dead_letters_status ON _eventlane_dead_letters"
        " (status, topic, key)"
    )

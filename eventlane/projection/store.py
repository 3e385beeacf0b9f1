"""Where a projection's read model lives: a SQLite file (the default) or a PostgreSQL schema.

The engine is chosen by a URL, as ``--log`` chooses the log, first found of:

1. the projector's ``readmodel_url`` class attribute (one projector elsewhere);
2. the app's ``App(readmodels=URL)``;
3. the environment variable ``EVENTLANE_READMODELS`` (every app of the process);

``postgresql://USER@HOST:PORT/DB`` (libpq's URL; any of its options) puts the read model in
schema :func:`~eventlane.projection.postgres.schema_name` of that database (one schema per
projection: :mod:`.postgres`); nothing, or ``sqlite:``, keeps the file
``<data>/readmodels/<name>.sqlite`` (:mod:`.readmodel`). Both engines give the same object
shape (:data:`AnyReadModel`): ``transaction()``, ``positions()``, ``claim()``,
``check_and_advance()``, ``conn`` (the framework's connection, SQLite's dialect), ``db`` /
``user_conn`` (what handlers get), ``dialect``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from eventlane.errors import ConfigError
from eventlane.projection.host import ProjectionHost
from eventlane.projection.postgres import (
    PgReadModel,
    PgReadModelView,
    is_postgres_url,
    schema_name,
)
from eventlane.projection.readmodel import ReadModel, ReadModelView

__all__ = [
    "ENV",
    "AnyReadModel",
    "app_readmodel_url",
    "AnyReadModelView",
    "Location",
    "PgLocation",
    "location_of",
    "open_store",
    "open_view",
    "readmodel_url",
    "view_of",
]

ENV = "EVENTLANE_READMODELS"

AnyReadModel = ReadModel | PgReadModel
AnyReadModelView = ReadModelView | PgReadModelView


def readmodel_url(runtime: ProjectionHost, name: str) -> str | None:
    """The PostgreSQL URL of projector ``name``'s read model; ``None``: SQLite."""
    return app_readmodel_url(runtime.app, name)


def app_readmodel_url(app: Any, name: str) -> str | None:
    """:func:`readmodel_url` for an :class:`~eventlane.app.App` (no runtime needed)."""
    cls = app.projector(name)
    url = (
        getattr(cls, "readmodel_url", None)
        or getattr(app, "readmodels", None)
        or os.environ.get(ENV)
    )
    if not url or url.startswith("sqlite:"):
        return None
    if not is_postgres_url(url):
        raise ConfigError(
            f"read model URL {url!r} of projector {name!r}: expected postgresql://... or"
            " sqlite: (the default)"
        )
    return str(url)


def _file(runtime: ProjectionHost, name: str) -> Path:
    return runtime.log.local.readmodel(runtime.names.local(name))


def open_store(runtime: ProjectionHost, name: str) -> AnyReadModel:
    """Open projector ``name``'s read model on its engine (no migrations applied here)."""
    url = readmodel_url(runtime, name)
    if url is None:
        return ReadModel(_file(runtime, name))
    return PgReadModel(url, schema_name(runtime.names.local(name)), _file(runtime, name))


class PgLocation(NamedTuple):
    """Where a PostgreSQL read model is: the database URL and the projection's schema."""

    url: str
    schema: str


Location = Path | PgLocation
"""Where a read model is: its SQLite file, or a PostgreSQL schema."""


def location_of(runtime: ProjectionHost, name: str) -> Location:
    """Where projector ``name``'s read model is (read-your-writes waits carry this)."""
    url = readmodel_url(runtime, name)
    if url is None:
        return _file(runtime, name)
    return PgLocation(url, schema_name(runtime.names.local(name)))


def open_view(location: Location) -> AnyReadModelView:
    """A read-only view of the read model at ``location``."""
    if isinstance(location, PgLocation):
        return PgReadModelView(location.url, location.schema)
    return ReadModelView(location)


def view_of(runtime: ProjectionHost, name: str) -> AnyReadModelView:
    """A read-only view of projector ``name``'s read model on its engine."""
    return open_view(location_of(runtime, name))

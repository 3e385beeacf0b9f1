"""Projectors and read models: consumer-group workers writing SQLite exactly once.

Guide: ``docs/projections.md``. The pieces:

* :class:`Projector` (``@handles``) and :class:`EventContext`: what users write;
* :class:`CommandSide` / :class:`ProjectionHost`: what this layer needs from the
  application (:mod:`eventlane.app` satisfies them; this layer never imports it);
* :class:`ReadModel`: the SQLite file with positions and dead letters, fenced by the group
  generation; :mod:`.schema`: migrations; :mod:`.dead_letters`: list, publish, retry;
* :class:`BatchApplier`: one poll's records in one transaction;
* :class:`Worker` (one group member) and :class:`Runner` (N worker processes).
"""

from eventlane.errors import FencedError
from eventlane.projection.applier import BatchApplier, BatchResult
from eventlane.projection.dead_letters import (
    DeadLetter,
    RetryReport,
    dlq_topic,
    get_dead_letter,
    list_dead_letters,
    publish_dead_letters,
    retry_dead_letters,
)
from eventlane.projection.host import ProjectionHost
from eventlane.projection.projector import CommandSide, EventContext, Projector, handles
from eventlane.projection.readmodel import (
    ReadModel,
    ReadModelView,
    check_integrity,
    readmodel_path,
)
from eventlane.projection.runner import Runner
from eventlane.projection.schema import (
    apply_migrations,
    migrate_all,
    open_readmodel,
    pending_migrations,
)
from eventlane.projection.status import offsets_after, projection_status
from eventlane.projection.store import open_store, view_of
from eventlane.projection.tables import Table, dialect_of
from eventlane.projection.worker import Polled, Worker

__all__ = [
    "CommandSide",
    "ProjectionHost",
    "BatchApplier",
    "BatchResult",
    "DeadLetter",
    "RetryReport",
    "dlq_topic",
    "get_dead_letter",
    "list_dead_letters",
    "publish_dead_letters",
    "retry_dead_letters",
    "EventContext",
    "Projector",
    "handles",
    "FencedError",
    "ReadModel",
    "ReadModelView",
    "check_integrity",
    "readmodel_path",
    "Runner",
    "apply_migrations",
    "migrate_all",
    "open_readmodel",
    "pending_migrations",
    "offsets_after",
    "projection_status",
    "Polled",
    "Worker",
    "Table",
    "dialect_of",
    "open_store",
    "view_of",
]

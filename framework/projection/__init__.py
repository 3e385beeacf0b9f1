"""Projectors and read models: consumer-group workers writing SQLite exactly once.

Guide: ``docs/projections.md``. The pieces:

* :class:`Projector` (``@handles``) and :class:`EventContext`: what users write;
* :class:`CommandSide` / :class:`ProjectionHost`: what this layer needs from the
  application (:mod:`framework.app` satisfies them; this layer never imports it);
* :class:`ReadModel`: the SQLite file with positions and dead letters, fenced by the group
  generation; :mod:`.schema`: migrations; :mod:`.dead_letters`: list, publish, retry;
* :class:`BatchApplier`: one poll's records in one transaction;
* :class:`Worker` (one group member) and :class:`Runner` (N worker processes).
"""

from framework.errors import FencedError
from framework.projection.applier import BatchApplier, BatchResult
from framework.projection.dead_letters import (
    DeadLetter,
    RetryReport,
    dlq_topic,
    get_dead_letter,
    list_dead_letters,
    publish_dead_letters,
    retry_dead_letters,
)
from framework.projection.host import ProjectionHost
from framework.projection.projector import CommandSide, EventContext, Projector, handles
from framework.projection.readmodel import (
    ReadModel,
    ReadModelView,
    check_integrity,
    readmodel_path,
)
from framework.projection.runner import Runner
from framework.projection.schema import (
    apply_migrations,
    migrate_all,
    open_readmodel,
    pending_migrations,
)
from framework.projection.status import offsets_after, projection_status
from framework.projection.store import open_store, view_of
from framework.projection.tables import Table, dialect_of
from framework.projection.worker import Polled, Worker

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

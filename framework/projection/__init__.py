"""Projectors and read models: consumer-group workers writing SQLite exactly once."""

from framework.projection.app import App, Runtime, load_app
from framework.projection.applier import BatchApplier, BatchResult
from framework.projection.dead_letters import (
    DeadLetter,
    dlq_topic,
    list_dead_letters,
    publish_dead_letters,
    retry_dead_letters,
)
from framework.projection.projector import EventContext, Projector, handles
from framework.projection.readmodel import FencedError, ReadModel, readmodel_path
from framework.projection.runner import Runner
from framework.projection.worker import Worker, open_readmodel, wait_for_positions

__all__ = [
    "App",
    "Runtime",
    "load_app",
    "BatchApplier",
    "BatchResult",
    "DeadLetter",
    "dlq_topic",
    "list_dead_letters",
    "publish_dead_letters",
    "retry_dead_letters",
    "EventContext",
    "Projector",
    "handles",
    "FencedError",
    "ReadModel",
    "readmodel_path",
    "Runner",
    "Worker",
    "open_readmodel",
    "wait_for_positions",
]

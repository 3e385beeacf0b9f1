"""What the projection layer needs from the application, as Protocols.

The application layer (:mod:`eventlane.app`) sits above this one: its ``Runtime`` satisfies
:class:`ProjectionHost` structurally, and the projection layer never imports it. A worker
needs the log, the codec, the declaration of the projectors, the app's names (its namespace:
:class:`Names`) and the partition count of a topic it creates; a policy handler needs only
the command side (:class:`~eventlane.projection.projector.CommandSide`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from eventlane.codec import EventCodec
from eventlane.projection.projector import CommandSide, Projector

__all__ = ["AppDeclaration", "CommandSide", "Names", "ProjectionHost"]


class Names(Protocol):
    """How an app's declared names map to names on the log and in the local directory
    (``eventlane.app.namespace.Namespace``: a prefix, or none)."""

    def topic(self, name: str) -> str:
        """The topic on the log for a declared topic name."""
        ...

    def projector_topics(self, cls: type[Projector]) -> tuple[str, ...]:
        """The topics (full names) a projector class consumes."""
        ...

    def group(self, projector: str) -> str:
        """The consumer group id of a projector (its dead letters: ``<group>.dlq``)."""
        ...

    def local(self, projector: str) -> str:
        """The name of a projector's files in the local directory (read model, pause)."""
        ...


class AppDeclaration(Protocol):
    """The part of an ``App`` the projection layer reads: its name and projectors."""

    @property
    def name(self) -> str: ...

    @property
    def projectors(self) -> Mapping[str, type[Projector]]: ...

    def projector(self, name: str) -> type[Projector]:
        """The projector named ``name``; ``ConfigError`` naming the known ones otherwise."""
        ...


class ProjectionHost(CommandSide, Protocol):
    """An application connected to a log, as a worker sees it."""

    @property
    def app(self) -> AppDeclaration: ...

    @property
    def codec(self) -> EventCodec: ...

    @property
    def names(self) -> Names: ...

    def partitions_for(self, topic: str) -> int:
        """How many partitions a topic this application creates gets (a declared name)."""
        ...

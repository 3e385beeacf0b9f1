"""What the projection layer needs from the application, as Protocols.

The application layer (:mod:`framework.app`) sits above this one: its ``Runtime`` satisfies
:class:`ProjectionHost` structurally, and the projection layer never imports it. A worker
needs the log, the codec, the declaration of the projectors and the partition count of a
topic it creates; a policy handler needs only the command side
(:class:`~framework.projection.projector.CommandSide`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from framework.codec import EventCodec
from framework.projection.projector import CommandSide, Projector

__all__ = ["AppDeclaration", "CommandSide", "ProjectionHost"]


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

    def partitions_for(self, topic: str) -> int:
        """How many partitions a topic this application creates gets."""
        ...

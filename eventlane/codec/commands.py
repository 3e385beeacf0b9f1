"""Commands as JSON: the wire form of :class:`eventlane.domain.Command` objects.

``encode`` gives ``(name, fields)`` with the fields unstructured by the app's converter (the
one events use, :mod:`.converter`, with the app's own hooks); ``decode`` structures them back
into the registered class. A name no registered class declares, or fields of the wrong types,
raise :class:`~eventlane.errors.SerializationError` naming the command.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from cattrs.preconf.orjson import OrjsonConverter

from eventlane.codec.converter import describe_structure_error, make_converter
from eventlane.domain.commands import Command, command_name_of
from eventlane.errors import ConfigError, SerializationError

__all__ = ["CommandCodec"]


class CommandCodec:
    """Encodes and decodes the registered command classes (names unique)."""

    def __init__(
        self,
        classes: Iterable[type[Command[Any]]],
        configure: Callable[[OrjsonConverter], None] | None = None,
    ) -> None:
        self._classes: dict[str, type[Command[Any]]] = {}
        for cls in classes:
            name = command_name_of(cls)
            if self._classes.setdefault(name, cls) is not cls:
                raise ConfigError(f"two command classes named {name!r}")
        self._converter = make_converter()
        if configure is not None:
            configure(self._converter)

    def names(self) -> list[str]:
        return sorted(self._classes)

    def encode(self, cmd: Command[Any]) -> tuple[str, Any]:
        name = command_name_of(type(cmd))
        if self._classes.get(name) is not type(cmd):
            raise ConfigError(
                f"command {name!r} ({type(cmd).__qualname__}) is not registered with the app"
                " (App(commands=[...]))"
            )
        return name, self._converter.unstructure(cmd)

    def decode(self, name: str, data: Any) -> Command[Any]:
        cls = self._classes.get(name)
        if cls is None:
            raise SerializationError(
                f"unknown command {name!r}: no class registered with the app declares it",
                type_name=name,
            )
        try:
            return self._converter.structure(data, cls)
        except Exception as exc:
            raise SerializationError(
                f"cannot decode command {name!r}: {describe_structure_error(exc)}", type_name=name
            ) from exc

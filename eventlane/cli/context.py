"""What every ``eventlane`` command shares: the data directory, the open log, argument types.

The data directory comes from, in order of precedence: ``--data DIR`` given after the
subcommand, ``--data DIR`` given before it (``eventlane --data DIR topics list``), the
``EVENTLANE_DATA`` environment variable, then ``./eventlane-data``.

Commands that create a data directory say so, with its absolute path, on standard error.
Commands that only read never create a data directory: pointing them at a directory that
holds no log is an error naming the path (the usual mistake is a wrong ``--data``). Argument
types validate before anything is opened, so a bad topic name, offset, partition or config
key is refused with nothing created on disk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from eventlane.engine import DEFAULT_DATA_DIR, open_log
from eventlane.errors import ConfigError, FrameworkError
from eventlane.log import Log
from eventlane.log.config import MAX_PARTITIONS
from eventlane.log.names import validate_topic_name
from eventlane.observability import get_logger

F = TypeVar("F", bound=Callable[..., Any])
log = get_logger("eventlane.cli")


class AppContext:
    """Per-invocation state: the chosen data directory and the log, opened on first use."""

    def __init__(self, data: Path, log_url: str | None = None) -> None:
        self.data = data
        self.log_url = log_url  # another engine's log (``--log nats://...``); data stays local
        self._log: Log | None = None

    def open_log(self, *, create: bool = False) -> Log:
        """The log in :attr:`data`; ``create=False`` refuses a directory that holds none."""
        if self._log is not None:
            return self._log
        if self.log_url:
            self._log = open_log(self.log_url, data_dir=self.data)
            return self._log
        if self.data.exists() and not self.data.is_dir():
            raise ConfigError(f"data directory {str(self.data)!r} is not a directory")
        if not create and not (self.data / "topics").is_dir():
            raise ConfigError(
                f"no eventlane data in {str(self.data)!r}: create a topic first, or point"
                " --data / EVENTLANE_DATA at an existing data directory"
            )
        new = not (self.data / "topics").is_dir()
        self._log = open_log(self.data)
        if new:  # a forgotten --data must not go unnoticed (a warning: shown by default)
            log.warning(
                f"created data directory {self.data.resolve()} (choose another with --data DIR"
                " or EVENTLANE_DATA)",
                path=str(self.data.resolve()),
            )
        return self._log

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def app(ctx: click.Context | None = None) -> AppContext:
    """The :class:`AppContext` of the running command."""
    ctx = ctx or click.get_current_context()
    obj = ctx.find_object(AppContext)
    if obj is None:  # a subcommand invoked on its own (tests, embedding): make one
        root = ctx.find_root()
        obj = AppContext(Path(DEFAULT_DATA_DIR))
        root.obj = obj
        root.call_on_close(obj.close)
    return obj


def _set_data(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        app(ctx).data = value


DATA_HELP = "Data directory of the log [env EVENTLANE_DATA; default ./eventlane-data]."


def _set_log_url(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        app(ctx).log_url = value


LOG_HELP = (
    "The log's URL, e.g. nats://host:port[,host:port] (a JetStream cluster) [env"
    " EVENTLANE_LOG; default: the embedded log in --data]."
)


def log_option(f: F) -> F:
    """``--log URL`` (parameter ``log_url``): the engine holding the log."""
    return click.option(
        "--log",
        "log_url",
        expose_value=False,
        callback=_set_log_url,
        metavar="URL",
        help=LOG_HELP,
    )(f)


def data_option(f: F) -> F:
    """``--data DIR`` (and ``--log URL``) on a subcommand (overrides the root option and the
    environment)."""
    f = log_option(f)
    return click.option(
        "--data",
        type=click.Path(path_type=Path),
        expose_value=False,
        callback=_set_data,
        metavar="DIR",
        help=DATA_HELP,
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")(f)


def _namespace(_ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    from eventlane.app.namespace import Namespace  # noqa: PLC0415 (only when asked for)

    try:
        return Namespace(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param=param) from None


def namespace_option(f: F) -> F:
    """``--namespace NS``: only names in an app's namespace (``NS.*``, as
    ``App(..., namespace=NS)`` makes them; see :mod:`eventlane.app.namespace`); the command
    gets a ``Namespace`` or ``None``."""
    return click.option(
        "--namespace",
        metavar="NS",
        callback=_namespace,
        help="Only the names in namespace NS (NS.*: an App declared with namespace=NS).",
    )(f)


class TopicNameType(click.ParamType):  # type: ignore[type-arg]
    """A topic name checked against Kafka's rule before anything is opened."""

    name = "topic"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return validate_topic_name(value)
        except FrameworkError as err:
            return self.fail(str(err), param, ctx)


TOPIC = TopicNameType()
PARTITIONS = click.IntRange(1, MAX_PARTITIONS)
PARTITION = click.IntRange(0, MAX_PARTITIONS - 1)


class ConfigPairType(click.ParamType):  # type: ignore[type-arg]
    """``key=value``, as in ``--config retention.ms=-1``."""

    name = "key=value"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        key, sep, text = str(value).partition("=")
        if not sep or not key.strip():
            self.fail(f"expected key=value, got {value!r}", param, ctx)
        return key.strip(), text.strip()


CONFIG_PAIR = ConfigPairType()


def config_mapping(pairs: tuple[tuple[str, str], ...]) -> dict[str, object]:
    """``--config`` pairs as a mapping, keys as the user spelled them (errors quote them).

    A key given twice, in any spelling (``retention.ms`` and ``retention_ms``), is an error.
    """
    out: dict[str, object] = {}
    seen: set[str] = set()
    for key, value in pairs:
        norm = config_key(key)
        if norm in seen:
            raise ConfigError(f"config key {key!r} given twice")
        seen.add(norm)
        out[key] = value
    return out


def config_key(key: str) -> str:
    """The canonical spelling of a config key: ``retention.ms`` -> ``retention_ms``."""
    return key.replace(".", "_").replace("-", "_")


OFFSET_WORDS = ("earliest", "latest")


class OffsetType(click.ParamType):  # type: ignore[type-arg]
    """``earliest``, ``latest``, or an offset ``N >= 0``."""

    name = "offset"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "earliest|latest|N"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> str | int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        text = str(value).strip().lower()
        if text in OFFSET_WORDS:
            return text
        if text.isdigit():
            return int(text)
        return self.fail(
            f"offset must be 'earliest', 'latest' or an integer >= 0, got {value!r}", param, ctx
        )


OFFSET = OffsetType()


class SecondsType(click.FloatRange):
    """A finite number of seconds ``>= 0`` (``nan`` and ``inf`` are usage errors)."""

    name = "seconds"

    def __init__(self) -> None:
        super().__init__(min=0)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


SECONDS = SecondsType()


def stdout_console() -> Console:
    """A rich console on standard output (tables, reports)."""
    return Console(highlight=False, soft_wrap=False, emoji=False)


def stderr_console() -> Console:
    """A rich console on standard error (progress bars, warnings, notes)."""
    return Console(stderr=True, highlight=False, emoji=False)

"""eventlane's loggers, and the one place an entry point configures log output.

**Library etiquette.** Every eventlane logger is a standard-library logger under
``eventlane.`` (``eventlane.log``, ``eventlane.store``, ``eventlane.projection``, ...), so the
host application's logging configuration (``logging.basicConfig``, ``dictConfig``,
uvicorn's, structlog's stdlib integration) governs eventlane's records as it governs
kafka-python's or aiokafka's. Neither ``import eventlane`` nor opening a runtime configures
anything: no handler, no level, no structlog configuration. With nothing configured, the
standard library's "last resort" writes warnings and above to standard error; nothing
eventlane logs ever goes to standard output.

Library modules call :func:`get_logger` (``log = get_logger("eventlane.<layer>")``) and log an
*event* with its coordinates as fields (``topic``, ``partition``, ``offset``, ``group``):
``log.warning("segment truncated", topic=t, partition=p, offset=o)``. A record's message is
the event followed by ``key=value`` pairs (what a plain ``%(message)s`` formatter shows);
the record also carries ``eventlane_event`` and ``eventlane_fields`` (a dict), and each field
as an attribute of its own where the name is free (what JSON formatters such as
python-json-logger pick up). A disabled level costs one ``isEnabledFor`` check.

**Entry points** (the ``eventlane`` CLI, its worker processes, the console, the Kafka
listener) call :func:`configure_logging` at start-up: one handler on the root logger,
writing to standard error (looked up at every write, so a replaced or closed
``sys.stderr`` never breaks logging), in the console format (aligned, coloured on a
terminal) or as JSON lines, rendered by structlog's ``ProcessorFormatter`` (structlog is
imported when the first line is rendered, not before: its import costs more than a short
command's whole run). Settings, from the arguments or the environment:

* ``EVENTLANE_LOG_LEVEL`` / ``--log-level``: ``debug``, ``info``, ``warning`` (the default),
  ``error`` or ``critical``;
* ``EVENTLANE_LOG_FORMAT`` / ``--log-format``: ``console`` (the default) or ``json``.

Rendering the first line loads structlog (and what it imports): seconds on a loaded host.
So an event logged by a thread that holds one of eventlane's file locks before structlog is
loaded is logged when that thread lets go of its last one (another process may be waiting
for that lock: issue 26); :class:`eventlane._locks.FileLock` calls :func:`lock_taken` and
:func:`lock_released`.

Typical use, at the start of a process of your own that wants eventlane's output format::

    configure_logging()                    # level and format from the environment
    configure_logging(level="debug", json=True)

>>> list(LEVELS)
['debug', 'info', 'warning', 'error', 'critical']
>>> get_logger("eventlane.doc").bind(topic="t")
<Logger eventlane.doc {'topic': 't'}>
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import MutableMapping
from typing import Any

from eventlane.errors import ConfigError

__all__ = [
    "LEVELS",
    "Logger",
    "configure_logging",
    "get_logger",
    "lock_released",
    "lock_taken",
    "log_level_name",
    "logging_env",
    "route_structlog",
]

LEVELS: dict[str, int] = {  # the logging module's level numbers
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_FORMATS = ("console", "json")
_entry_point: tuple[str, bool] | None = None
"""``(level, json)`` of the last :func:`configure_logging` in this process (an entry point)."""
_HANDLER_NAME = "eventlane"
"""The name of the handler :func:`configure_logging` installs (and replaces)."""
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "eventlane_event",
    "eventlane_fields",
}
"""Attributes of a ``LogRecord``: a field with such a name stays in ``eventlane_fields`` only."""


def _render(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text) if isinstance(value, str) and (" " in text or not text) else text


class _Message:
    """A record's message, rendered only if a handler formats it: ``event k=v ...``."""

    __slots__ = ("event", "fields")

    def __init__(self, event: str, fields: dict[str, Any]) -> None:
        self.event = event
        self.fields = fields

    def __str__(self) -> str:
        if not self.fields:
            return self.event
        pairs = " ".join(f"{k}={_render(v)}" for k, v in sorted(self.fields.items()))
        return f"{self.event} {pairs}"


_held = threading.local()
"""Per thread: ``locks``, how many of eventlane's file locks it holds; ``deferred``, the
events it logged under them before structlog was loaded (module docstring)."""


def lock_taken() -> None:
    """The calling thread took one of eventlane's file locks (see the module docstring)."""
    _held.locks = getattr(_held, "locks", 0) + 1


def lock_released() -> None:
    """The calling thread let go of one; at its last, log what was deferred meanwhile."""
    _held.locks = locks = max(getattr(_held, "locks", 1) - 1, 0)
    deferred = getattr(_held, "deferred", None) if locks == 0 else None
    if deferred:
        _held.deferred = []
        for logger, level, event, fields in deferred:
            logger._log(level, event, fields)  # this module's own class


class Logger:
    """A standard-library logger with bound fields (see the module docstring).

    ``debug``/``info``/``warning``/``error``/``critical``/``exception`` take an event name
    and fields; ``exc_info=True`` (or an exception) attaches a traceback, as ``exception``
    does. ``bind`` returns a new :class:`Logger` with more fields.
    """

    __slots__ = ("_bound", "_logger", "_name")

    def __init__(self, name: str, bound: dict[str, Any] | None = None) -> None:
        self._name = name
        self._bound: dict[str, Any] = bound or {}
        self._logger = logging.getLogger(name)

    def bind(self, **values: Any) -> Logger:
        return Logger(self._name, {**self._bound, **values})

    def _log(self, level: int, event: str, fields: dict[str, Any], exc_info: Any = None) -> None:
        logger = self._logger
        if not logger.isEnabledFor(level):
            return
        if getattr(_held, "locks", 0) and "structlog" not in sys.modules:
            # under a file lock, before structlog is loaded: logged at the release
            ei = fields.get("exc_info", exc_info)
            if ei is True:  # the exception being handled now, not at the release
                ei = sys.exc_info()
            deferred = getattr(_held, "deferred", None)
            if deferred is None:
                deferred = _held.deferred = []
            deferred.append((self, level, event, {**fields, "exc_info": ei} if ei else fields))
            return
        merged = {**self._bound, **fields} if self._bound else fields
        exc_info = merged.pop("exc_info", exc_info)
        extra = {k: v for k, v in merged.items() if k not in _RESERVED}
        extra["eventlane_event"] = event
        extra["eventlane_fields"] = merged
        # stacklevel 3: the record names the caller of debug()/info()/..., not this module.
        logger.log(level, _Message(event, merged), exc_info=exc_info, extra=extra, stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._log(logging.CRITICAL, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the traceback of the exception being handled."""
        self._log(logging.ERROR, event, fields, exc_info=True)

    def __repr__(self) -> str:
        return f"<Logger {self._name} {self._bound}>"


def get_logger(name: str) -> Logger:
    """The logger ``name`` (``eventlane.<layer>``), a standard-library logger underneath."""
    return Logger(name)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the current ``sys.stderr`` at every record; never raises."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ sets it: ignored
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if sys.stderr is None:  # pythonw, or a closed stderr: drop silently
            return
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """A closed or broken stream: logging must never raise, nor print about itself."""


class _Formatter(logging.Formatter):
    """Renders records (eventlane's and any other logger's) with structlog's
    ``ProcessorFormatter``, built on the first record (structlog is imported then)."""

    def __init__(self, json: bool) -> None:
        super().__init__()
        self.json = json
        self._inner: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        inner = self._inner
        if inner is None:
            inner = self._inner = _structlog_formatter(self.json)
        return inner.format(record)


def _eventlane_fields(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    record = event_dict.get("_record")
    event = getattr(record, "eventlane_event", None)
    if event is not None:
        event_dict["event"] = event
        event_dict.update(record.eventlane_fields)  # type: ignore[union-attr]
    return event_dict


def _structlog_formatter(json: bool) -> logging.Formatter:
    import structlog  # noqa: PLC0415 - loaded when the first line is rendered (docstring)

    renderer: Any
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        isatty = getattr(sys.stderr, "isatty", None)
        renderer = structlog.dev.ConsoleRenderer(colors=bool(isatty and isatty()))
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _eventlane_fields,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *([structlog.processors.dict_tracebacks] if json else []),
            renderer,
        ],
    )


def configure_logging(level: str | None = None, json: bool | None = None) -> None:
    """Send the process's log records to standard error in eventlane's format (for entry
    points: the CLI, workers, the console; a library never calls it). Idempotent; the last
    call wins: one handler on the root logger, the root level set to ``level``.

    ``level`` defaults to ``$EVENTLANE_LOG_LEVEL``, else ``"warning"``; ``json`` defaults to
    ``$EVENTLANE_LOG_FORMAT == "json"``. Raises :class:`~eventlane.errors.ConfigError` for
    an unknown level or format.
    """
    global _entry_point  # noqa: PLW0603 - process-wide logging state, entry points only
    name, json = _settings(level, json)
    _entry_point = (name, json)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _HANDLER_NAME:
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(_Formatter(json))
    root.addHandler(handler)
    root.setLevel(LEVELS[name])


def route_structlog() -> None:
    """In a process whose output :func:`configure_logging` set up (an entry point, before it
    imports an application's code), send structlog's own loggers (an application's) through
    the same handler, unless something configured structlog already. Elsewhere: nothing."""
    if _entry_point is None:
        return
    import structlog  # noqa: PLC0415 - only entry points that load an application need it

    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.filter_by_level,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def _settings(level: str | None, json: bool | None) -> tuple[str, bool]:
    """``(level, json)`` from the arguments, else the environment (see the module docstring)."""
    name = (level or os.environ.get("EVENTLANE_LOG_LEVEL") or "warning").strip().lower()
    if name not in LEVELS:
        raise ConfigError(
            f"unknown log level {name!r} (EVENTLANE_LOG_LEVEL); use one of {', '.join(LEVELS)}"
        )
    if json is None:
        fmt = (os.environ.get("EVENTLANE_LOG_FORMAT") or "console").strip().lower()
        if fmt not in _FORMATS:
            raise ConfigError(
                f"unknown log format {fmt!r} (EVENTLANE_LOG_FORMAT); use console or json"
            )
        json = fmt == "json"
    return name, json


def log_level_name() -> str:
    """The level :func:`configure_logging` set in this process, else the one it would use
    when called without arguments."""
    if _entry_point is not None:
        return _entry_point[0]
    return (os.environ.get("EVENTLANE_LOG_LEVEL") or "warning").strip().lower()


def logging_env() -> dict[str, str]:
    """The environment that gives a child process this process's log settings (a
    supervisor's workers run ``configure_logging()`` from it)."""
    if _entry_point is None:
        return {}
    name, json = _entry_point
    return {"EVENTLANE_LOG_LEVEL": name, "EVENTLANE_LOG_FORMAT": "json" if json else "console"}

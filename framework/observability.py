"""The one place structlog is configured.

Library modules only call ``structlog.get_logger("eventlane.<layer>")`` and log events with
their coordinates as fields (``topic``, ``partition``, ``offset``, ``group``); they never
configure anything, and ``import framework`` configures nothing. The entry points do: the
``eventlane`` CLI and its worker processes call :func:`configure_logging` at start-up, and
opening an application's runtime calls :func:`configure_default_logging` (a no-op when
structlog is already configured).

Environment:

* ``EVENTLANE_LOG_LEVEL``: ``debug``, ``info``, ``warning`` (the default), ``error`` or
  ``critical``. Events below the level cost one comparison (structlog's filtering logger).
* ``EVENTLANE_LOG_FORMAT``: ``console`` (the default: aligned, coloured when stderr is a
  terminal) or ``json`` (one JSON object per line, for log shippers).

Logs always go to standard error, so a command's standard output stays machine-readable.
The stream is looked up at every write, never captured at configuration time, so logging
keeps working when ``sys.stderr`` is replaced (test runners, daemonised workers).

Typical use, at the start of a process::

    configure_logging()                    # level and format from the environment
    configure_logging(level="debug", json=True)

>>> list(LEVELS)
['debug', 'info', 'warning', 'error', 'critical']
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

from framework.errors import ConfigError

__all__ = ["LEVELS", "configure_default_logging", "configure_logging", "log_level_name"]

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_FORMATS = ("console", "json")


class _StderrLogger:
    """A structlog logger writing each rendered line to the current ``sys.stderr``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def msg(self, message: str) -> None:
        stream = sys.stderr
        if stream is None:  # pythonw, or a closed stderr: drop silently
            return
        try:
            stream.write(message + "\n")
            stream.flush()
        except (OSError, ValueError):  # closed or broken stream: logging must never raise
            pass

    log = debug = info = warn = warning = error = err = critical = fatal = exception = msg


def _stderr_logger_factory(*args: Any) -> _StderrLogger:
    return _StderrLogger(str(args[0]) if args else "eventlane")


def configure_logging(level: str | None = None, json: bool | None = None) -> None:
    """Configure structlog for the whole process (idempotent; the last call wins).

    ``level`` defaults to ``$EVENTLANE_LOG_LEVEL``, else ``"warning"``; ``json`` defaults to
    ``$EVENTLANE_LOG_FORMAT == "json"``. Raises :class:`~framework.errors.ConfigError` for
    an unknown level or format.
    """
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
    renderer: structlog.typing.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        isatty = getattr(sys.stderr, "isatty", None)
        renderer = structlog.dev.ConsoleRenderer(colors=bool(isatty and isatty()))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            *([structlog.processors.dict_tracebacks] if json else []),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[name]),
        logger_factory=_stderr_logger_factory,
        cache_logger_on_first_use=False,
    )


def log_level_name() -> str:
    """The level name :func:`configure_logging` uses when called without arguments."""
    return (os.environ.get("EVENTLANE_LOG_LEVEL") or "warning").strip().lower()


def configure_default_logging() -> None:
    """Configure logging from the environment unless the application already configured
    structlog itself. Called when an application's runtime opens (``App.open``), never on
    import, so that a library user gets warnings on standard error, not structlog's default
    of everything on standard output; configure structlog (or call
    :func:`configure_logging`) before opening to choose otherwise."""
    if not structlog.is_configured():
        try:
            configure_logging()
        except ConfigError:
            configure_logging(level="warning", json=False)

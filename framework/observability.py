"""The one place structlog is configured, and the loggers library modules use.

Library modules only call :func:`get_logger` (``log = get_logger("eventlane.<layer>")``) and
log events with their coordinates as fields (``topic``, ``partition``, ``offset``,
``group``); they never configure anything: neither ``import framework`` nor opening an
application's runtime configures logging for the host process. The entry points do: the
``eventlane`` CLI and its worker processes call :func:`configure_logging` at start-up.

Nothing eventlane logs ever goes to standard output, configured or not. While structlog is
not configured (by an entry point or by the host application), an eventlane logger writes
through a pipeline of its own, as :func:`configure_logging` would set it up from the
environment (warnings and above, on standard error), and leaves structlog's global
configuration alone (structlog's own default prints to standard output). This is what the
standard library's ``logging`` does without a handler (its "last resort" writes warnings to
standard error). Once structlog is configured, eventlane's loggers follow that
configuration, as structlog's own loggers do.

structlog is imported when something is first logged, not before (importing it costs more
than a short command's whole run): :func:`get_logger` returns a :class:`Logger` that
resolves to ``structlog.get_logger(name, **bound)`` on its first use, and a configuration
asked for before structlog is loaded is applied then (or by :func:`apply_pending`, which the
CLI calls before it imports an application's code, so that the application's own structlog
loggers see it too). Events are logged exactly as through structlog's own lazy loggers.

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
>>> get_logger("eventlane.doc").bind(topic="t")
<Logger eventlane.doc {'topic': 't'}>
"""

from __future__ import annotations

import os
import sys
from typing import Any

from framework.errors import ConfigError

__all__ = [
    "LEVELS",
    "Logger",
    "apply_pending",
    "configure_logging",
    "get_logger",
    "log_level_name",
]

LEVELS: dict[str, int] = {  # the logging module's level numbers
    "debug": 10,
    "info": 20,
    "warning": 30,
    "error": 40,
    "critical": 50,
}
_FORMATS = ("console", "json")
_pending: tuple[str, bool] | None = None
"""``(level, json)`` asked for while structlog was not loaded yet."""
_structlog: Any = None
"""The structlog module, once loaded (see the module docstring)."""


class Logger:
    """A structlog logger that loads structlog on its first use (see the module docstring).

    ``bind`` returns another :class:`Logger` (nothing is loaded); every other attribute
    (``debug``, ``info``, ``warning``, ``error``, ``exception``, ...) is that of
    ``structlog.get_logger(name, **bound)``, structlog's lazy proxy, so configuration made at
    any time applies, as it does to module-level structlog loggers.

    While structlog is not configured, the events go through a private pipeline to
    standard error instead (see the module docstring); the choice is made at every call.
    """

    __slots__ = ("_bound", "_fallback", "_name", "_proxy")

    def __init__(self, name: str, bound: dict[str, Any] | None = None) -> None:
        self._name = name
        self._bound: dict[str, Any] = bound or {}
        self._proxy: Any = None
        self._fallback: Any = None

    def bind(self, **values: Any) -> Logger:
        return Logger(self._name, {**self._bound, **values})

    def __getattr__(self, attr: str) -> Any:
        if _pending is not None or _structlog is None:
            apply_pending()
            _load()
        if _structlog.is_configured():
            proxy = self._proxy
            if proxy is None:
                proxy = self._proxy = _structlog.get_logger(self._name, **self._bound)
            return getattr(proxy, attr)
        fallback = self._fallback
        if fallback is None:
            fallback = self._fallback = _unconfigured_logger(self._name, self._bound)
        return getattr(fallback, attr)

    def __repr__(self) -> str:
        return f"<Logger {self._name} {self._bound}>"


def get_logger(name: str) -> Logger:
    """The logger ``name`` (``eventlane.<layer>``); structlog is loaded when it first logs."""
    return Logger(name)


def _load() -> Any:
    global _structlog  # noqa: PLW0603 - process-wide logging state
    if _structlog is None:
        import structlog  # noqa: PLC0415 - loaded on first use (module docstring)

        _structlog = structlog
    return _structlog


def _unconfigured_logger(name: str, bound: dict[str, Any]) -> Any:
    """A logger for ``name`` with the pipeline :func:`configure_logging` would set up from the
    environment (an unusable setting counts as the default), writing to standard error,
    without touching structlog's global configuration."""
    try:
        level, json = _settings(None, None)
    except ConfigError:
        level, json = "warning", False
    structlog = _load()
    processors, wrapper_class = _pipeline(level, json)
    return structlog.wrap_logger(
        _StderrLogger(name), processors=processors, wrapper_class=wrapper_class, **bound
    )


def apply_pending() -> None:
    """Apply a configuration asked for before structlog was loaded (loading it now)."""
    global _pending  # noqa: PLW0603 - process-wide logging state
    if _pending is not None:
        level, json = _pending
        _pending = None
        _apply(level, json)


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
    an unknown level or format. While structlog is not loaded, the configuration is applied
    when it is (:func:`apply_pending`).
    """
    global _pending  # noqa: PLW0603 - process-wide logging state
    name, json = _settings(level, json)
    if "structlog" not in sys.modules:
        _pending = (name, json)
        return
    _pending = None
    _apply(name, json)


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


def _apply(name: str, json: bool) -> None:
    structlog = _load()
    processors, wrapper_class = _pipeline(name, json)
    structlog.configure(
        processors=processors,
        wrapper_class=wrapper_class,
        logger_factory=_stderr_logger_factory,
        cache_logger_on_first_use=False,
    )


def _pipeline(name: str, json: bool) -> tuple[list[Any], Any]:
    """The processors and the level-filtering wrapper class for ``(level, json)``."""
    structlog = _load()
    renderer: Any
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        isatty = getattr(sys.stderr, "isatty", None)
        renderer = structlog.dev.ConsoleRenderer(colors=bool(isatty and isatty()))
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        *([structlog.processors.dict_tracebacks] if json else []),
        renderer,
    ]
    return processors, structlog.make_filtering_bound_logger(LEVELS[name])


def log_level_name() -> str:
    """The level name :func:`configure_logging` uses when called without arguments."""
    return (os.environ.get("EVENTLANE_LOG_LEVEL") or "warning").strip().lower()

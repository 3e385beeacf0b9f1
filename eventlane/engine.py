"""Opening an engine: the one place above ``eventlane/log`` that names ``LogStore``.

:func:`open_log` turns a data directory or a URL into a :class:`~eventlane.log.Log`;
:func:`open_engine` returns the :class:`Engine` bundle an application runs on: the log, the
local directory (read models, pause files, shadows) and the consumer-group coordination.

* A path (or ``file://`` URL, or nothing: ``$EVENTLANE_DATA`` or ``./eventlane-data``) opens
  the embedded engine, ``LogStore``, whose local directory is the data directory itself.
* Another scheme (``nats://...``) is looked up among the registered openers: those added by
  :func:`register_engine` and those of the entry-point group ``eventlane.engines`` (loaded
  only when that scheme is asked for, so this module imports no optional dependency).
  An unknown scheme is a :class:`~eventlane.errors.ConfigError` naming the known ones.

An opener is ``opener(url: str, local: LocalDir) -> Log``. :func:`log_locator` is the
inverse: what another process passes to :func:`open_log` to open the same log (a Spark
executor reading a replay's ranges): the resolved data directory of an embedded log, the
``url`` attribute of any other engine's log.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urlsplit

from eventlane.errors import ConfigError
from eventlane.log.embedded.store import LogStore
from eventlane.log.local import DEFAULT_DATA_DIR, LocalDir, default_data_dir
from eventlane.log.port import Log

if TYPE_CHECKING:  # the consumer layer is imported by open_engine, not by every command
    from eventlane.consumer.coordination import GroupCoordination

__all__ = [
    "DEFAULT_DATA_DIR",
    "ENTRY_POINT_GROUP",
    "Engine",
    "Opener",
    "default_data_dir",
    "log_locator",
    "open_engine",
    "open_log",
    "register_engine",
]

ENTRY_POINT_GROUP = "eventlane.engines"

Opener = Callable[[str, LocalDir], Log]
"""Opens the log at a URL; ``local`` is the local directory the caller chose."""

_openers: dict[str, Opener] = {}


def register_engine(scheme: str, opener: Opener) -> None:
    """Make ``open_log``/``open_engine`` open URLs of ``scheme`` with ``opener``."""
    _openers[scheme.lower()] = opener


def _scheme(target: str) -> str | None:
    """The URL scheme of ``target``, or ``None`` for a plain path (``C:`` is no scheme)."""
    if "://" not in target:
        return None
    return urlsplit(target).scheme.lower() or None


def _opener(scheme: str) -> Opener:
    opener = _openers.get(scheme)
    if opener is not None:
        return opener
    from importlib.metadata import entry_points  # noqa: PLC0415 - slow: URLs only

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower() == scheme:
            loaded: Opener = ep.load()
            _openers[scheme] = loaded
            return loaded
    known = sorted({"file", *_openers, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})
    raise ConfigError(
        f"no log engine for URL scheme {scheme!r}: known schemes are {', '.join(known)}"
        " (or pass a data directory path)"
    )


def open_log(target: str | Path | None = None, *, data_dir: str | Path | None = None) -> Log:
    """The log at ``target``: a data directory, a ``file://`` URL or another engine's URL
    (default: the data directory). ``data_dir`` is the local directory of a non-embedded
    engine (default: the same default data directory)."""
    local = LocalDir(Path(data_dir) if data_dir is not None else default_data_dir())
    if target is None:
        return LogStore(local.root)
    text = os.fspath(target)
    scheme = _scheme(text)
    if scheme is None:
        return LogStore(text)
    if scheme == "file":
        path = urlsplit(text).path
        if not path:
            raise ConfigError(f"file URL {text!r} names no directory")
        return LogStore(path)
    return _opener(scheme)(text, local)


def log_locator(target: Log | str | Path) -> str:
    """What :func:`open_log` opens ``target`` again by, in any process on any host that can
    reach it: an embedded log's data directory (resolved to an absolute path; on a cluster
    it must be shared storage), another engine's URL (its log's ``url`` attribute, e.g.
    ``nats://h1:4222,h2:4222?namespace=ns``). A path or URL is returned normalised the same
    way. A log of another engine without a ``url`` is a :class:`ConfigError`.

    >>> log_locator("nats://127.0.0.1:4222")
    'nats://127.0.0.1:4222'
    """
    if isinstance(target, str | Path):
        text = os.fspath(target)
        scheme = _scheme(text)
        if scheme is None:
            return str(Path(text).resolve())
        if scheme == "file":
            return str(Path(urlsplit(text).path).resolve())
        return text
    if isinstance(target, LogStore):
        return str(Path(target.path).resolve())
    url = getattr(target, "url", None)
    if isinstance(url, str) and _scheme(url) not in (None, "file"):
        return url
    raise ConfigError(
        f"a {type(target).__name__} log has no URL another process could open it by"
        " (an engine's log needs a `url` attribute for Spark replays)"
    )


class Engine(NamedTuple):
    """What an application runs on. Close it with :meth:`close` (or use ``with``)."""

    log: Log
    local: LocalDir
    groups: GroupCoordination

    def close(self) -> None:
        self.log.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_engine(
    data_dir: str | Path | None = None,
    log_url: str | None = None,
    *,
    groups: Callable[[Log], GroupCoordination] | None = None,
) -> Engine:
    """Open the engine: the log at ``log_url`` (default: the embedded log in ``data_dir``)
    with ``data_dir`` as the local directory, and group coordination (default: the one
    that goes with the log, :func:`~eventlane.consumer.coordination.coordination_for`)."""
    log_ = open_log(log_url if log_url is not None else data_dir, data_dir=data_dir)
    try:
        if groups is None:
            from eventlane.consumer.coordination import coordination_for  # noqa: PLC0415

            groups = coordination_for
        coordination = groups(log_)
    except BaseException:
        log_.close()
        raise
    return Engine(log_, log_.local, coordination)

"""What the engines on a server cluster share: their URL's shape and the wake-up sequence.

* A log URL is ``<scheme>://host:port[,host:port...][?name=value&...]``: the hosts of the
  cluster (the client picks one and moves on when it fails), then the engine's options.
  :func:`parse_log_url` parses that shape once, with the engine's scheme and options; an
  unknown option or another scheme is a :class:`~eventlane.errors.ConfigError` naming it.
* :class:`WakeSequence`: a process's count of the appends it knows of (its own, and the
  wake messages other processes send through the cluster), which tailing readers sleep on
  (``Log.wait_seq`` / ``Log.wait``). It only grows; ``wait`` returns once it moved past what
  the caller saw, or at its timeout. Callable from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from eventlane.errors import ConfigError


def parse_log_url(
    url: str, scheme: str, options: Mapping[str, Callable[[str], Any]]
) -> tuple[list[str], dict[str, Any]]:
    """``scheme://h1:p1,h2:p2?name=value`` -> ``(["h1:p1", "h2:p2"], {name: parsed})``, each
    option parsed by ``options[name]`` (the last value given wins).

    >>> parse_log_url("nats://a:1,b:2?replicas=1", "nats", {"replicas": int})
    (['a:1', 'b:2'], {'replicas': 1})
    """
    parts = urlsplit(url)
    if parts.scheme != scheme or not parts.netloc:
        raise ConfigError(f"a log URL looks like {scheme}://host:port[,host:port], got {url!r}")
    hosts = [h for h in parts.netloc.split(",") if h]
    out: dict[str, Any] = {}
    for name, values in parse_qs(parts.query).items():
        parse = options.get(name)
        if parse is None:
            raise ConfigError(f"unknown option {name!r} in log URL {url!r}")
        try:
            out[name] = parse(values[-1])
        except ValueError as exc:
            raise ConfigError(f"bad value {values[-1]!r} for {name!r} in log URL {url!r}") from exc
    return hosts, out


class WakeSequence:
    """The wake-up count of one log object (module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._seq = 0
        self._waiting = 0  # threads in wait(), counted under the lock

    def bump(self) -> None:
        """Count a wake-up and wake every waiter (an append's step: no notify when none
        waits)."""
        with self._cond:
            self._seq += 1
            if self._waiting:
                self._cond.notify_all()

    def current(self) -> int:
        with self._cond:
            return self._seq

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until the count is no longer ``seen`` (or ``timeout`` seconds)."""
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: self._seq != seen, timeout)
            finally:
                self._waiting -= 1

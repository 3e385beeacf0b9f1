"""The listener's Prometheus instruments (names in :mod:`eventlane.metrics`): requests by API
and error code, request latency, bytes in and out, open connections, in-flight bytes.

Invariant: every update is behind ``if M.on`` at its call site, so a listener without a
metrics endpoint pays one attribute test per request and imports nothing; labels are API
names (the listener's ~20) and Kafka's error names, never a topic, client or member id.
A request counts once, with the first error code its response carries (the top-level one,
else the first partition's, in response order), ``NONE`` when there is none.
"""

from __future__ import annotations

import functools
from typing import Any

from eventlane.kafka.codes import Errors
from eventlane.kafka.protocol import REQUESTS
from eventlane.metrics import M

API_NAMES: dict[int, str] = {
    key: cls.__name__.removesuffix("Request") for key, cls in REQUESTS.items()
}
"""API key -> Kafka's API name (``Produce``, ``Fetch``...); unknown keys are ``unknown``."""


@functools.cache
def error_name(code: int) -> str:
    """Kafka's name of an error code (``NONE`` for 0)."""
    return "NONE" if code == 0 else str(Errors.for_code(code).message)


_LAYOUTS: dict[type, tuple[bool, tuple[str, ...], tuple[str, ...]]] = {}


def _layout(cls: type) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """(has ``error_code``, struct-array fields, struct fields) of a message class."""
    known = _LAYOUTS.get(cls)
    if known is not None:
        return known
    fields = getattr(cls, "_struct", None)
    if fields is None:
        return False, (), ()
    items = fields.fields.items()
    layout = _LAYOUTS[cls] = (
        "error_code" in fields.fields,
        tuple(n for n, f in items if f.is_struct_array()),
        tuple(n for n, f in items if f.is_struct()),
    )
    return layout


def first_error(message: Any) -> int:
    """The first non-zero ``error_code`` in ``message`` (depth first, in field order), 0 if
    none."""
    has_code, arrays, structs = _layout(type(message))
    code = getattr(message, "error_code", 0) if has_code else 0
    if code:
        return int(code)
    for name in arrays:
        for item in getattr(message, name, None) or ():
            if code := first_error(item):
                return code
    for name in structs:
        item = getattr(message, name, None)
        if item is not None and (code := first_error(item)):
            return code
    return 0


def observe(api_key: int, code: int, received: int, sent: int, seconds: float) -> None:
    """Count one request (call only when ``M.on``)."""
    api = API_NAMES.get(api_key, "unknown")
    M.kafka_requests.labels(api, error_name(code)).inc()
    M.kafka_request_seconds.labels(api).observe(seconds)
    M.kafka_received_bytes.labels(api).inc(received)
    if sent:
        M.kafka_sent_bytes.labels(api).inc(sent)

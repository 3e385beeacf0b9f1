"""How eventlane's log maps onto JetStream: names, subjects and message headers.

* A topic partition is one stream, ``<ns>-<enc(topic)>-<partition>``, holding the subjects
  ``<ns>.<enc(topic)>.<partition>.*``; the stream sequence ``s`` is the offset ``s - 1``.
* ``enc`` keeps ``[A-Za-z0-9]`` and writes every other byte as ``_XX`` (upper-case hex), so
  it is reversible and collision-free, and the result is a legal stream name and subject
  token (no ``.``, ``*``, ``>``, whitespace or path separator). ``orders.v1`` -> ``orders_2Ev1``.
* A record key is the last subject token (``g`` is reserved): ``_`` for no key,
  ``k<base64url(key)>`` for keys of up to :data:`MAX_INLINE_KEY` bytes, else
  ``h<blake2b-256 hex>`` with the key itself in the ``El-Key`` header. The server's
  per-subject state is therefore the per-key state.
* Headers: ``El-Ts`` (timestamp, ms), ``El-Tt: 1`` (LogAppendTime), ``El-Null: 1`` (a
  tombstone: null value), ``El-H`` (the record's ordered headers, base64url of a JSON list of
  ``[name, base64url(value) | null]``). The payload is the value bytes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from datetime import datetime

import orjson

from eventlane.errors import InvalidTopicError
from eventlane.log.record import Header, Record, TimestampType

MAX_INLINE_KEY = 192
H_TS, H_TT, H_NULL, H_HDRS, H_KEY = "El-Ts", "El-Tt", "El-Null", "El-H", "El-Key"
NO_KEY = "_"
FILLER = "g"  # reserved token: offset-keeping fillers of a migration, purged after it
_PLAIN = re.compile(rb"[A-Za-z0-9]")
_NAMESPACE = re.compile(r"[A-Za-z0-9]{1,32}")
_ESCAPE = re.compile(r"_([0-9A-F]{2})")


def check_namespace(ns: str) -> str:
    if not _NAMESPACE.fullmatch(ns):
        raise InvalidTopicError(f"namespace {ns!r} must be 1 to 32 ASCII letters or digits")
    return ns


@functools.lru_cache(maxsize=4096)
def encode_name(topic: str) -> str:
    """``topic`` as a stream-name and subject-token safe string (reversible; remembered:
    every append and read names its stream and subjects).

    >>> encode_name("customers.state_v2-x")
    'customers_2Estate_5Fv2_2Dx'
    >>> decode_name(encode_name("a._-b")) == "a._-b"
    True
    """
    return "".join(chr(b) if _PLAIN.fullmatch(bytes([b])) else f"_{b:02X}" for b in topic.encode())


def decode_name(encoded: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), encoded)


def stream_name(ns: str, topic: str, partition: int) -> str:
    return f"{ns}-{encode_name(topic)}-{partition}"


def subject_prefix(ns: str, topic: str, partition: int) -> str:
    return f"{ns}.{encode_name(topic)}.{partition}"


def wake_subject(ns: str) -> str:
    """A core-NATS subject (in no stream) on which appenders announce new records."""
    return f"{ns}.__wake"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def key_token(key: bytes | None) -> str:
    """The subject token of ``key`` (see the module docstring)."""
    if key is None:
        return NO_KEY
    if len(key) <= MAX_INLINE_KEY:
        return "k" + _b64(key)
    return "h" + hashlib.blake2b(key, digest_size=32).hexdigest()


def key_from_token(token: str, headers: dict[str, str] | None) -> bytes | None:
    if token == NO_KEY:
        return None
    if token[0] == "k":
        return _unb64(token[1:])
    if headers is None or H_KEY not in headers:
        raise ValueError(f"hashed key token {token[:12]}... without an {H_KEY} header")
    return _unb64(headers[H_KEY])


def encode_headers(
    key: bytes | None,
    value: bytes | None,
    headers: tuple[Header, ...],
    timestamp: int,
    log_append_time: bool,
) -> dict[str, str]:
    out = {H_TS: str(timestamp)}
    if log_append_time:
        out[H_TT] = "1"
    if value is None:
        out[H_NULL] = "1"
    if headers:
        body = [[name, None if v is None else _b64(v)] for name, v in headers]
        out[H_HDRS] = _b64(orjson.dumps(body))
    if key is not None and len(key) > MAX_INLINE_KEY:
        out[H_KEY] = _b64(key)
    return out


def decode_headers(raw: str | None) -> tuple[Header, ...]:
    if not raw:
        return ()
    return tuple(
        (str(name), None if v is None else _unb64(v)) for name, v in orjson.loads(_unb64(raw))
    )


def record_of(
    topic: str,
    partition: int,
    offset: int,
    subject: str,
    data: bytes,
    hdrs: dict[str, str],
    stamp_ns: int | None = None,
) -> Record:
    """The record a stored message is. Its timestamp: ``El-Ts``, else the server's
    (``stamp_ns``, a delivered message's, or a direct get's ``Nats-Time-Stamp``)."""
    token = subject.rsplit(".", 1)[-1]
    if H_TS in hdrs:
        ts = int(hdrs[H_TS])
    elif stamp_ns is not None:
        ts = stamp_ns // 1_000_000
    else:
        ts = server_time(hdrs.get("Nats-Time-Stamp"))
    return Record(
        topic,
        partition,
        offset,
        ts,
        TimestampType.LOG_APPEND_TIME if hdrs.get(H_TT) else TimestampType.CREATE_TIME,
        key_from_token(token, hdrs),
        None if hdrs.get(H_NULL) else data,
        decode_headers(hdrs.get(H_HDRS)),
    )


def server_time(stamp: str | None) -> int:
    """Milliseconds of the server's ``Nats-Time-Stamp`` (RFC 3339, UTC); 0 if none."""
    if not stamp:
        return 0
    head, _, frac = stamp.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head + "+00:00")
    return int(base.timestamp() * 1000) + int((frac + "000")[:3])

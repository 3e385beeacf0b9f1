"""A nats-py client whose message-header parse costs a third of the stock one.

Every record a JetStream read brings back is a batched direct-get answer with seven or so
headers (``Nats-Stream``, ``Nats-Subject``, ``Nats-Sequence``, ``Nats-Time-Stamp``,
``Nats-Num-Pending``, ``Nats-Last-Sequence`` and the record's own ``El-*``). nats-py 2.16
parses each header block in Python, checking every character of every name for
whitespace: 12-19 us of the ~30 us of client CPU a consumed record costs (issue 36 item 3).
:class:`HeaderClient` replaces that one static method, ``Client._parse_header_lines``, with
:func:`parse_header_lines`.

Invariant: :func:`parse_header_lines` returns exactly what nats-py's own parse returns for
every input (``tests/jetstream/test_header_parse.py`` holds it to nats-py's function, the
model, over generated blocks, and fails if nats-py renames the method). It differs only in
how: the block is decoded once (UTF-8 with replacement never absorbs an ASCII byte, so the
``\\r\\n`` and ``:`` boundaries are where they were in the bytes), and a header name's
verdict (its stripped text, or "skip it") is remembered in a bounded table, since the same
few names recur on every message.
"""

from __future__ import annotations

import re

from nats.aio.client import Client

_ASCII_SPACE = " \t\n\r\x0b\x0c"
"""What ``bytes.strip()`` removes (``str.strip()`` would also remove non-ASCII spaces)."""

_SPACE = re.compile(r"\s")  # the characters ``str.isspace`` holds true
_NAMES: dict[str, str | None] = {}
"""Each header name seen (as text) -> the key nats-py stores it under, or None: dropped."""
_MAX_NAMES = 1024


def _verdict(name: str) -> str | None:
    key = name.strip(_ASCII_SPACE)
    if not key.isascii() or _SPACE.search(key) is not None:
        return None
    return key


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """``Name: Value\\r\\n`` lines as nats-py's ``Client._parse_header_lines`` reads them."""
    out: dict[str, str] = {}
    names = _NAMES
    for line in raw.decode("utf-8", "replace").split("\r\n"):
        name, sep, value = line.partition(":")
        if not sep:
            continue
        if name in names:
            key = names[name]
        else:
            key = _verdict(name)
            if len(names) < _MAX_NAMES:
                names[name] = key
        if key is not None:
            out[key] = value.strip(_ASCII_SPACE)
    return out


class HeaderClient(Client):
    """nats-py's client with :func:`parse_header_lines` (module docstring)."""

    _parse_header_lines = staticmethod(parse_header_lines)

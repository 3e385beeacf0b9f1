"""``headers.parse_header_lines`` against nats-py's own header parse, the model.

The JetStream log's client swaps nats-py's ``Client._parse_header_lines`` for a faster one
(``eventlane/log/jetstream/headers.py``); every message the log receives goes through it, so
it must give nats-py's answer for every header block: generated blocks mix real header
names, names with inner or non-ASCII whitespace, non-ASCII and invalid UTF-8 bytes, empty
names, lines without a colon and stray CR / LF bytes.
"""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from eventlane.log.jetstream import headers
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog

PIECES = [
    b"Nats-Stream",
    b"Nats-Sequence",
    b"El-Ts",
    b" ",
    b"\t",
    b"\x0b",
    b"\x1c",
    b"\x85",
    b"\xc2\xa0",
    b"\xe2\x80",
    b"\xff",
    b"\xc3\xa9",
    b":",
    b"\r",
    b"\n",
    b"\r\n",
    b"",
]
chunk = st.one_of(st.sampled_from(PIECES), st.binary(max_size=6))
line = st.lists(chunk, max_size=6).map(b"".join)
block = st.lists(line, max_size=8).map(b"\r\n".join)


@settings(max_examples=300, deadline=None)
@given(block)
def test_parse_is_nats_pys_parse(raw: bytes) -> None:
    model = Client._parse_header_lines(raw)
    assert headers.parse_header_lines(raw) == model
    assert headers.parse_header_lines(raw) == model  # the names' verdicts now remembered


def test_the_client_replaces_nats_pys_method() -> None:
    # if nats-py renamed or dropped the method, the override would silently do nothing
    assert "_parse_header_lines" in vars(Client)
    assert headers.HeaderClient._parse_header_lines is headers.parse_header_lines
    direct = (
        b"Nats-Stream: s-t-0\r\nNats-Subject: s.t.0._\r\nNats-Sequence: 12\r\n"
        b"Nats-Time-Stamp: 2026-11-28T06:28:12.123456789Z\r\nEl-Ts: 1764311292123\r\n"
        b"Nats-Num-Pending: 3\r\nNats-Last-Sequence: 11\r\n\r\n"
    )
    assert headers.parse_header_lines(direct) == Client._parse_header_lines(direct)
    assert headers.parse_header_lines(direct)["Nats-Sequence"] == "12"


def test_the_log_reads_through_the_client(cluster: LocalCluster) -> None:
    with JetStreamLog.from_url(cluster.url, namespace="h" + uuid.uuid4().hex[:8]) as js:
        js.create_topic("t", 1)
        sent = [(b"k%d" % i, b"v%d" % i, (("h", b"x"), ("n", None)), None) for i in range(5)]
        js.append("t", 0, sent)
        records, _ = js.read("t", 0, 0)
        assert isinstance(js._conn.nc, headers.HeaderClient)
        got = [(r.key, r.value, r.headers) for r in records]
        assert got == [(k, v, h) for k, v, h, _ in sent]

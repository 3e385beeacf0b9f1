"""Request/reply over the log (the seeds' sync-over-async pattern): "which invoice has order X?".

* The asker first assigns a free consumer to **every** partition of ``invoicing.replies`` at
  the high-water mark (so no reply can slip past it), then appends a query to
  ``invoicing.queries`` with a fresh ``correlation-id`` header and a ``reply-to`` header,
  and polls until the reply with its correlation id arrives or the timeout passes.
* The responder is a consumer group (``invoicing-queries``) reading the queries topic; it
  answers from the ``invoices`` read model and appends the reply, keyed by order id, with
  the query's correlation id. Several responders share the query partitions.

Reply value: ``{"order_id": ..., "invoice": {"invoice_id", "amount_cents", "paid_cents",
"status"} | null}``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from eventlane import Consumer, GroupConsumer, Producer, ProducerRecord, TopicPartition
from eventlane.log import Log

QUERIES = "invoicing.queries"
REPLIES = "invoicing.replies"
RESPONDERS = "invoicing-queries"


def ensure_topics(log: Log) -> None:
    for topic in (QUERIES, REPLIES):
        log.create_topic(topic, 3, {"retention_ms": 3_600_000}, exist_ok=True)


def _header(headers: tuple[tuple[str, bytes | None], ...], name: str) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def ask_invoice_for(
    log: Log, order_id: str, *, timeout: float = 5.0, resend: float = 1.0
) -> dict[str, Any]:
    """Ask the responders for ``order_id``'s invoice; raise ``TimeoutError`` if none answers.

    The query is sent again every ``resend`` seconds with the same correlation id (a
    responder that was still joining its group may have started past the first copy); the
    first reply wins.
    """
    ensure_topics(log)
    replies = Consumer(log, auto_offset_reset="latest")
    replies.assign([TopicPartition(REPLIES, p) for p in range(log.partition_count(REPLIES))])
    replies.seek_to_end()
    correlation = uuid.uuid4().hex.encode()
    query = ProducerRecord(
        order_id.encode(),
        orjson.dumps({"order_id": order_id}),
        (("correlation-id", correlation), ("reply-to", REPLIES.encode())),
    )
    producer = Producer(log)
    deadline = time.monotonic() + timeout
    next_send = 0.0
    while (remaining := deadline - time.monotonic()) > 0:
        if time.monotonic() >= next_send:
            producer.send_batch(QUERIES, [query])
            next_send = time.monotonic() + resend
        for record in replies.poll(min(remaining, resend)):
            if _header(record.headers, "correlation-id") == correlation and record.value:
                answer: dict[str, Any] = orjson.loads(record.value)
                return answer
    raise TimeoutError(
        f"no reply for order {order_id!r} within {timeout} s (is a responder"
        " running? `eventlane invoicing serve`)"
    )


def serve_queries(
    log: Log, readmodel: str, stop: threading.Event, *, session_timeout_ms: int = 10_000
) -> int:
    """Answer queries until ``stop`` is set; return how many were answered."""
    ensure_topics(log)
    consumer = GroupConsumer(
        log,
        group_id=RESPONDERS,
        topics=[QUERIES],
        auto_offset_reset="latest",
        enable_auto_commit=True,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=min(1000, session_timeout_ms // 3),
    )
    producer = Producer(log)
    answered = 0
    db: sqlite3.Connection | None = None
    try:
        while not stop.is_set():
            out = []
            for record in consumer.poll(0.2):
                query = orjson.loads(record.value or b"{}")
                order_id = str(query.get("order_id", ""))
                if db is None and Path(readmodel).exists():
                    db = sqlite3.connect(f"file:{readmodel}?mode=ro", uri=True)
                row = (
                    None
                    if db is None
                    else db.execute(
                        "SELECT invoice_id, amount_cents, paid_cents, status FROM invoices WHERE"
                        " order_id = ?",
                        (order_id,),
                    ).fetchone()
                )
                invoice = (
                    None
                    if row is None
                    else dict(
                        zip(
                            ("invoice_id", "amount_cents", "paid_cents", "status"), row, strict=True
                        )
                    )
                )
                # Replies go to the replies topic only, whatever a query's reply-to says:
                # a query must not make the responder write to an arbitrary topic.
                out.append(
                    (
                        REPLIES,
                        ProducerRecord(
                            order_id.encode(),
                            orjson.dumps({"order_id": order_id, "invoice": invoice}),
                            (("correlation-id", _header(record.headers, "correlation-id") or b""),),
                        ),
                    )
                )
            for topic, reply in out:
                producer.send_batch(topic, [reply])
                answered += 1
            if out:
                consumer.commit()
    finally:
        if db is not None:
            db.close()
        consumer.close()
    return answered

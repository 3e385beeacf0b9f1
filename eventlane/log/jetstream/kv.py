"""A small replicated key-value store on a JetStream stream, with compare-and-set and fenced
multi-key writes (what group coordination needs; bytes only).

The bucket is the stream ``KV_<bucket>`` with subjects ``$KV.<bucket>.<key>`` (JetStream's
own KV layout, so ``nats kv`` tools can read it), one message kept per key, replicated like
the log, and ``allow_atomic`` so several keys can be written in one atomic batch.

* A key's *revision* is the stream sequence of its last write (0: never written / deleted).
* :meth:`Kv.get` reads from the stream leader (never a lagging replica), so a
  compare-and-set that follows it sees the truth.
* :meth:`Kv.put` with ``expect`` writes only if the key's revision is still ``expect``
  (``Nats-Expected-Last-Subject-Sequence``); :meth:`Kv.put_many` writes several keys at once,
  all or none, optionally only if *another* key (the fence) is still at a revision.
* :meth:`Kv.subscribe` calls back on every write under a key prefix (a core-NATS
  subscription on the subjects: a change feed, not a history).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import nats.errors
import nats.js.errors
import orjson
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

from eventlane.errors import ConcurrencyError, LogError, OutcomeUnknownError
from eventlane.log.jetstream.errors import maybe_stored
from eventlane.log.jetstream.log import JetStreamLog

DELETED = ("DEL", "PURGE")


class Kv:
    """Bucket ``bucket`` on the cluster behind ``log`` (created on first use)."""

    def __init__(self, log: JetStreamLog, bucket: str) -> None:
        self.log = log
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        config = StreamConfig(
            name=self.stream,
            subjects=[f"$KV.{bucket}.>"],
            num_replicas=log.replicas,
            storage=StorageType.FILE,
            max_msgs_per_subject=1,
            allow_rollup_hdrs=True,
            allow_direct=True,
            allow_atomic=True,
            discard=DiscardPolicy.NEW,
        )
        log.run(log.retry(functools.partial(log.js.add_stream, config), what="create bucket"))

    def subject(self, key: str) -> str:
        return f"$KV.{self.bucket}.{key}"

    def get(self, key: str) -> tuple[bytes | None, int]:
        """``(value, revision)`` from the leader; ``(None, 0)`` if absent or deleted."""

        async def go() -> tuple[bytes | None, int]:
            try:
                msg = await self.log.retry(
                    functools.partial(self.log.js.get_msg, self.stream, subject=self.subject(key)),
                    what="kv get",
                )
            except nats.js.errors.NotFoundError:
                return None, 0
            if (msg.headers or {}).get("KV-Operation") in DELETED:
                return None, int(msg.seq or 0)
            return msg.data or b"", int(msg.seq or 0)

        return self.log.run(go())

    def get_json(self, key: str) -> tuple[Any, int]:
        raw, rev = self.get(key)
        return (None if raw is None else orjson.loads(raw)), rev

    def put(self, key: str, value: bytes, *, expect: int | None = None) -> int:
        """Write ``value``; with ``expect``, only if the key is still at that revision
        (:class:`~eventlane.errors.ConcurrencyError` otherwise). Returns the new revision.

        A try that got no answer is sent again under the same ``Nats-Msg-Id``; if that
        repeat is refused by the expected revision, the refusal may be the first copy's own
        doing: the key's last write is read back, and is ours (a success) when it carries our
        message id; otherwise the outcome is unknown (:class:`OutcomeUnknownError`)."""
        msg_id = uuid.uuid4().hex
        headers = {"Nats-Msg-Id": msg_id}
        if expect is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expect)
        maybe = False

        async def publish() -> Any:
            nonlocal maybe
            try:
                return await self.log.js.publish(self.subject(key), value, headers=headers)
            except Exception as exc:
                maybe = maybe or maybe_stored(exc)
                raise

        async def go() -> int:
            try:
                ack = await self.log.retry(
                    publish,
                    what="kv put",
                    write=True,  # a repeat is harmless: same msg id
                )
            except nats.js.errors.APIError as exc:
                if not (maybe and (exc.description or "").startswith("wrong last sequence")):
                    raise _conflict(exc, key, expect) from None
                last = await self.log.retry(
                    functools.partial(self.log.js.get_msg, self.stream, subject=self.subject(key)),
                    what="kv get",
                )
                if (last.headers or {}).get("Nats-Msg-Id") == msg_id:
                    return int(last.seq or 0)
                raise OutcomeUnknownError(
                    f"kv key {key!r}: a repeated write was refused and the key's last write is"
                    " not ours; the first may or may not have been stored"
                ) from None
            return int(ack.seq)

        return self.log.run(go(), write=True)

    def delete(self, key: str) -> None:
        async def go() -> None:
            await self.log.retry(
                functools.partial(
                    self.log.js.publish,
                    self.subject(key),
                    b"",
                    headers={"KV-Operation": "PURGE", "Nats-Rollup": "sub"},
                ),
                what="kv delete",
                write=True,  # a purge: a repeat is harmless
            )

        self.log.run(go(), write=True)

    def put_many(self, values: Mapping[str, bytes], *, fence: tuple[str, int] | None = None) -> int:
        """Write every key of ``values`` at once (an atomic batch), only if ``fence``'s key is
        still at its revision when the server orders the batch. Returns the last revision."""
        if not values:
            raise LogError("put_many needs at least one key")
        extra: dict[str, str] = {}
        if fence is not None:
            extra = {
                "Nats-Expected-Last-Subject-Sequence": str(fence[1]),
                "Nats-Expected-Last-Subject-Sequence-Subject": self.subject(fence[0]),
            }
        msgs: list[tuple[str, bytes, dict[str, str]]] = [
            (self.subject(k), v, {}) for k, v in values.items()
        ]

        async def go() -> int:
            try:
                return await self.log.retry(
                    functools.partial(self.log.batch, msgs, extra), what="kv put_many", write=True
                )
            except nats.js.errors.APIError as exc:
                raise _conflict(
                    exc, fence[0] if fence else "", fence[1] if fence else None
                ) from None

        return self.log.run(go(), write=True)

    def list(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (a prefix ending in ``.``, or ``""`` for all), from the
        leader's per-subject state (a deleted key may still be listed: get it to check)."""
        flt = self.subject(prefix + ">") if prefix.endswith(".") or not prefix else None
        flt = flt or self.subject(prefix)

        async def go() -> list[str]:
            info = await self.log.retry(
                functools.partial(self.log.js.stream_info, self.stream, subjects_filter=flt),
                what="kv keys",
            )
            subjects = info.state.subjects or {}
            return sorted(s.split(".", 2)[2] for s in subjects)

        return self.log.run(go())

    def subscribe(self, prefix: str, callback: Callable[[str], None]) -> None:
        """Call ``callback(key)`` (on the log's event loop thread: keep it short) after every
        write to a key under ``prefix`` by any process."""

        async def on_msg(msg: Any) -> None:
            callback(str(msg.subject).split(".", 2)[2])

        async def go() -> None:
            await self.log.nc.subscribe(self.subject(prefix + ">"), cb=on_msg)

        self.log.run(go())


def _conflict(exc: nats.js.errors.APIError, key: str, expect: int | None) -> Exception:
    if (exc.description or "").startswith("wrong last sequence"):
        return ConcurrencyError(
            f"kv key {key!r} moved on", expected=-1 if expect is None else expect, actual=-1
        )
    return LogError(f"JetStream refused a kv write: {exc.description}")

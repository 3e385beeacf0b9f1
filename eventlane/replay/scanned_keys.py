"""Personal-data keys for replays from a log without per-key reads (Kafka's core log).

An app's keys live in a compacted topic (:class:`~eventlane.codec.keystore.LogKeyStore`,
which finds a subject's record with the log's ``read_key``). A replay only decrypts, so on a
log that has no ``read_key`` it reads the key topic once, front to back, into a snapshot:
:class:`ScannedKeyStore`. Invariants: the snapshot is the topic's last record per subject
up to the high-water marks when it was taken (a tombstone: the subject is forgotten, its
fields read as erased); it never writes (creating, rotating or forgetting a key is a
:class:`~eventlane.errors.ReplayError`); its ``changes()`` never moves. Memory grows with
the number of subjects, as the key topic does after compaction.
"""

from __future__ import annotations

import binascii

import orjson

from eventlane.codec.keystore import Keyring
from eventlane.errors import ReplayError, SerializationError
from eventlane.log import Log


class ScannedKeyStore:
    """A read-only :class:`~eventlane.codec.keystore.KeyStore`: the key topic's snapshot."""

    def __init__(self, log: Log, topic: str) -> None:
        self.topic = topic
        self._rings: dict[str, Keyring | None] = {}
        if not log.topic_exists(topic):
            return  # no key written yet: every subject reads as having none
        for p in range(log.partition_count(topic)):
            lwm, hwm, _ = log.offsets(topic, p)
            offset = lwm
            while offset < hwm:
                records, _ = log.read(topic, p, offset, upto=hwm)
                if not records:
                    break
                for r in records:
                    if r.key is not None:
                        self._rings[r.key.decode()] = self._parse(r.value, p, r.offset)
                offset = records[-1].offset + 1

    def _parse(self, value: bytes | None, partition: int, offset: int) -> Keyring | None:
        if value is None:
            return None
        try:
            doc = orjson.loads(value)
            keys = tuple(binascii.a2b_base64(k) for k in doc["keys"])
            return Keyring(int(doc.get("first", 1)), keys)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SerializationError(
                f"key record is not a key list: {exc}",
                topic=self.topic,
                partition=partition,
                offset=offset,
            ) from None

    def get(self, subject: str, version: int) -> bytes | None:
        ring = self._rings.get(subject)
        return None if ring is None else ring.get(version)

    def changes(self) -> int:
        return 0

    def holds(self, subject: str) -> bool:
        return True  # (a snapshot in memory)

    def current(self, subject: str) -> tuple[int, bytes]:
        raise ReplayError(f"a replay does not create keys (subject {subject!r})")

    def rotate(self, subject: str) -> int:
        raise ReplayError(f"a replay does not rotate keys (subject {subject!r})")

    def forget(self, subject: str) -> bool:
        raise ReplayError(f"a replay does not forget keys (subject {subject!r})")

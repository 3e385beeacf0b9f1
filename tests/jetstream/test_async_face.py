"""AsyncJetStreamLog: the JetStream data path awaited on the caller's event loop.

The async face runs the same append plan and read coroutines as the sync log, on a
connection of the caller's loop (no bridge thread). Checked against the sync log reading the
same streams (the model: what was acknowledged is what is there, once, in order).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest

from eventlane.errors import ConcurrencyError, UnknownPartitionError, UnknownTopicError
from eventlane.log.jetstream.aio import AsyncJetStreamLog
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.types import Expect


def _bridge_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "eventlane-jetstream"]


def test_the_async_face_awaits_on_the_callers_loop_and_agrees_with_the_sync_log(
    cluster: LocalCluster, namespace: str
) -> None:
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
        js.create_topic("orders", 2)
    threads_before = len(_bridge_threads())

    async def go() -> list[tuple[int, bytes]]:
        async with AsyncJetStreamLog.from_url(cluster.url, namespace=namespace) as log:
            assert len(_bridge_threads()) == threads_before  # no thread of its own
            assert await log.partition_count("orders") == 2
            one = await log.append("orders", 1, [(b"a", b"1", (), None)])
            two = await log.append("orders", 1, [(b"b", b"2", (), 7), (b"a", b"3", (), None)])
            assert (one.base_offset, two.base_offset, two.last_offset) == (0, 1, 2)
            assert two.timestamps[0] == 7
            assert await log.key_head("orders", 1, b"a") == 2
            assert await log.key_head("orders", 1, b"zz") is None
            assert [r.value for r in await log.read_key("orders", 1, b"a")] == [b"1", b"3"]
            assert [r.value for r in await log.read_key("orders", 1, b"a", after=0)] == [b"3"]
            assert (await log.offsets("orders", 1)).hwm == 3
            records = await log.read("orders", 1, 0)
            with pytest.raises(UnknownPartitionError):
                await log.append("orders", 2, [(b"a", b"x", (), None)])
            with pytest.raises(UnknownTopicError):
                await log.read("nope", 0, 0)
            return [(r.offset, r.value or b"") for r in records]

    seen = asyncio.run(go())
    assert seen == [(0, b"1"), (1, b"2"), (2, b"3")]
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
        # a read may be answered by a replica a moment behind the leader (a prefix, as a
        # Kafka fetch from a follower): read on from where it ended, as a consumer does
        records, _ = js.read("orders", 1, 0)
        deadline = time.monotonic() + 10
        while len(records) < 3 and time.monotonic() < deadline:
            more, _ = js.read("orders", 1, records[-1].offset + 1 if records else 0)
            records += more
        assert [(r.offset, r.key, r.value) for r in records] == [
            (0, b"a", b"1"),
            (1, b"b", b"2"),
            (2, b"a", b"3"),
        ]


def test_concurrent_tasks_conditional_appends_never_fork_a_key(
    cluster: LocalCluster, namespace: str
) -> None:
    """16 tasks x 3 keys, each appending conditionally on the last offset it read and
    retrying on conflict: each key's history is the model's (one record per win, every
    win acknowledged once), losers got ConcurrencyError, nothing else."""
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
        js.create_topic("cas", 1)
    rng = random.Random(11)
    won: dict[bytes, list[bytes]] = {b"k0": [], b"k1": [], b"k2": []}
    conflicts = 0

    async def writer(log: AsyncJetStreamLog, w: int) -> None:
        nonlocal conflicts
        key = rng.choice(sorted(won))
        for i in range(6):
            value = b"%d-%d" % (w, i)
            while True:
                last = await log.key_head("cas", 0, key)
                try:
                    await log.append("cas", 0, [(key, value, (), None)], expect=Expect(key, last))
                except ConcurrencyError:
                    conflicts += 1
                    continue
                won[key].append(value)
                break

    async def go() -> None:
        async with AsyncJetStreamLog.from_url(cluster.url, namespace=namespace) as log:
            await asyncio.wait_for(asyncio.gather(*(writer(log, w) for w in range(16))), 120)

    asyncio.run(go())
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
        for key, values in won.items():
            stored = [r.value for r in js.read_key("cas", 0, key)]
            assert sorted(stored) == sorted(values)  # every win stored, once
        assert js.offsets("cas", 0).hwm == 16 * 6
    assert conflicts > 0  # the tasks did race


def test_an_async_append_whose_ack_is_lost_is_sent_again_and_stored_once(
    cluster: LocalCluster, namespace: str
) -> None:
    """The async face shares the publisher's rules: no ack within ``timeout``, the append
    is published again with the same ``Nats-Msg-Id`` and stored once."""
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
        js.create_topic("lost", 1)

    async def go() -> None:
        log = AsyncJetStreamLog.from_url(cluster.url, namespace=namespace, timeout=0.3)
        async with log:
            await log.append("lost", 0, [(b"k", b"0", (), None)])
            answers = log._publisher.ack_prefix
            log._publisher.ack_prefix = f"{namespace}.nobody."  # the acks go nowhere
            sent_again: list[str] = []
            publish = log._conn.js.publish

            async def counted(subject: str, *args: Any, **kwargs: Any) -> Any:
                sent_again.append(subject)
                return await publish(subject, *args, **kwargs)

            log._conn.js.publish = counted
            got = await log.append("lost", 0, [(b"k", b"1", (), None)], expect=Expect(b"k", 0))
            assert got.base_offset == 1
            keys = [b"w%d" % w for w in range(4)]
            firsts = await asyncio.gather(
                *(log.append("lost", 0, [(k, b"a", (), None)]) for k in keys)
            )
            await asyncio.gather(
                *(
                    log.append("lost", 0, [(k, b"b", (), None)], expect=Expect(k, f.base_offset))
                    for k, f in zip(keys, firsts, strict=True)
                )
            )
            log._publisher.ack_prefix = answers
            assert len(sent_again) == 9

    asyncio.run(go())
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
        assert js.offsets("lost", 0).hwm == 10
        assert [r.value for r in js.read_key("lost", 0, b"k")] == [b"0", b"1"]


def test_tasks_that_find_topic_metadata_stale_share_one_registry_read(
    cluster: LocalCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 tasks that find a topic's cached metadata stale together make one registry read
    between them (each made its own: ~2 reads a command on a 64-client web server), and a
    topic's existence (a load's snapshot-topic check) is answered from that cache, either
    way. The answers are the registry's."""
    from eventlane.log.jetstream import topics  # noqa: PLC0415

    with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
        js.create_topic("orders", 3)

    async def go() -> tuple[list[int], list[bool], int, int]:
        async with AsyncJetStreamLog.from_url(cluster.url, namespace=namespace) as log:
            conn = log._conn
            reads: list[str] = []
            real = conn.kv.get

            async def counted(key: str, *args: Any, **kwargs: Any) -> Any:
                reads.append(key)
                return await real(key, *args, **kwargs)

            monkeypatch.setattr(conn.kv, "get", counted)
            counts = await asyncio.gather(*(log.partition_count("orders") for _ in range(64)))
            exists = await asyncio.gather(
                *(log.topic_exists(name) for name in ["orders", "nope"] * 32)
            )
            stale = len(reads)
            monkeypatch.setattr(topics, "META_TTL_S", 0.0)  # every call finds it stale now
            await asyncio.gather(*(log.partition_count("orders") for _ in range(64)))
            return counts, exists, stale, len(reads) - stale

    counts, exists, first, again = asyncio.run(go())
    assert counts == [3] * 64 and exists == [True, False] * 32
    assert first == 2, f"{first} registry reads for 64 + 64 calls (one a topic expected)"
    assert again == 1, f"{again} registry reads for 64 tasks that found the cache stale"

"""JetStream consume through a group member vs raw nats-py's fastest consumer, one run.

Issue 36 item 3's bar: a ``GroupConsumer`` member on a JetStream cluster reads at >= 0.8x
what raw nats-py reads doing the same (every record of a 4-partition topic, from the start,
in this process). The cluster is a real 3-node nats-server cluster on loopback ports
started by this script (replicas 3, fsync before ack). Per round, interleaved, each reader
drains all ``--records`` records (100-byte values) once:

* ``member``      a ``GroupConsumer`` (``JetStreamCoordination``, a fresh group each round,
                  auto-commit, ``max_poll_records`` 2,000) polling until it holds them all;
                  timed from its first fetch (its partitions are paused as assigned, so
                  the join, ``bench_js_groups.py``'s figure, is not timed and no read
                  starts before the clock). Its
                  fetcher's first read of a partition is a direct get, the next ones come
                  from the ordered consumer its cursor carries (``sequential.py``): the
                  bench prints how many reads each answered
* ``free``        eventlane's free ``Consumer`` assigned the 4 partitions (no group)
* raw nats-py, each on its own connection and event loop thread, every partition at once:

  - ``raw_ordered``  an ordered push consumer per partition, records taken by a callback
                     (no ``next_msg`` task per message)
  - ``raw_pull``     an ephemeral pull consumer per partition (``AckPolicy.NONE``), batches
                     of 1,000 by ``fetch``
  - ``raw_direct``   batched direct gets of 1,000 records per request, answers taken by a
                     callback (what ``JetStreamLog.read`` sends)

With ``--ceiling``, one more reader, ``ceiling``: what a member reading a partition through
an ordered push consumer would cost, without that design's checks (a prototype, not the
framework's read path): an ordered consumer per partition on a ``HeaderClient``, each message
decoded to a ``Record`` by ``read.record_of`` in the callback, batches of <= 2,000 taken by
the calling thread through the loop thread (the member's hop). It is never the baseline.

The baseline of a round is its fastest raw reader (``raw_best``); ``member / raw_best`` is
recorded round by round, and its median is the figure of record. CPU microseconds of this
process and of the three nats-server processes per record are printed beside, and the
member's records per CPU second (client and servers together) over the cheapest raw
reader's: the machine's load moves wall-clock rates, less so these.

    .venv/bin/python benchmarks/bench_js_consume.py [--quick] [--runs 5] [--json] [--ceiling]
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import orjson
from _harness import Target, bench_from_args, parser, quiet_logs, scratch_dir
from bench_jetstream import Raw
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from eventlane.consumer.free import Consumer
from eventlane.consumer.group import GroupConsumer
from eventlane.consumer.jetstream import JetStreamCoordination
from eventlane.log.jetstream import mapping
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.headers import HeaderClient
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.jetstream.read import record_of
from eventlane.log.record import Record, TopicPartition

TOPIC = "bench"
PARTITIONS = 4
VALUE = b"v" * 100
BATCH = 1000


SERVER_PIDS: list[int] = []
_TICK = os.sysconf("SC_CLK_TCK")


def servers_cpu() -> float:
    """CPU seconds the cluster's nats-server processes have used so far."""
    total = 0
    for pid in SERVER_PIDS:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


def timed(count: int, fn: Callable[[], None]) -> dict[str, float]:
    """``fn``'s records per second, and the CPU microseconds per record of this process and
    of the cluster's servers (clock ticks: coarse, but a round has thousands of them)."""
    s0, c0, t0 = servers_cpu(), time.process_time(), time.perf_counter()
    fn()
    t1, c1, s1 = time.perf_counter(), time.process_time(), servers_cpu()
    return {
        "rate": count / (t1 - t0),
        "cpu_us": (c1 - c0) * 1e6 / count,
        "server_cpu_us": (s1 - s0) * 1e6 / count,
    }


def readers(
    url: str, namespace: str, total: int, ceiling: bool = False
) -> tuple[dict[str, Callable[[], dict[str, float]]], Raw]:
    per = total // PARTITIONS
    raw = Raw(url)
    streams = [mapping.stream_name(namespace, TOPIC, p) for p in range(PARTITIONS)]
    subjects = [mapping.subject_prefix(namespace, TOPIC, p) + ".*" for p in range(PARTITIONS)]

    async def ordered_one(p: int) -> None:
        done = asyncio.get_running_loop().create_future()
        seen = 0

        async def cb(_msg: Any) -> None:
            nonlocal seen
            seen += 1
            if seen == per and not done.done():
                done.set_result(None)

        sub = await raw.js.subscribe(
            subjects[p],
            stream=streams[p],
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            cb=cb,
        )
        await done
        await sub.unsubscribe()

    async def pull_one(p: int) -> None:
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        sub = await raw.js.pull_subscribe(subjects[p], stream=streams[p], config=config)
        seen, refused = 0, 0
        while seen < per:
            try:
                seen += len(await sub.fetch(min(BATCH, per - seen), timeout=10))
            except nats.js.errors.ServiceUnavailableError:  # a new consumer not ready yet
                refused += 1
                if refused > 50:
                    raise
                await asyncio.sleep(0.02)
        await sub.unsubscribe()

    async def direct_one(p: int) -> None:
        seq = 1
        while seq <= per:
            done = asyncio.get_running_loop().create_future()
            last = [seq - 1]

            async def cb(
                msg: Any, done: asyncio.Future[None] = done, last: list[int] = last
            ) -> None:
                hdrs = msg.headers or {}
                if hdrs.get("Status"):
                    if not done.done():
                        done.set_result(None)
                    return
                last[0] = int(hdrs["Nats-Sequence"])

            inbox = raw.nc.new_inbox()
            sub = await raw.nc.subscribe(inbox, cb=cb)
            body = orjson.dumps({"seq": seq, "batch": min(BATCH, per - seq + 1)})
            await raw.nc.publish(f"$JS.API.DIRECT.GET.{streams[p]}", body, reply=inbox)
            await asyncio.wait_for(done, 10)
            await sub.unsubscribe()
            seq = last[0] + 1

    def all_at_once(one: Callable[[int], Coroutine[Any, Any, None]]) -> Callable[[], None]:
        async def go() -> None:
            await asyncio.gather(*(one(p) for p in range(PARTITIONS)))

        return lambda: raw.run(go())

    def ceiling_reader() -> dict[str, float]:
        buffers: list[list[Record]] = [[] for _ in range(PARTITIONS)]
        nc = HeaderClient()
        subs: list[Any] = []
        ready: list[asyncio.Event] = []
        servers = [f"nats://{h}" for h in url.removeprefix("nats://").split(",")]

        async def start() -> None:
            await nc.connect(servers=servers)
            js = nc.jetstream()
            ready.append(asyncio.Event())
            for p in range(PARTITIONS):

                async def cb(msg: Any, p: int = p) -> None:
                    seq = int(msg.reply.split(".", 7)[5])  # $JS.ACK.stream.consumer.n.SEQ...
                    hdrs = msg.headers or {}
                    buffers[p].append(record_of(TOPIC, p, seq - 1, msg.subject, msg.data, hdrs))
                    ready[0].set()

                subs.append(
                    await js.subscribe(
                        subjects[p],
                        stream=streams[p],
                        ordered_consumer=True,
                        deliver_policy=DeliverPolicy.ALL,
                        cb=cb,
                    )
                )

        async def take() -> list[Record]:
            while True:
                out: list[Record] = []
                for buffer in buffers:
                    n = 2000 - len(out)
                    out.extend(buffer[:n])
                    del buffer[:n]
                if out:
                    return out
                ready[0].clear()
                await asyncio.wait_for(ready[0].wait(), 10)

        async def stop() -> None:
            for sub in subs:
                await sub.unsubscribe()
            await nc.close()

        count = 0

        def drain() -> None:
            nonlocal count
            raw.run(start())
            while count < total:
                count += len(raw.run(take()))

        try:
            out = timed(total, drain)
        finally:
            raw.run(stop())
        assert count == total, (count, total)
        return out

    def member() -> dict[str, float]:
        log = JetStreamLog.from_url(url, namespace=namespace)
        coordination = JetStreamCoordination(log)
        consumer = GroupConsumer(
            log,
            coordination=coordination,
            group_id=f"g{uuid.uuid4().hex[:8]}",
            topics=[TOPIC],
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            max_poll_records=2000,
            on_assigned=lambda parts: consumer.pause(*parts),
        )
        try:
            deadline = time.monotonic() + 30
            while len(consumer.assignment()) < PARTITIONS:  # the join, not timed: the
                assert time.monotonic() < deadline  # partitions are paused as assigned,
                consumer.poll(0.2)  # so no read starts before the timed drain
            consumer.resume(*consumer.assignment())
            count = 0

            def drain() -> None:
                nonlocal count
                while count < total:
                    count += len(consumer.poll(1.0))

            out = timed(total, drain)
            seq = log._reader.sequential
            out |= {"served": seq.served, "direct": seq.direct, "pauses": seq.pauses}
        finally:
            consumer.close()
            coordination.close()
            log.close()
        assert count == total, (count, total)
        return out

    def free() -> dict[str, float]:
        with JetStreamLog.from_url(url, namespace=namespace) as log:
            consumer = Consumer(log, auto_offset_reset="earliest", max_poll_records=2000)
            consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
            count = 0

            def drain() -> None:
                nonlocal count
                while count < total:
                    count += len(consumer.poll(1.0))

            out = timed(total, drain)
            consumer.close()
        return out

    extra = {"ceiling": ceiling_reader} if ceiling else {}
    return {
        **extra,
        "raw_ordered": lambda: timed(total, all_at_once(ordered_one)),
        "raw_pull": lambda: timed(total, all_at_once(pull_one)),
        "raw_direct": lambda: timed(total, all_at_once(direct_one)),
        "member": member,
        "free": free,
    }, raw


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--records", type=int, default=40_000)
    p.add_argument("--ceiling", action="store_true", help="also the ordered-consumer prototype")
    args = p.parse_args()
    quiet_logs()
    bench = bench_from_args(__file__, args)
    total = 8_000 if args.quick else args.records
    total -= total % PARTITIONS
    with scratch_dir(args.tmp, "js-consume") as root:
        cluster = LocalCluster.create(root / "nats", nodes=3)
        cluster.start()
        SERVER_PIDS[:] = [node.pid for node in cluster.nodes]
        try:
            namespace = "bench" + uuid.uuid4().hex[:8]
            with JetStreamLog.from_url(cluster.url, namespace=namespace) as js:
                js.create_topic(TOPIC, PARTITIONS)
                for part in range(PARTITIONS):
                    for start in range(0, total // PARTITIONS, BATCH):
                        n = min(BATCH, total // PARTITIONS - start)
                        js.append(TOPIC, part, [(None, VALUE, (), None)] * n)
            measures, raw = readers(cluster.url, namespace, total, args.ceiling)
            try:
                bench.rounds(measures, warmup=True)
            finally:
                raw.close()
        finally:
            cluster.stop()
    raws = ("raw_ordered", "raw_pull", "raw_direct")
    bench.series["raw_best.rate"] = [
        max(values) for values in zip(*(bench.series[f"{r}.rate"] for r in raws), strict=True)
    ]
    mine = ("member", "free", "ceiling") if args.ceiling else ("member", "free")
    for name in (*raws, *mine):  # CPU of the client and the servers together
        bench.series[f"{name}.all_cpu_us"] = [
            a + b
            for a, b in zip(
                bench.series[f"{name}.cpu_us"], bench.series[f"{name}.server_cpu_us"], strict=True
            )
        ]
    bench.series["cpu_ratio"] = [  # records per CPU second, member / the fastest raw reader
        min(bench.series[f"{r}.all_cpu_us"][i] for r in raws) / member
        for i, member in enumerate(bench.series["member.all_cpu_us"])
    ]
    ratio = bench.paired("member.rate", "raw_best.rate")
    free_ratio = bench.paired("free.rate", "raw_best.rate")
    for name in (*raws, "raw_best", "member", "free"):
        base = None if name.startswith("raw") else "raw_best.rate"
        bench.add(f"{name}: records/s", "rec/s", f"{name}.rate", baseline=base)
    if args.ceiling:
        bench.series["ceiling_cpu_ratio"] = [
            min(bench.series[f"{r}.all_cpu_us"][i] for r in raws) / mine_cpu
            for i, mine_cpu in enumerate(bench.series["ceiling.all_cpu_us"])
        ]
        bench.add("ceiling: records/s", "rec/s", "ceiling.rate", baseline="raw_best.rate")
        bench.add(
            "ceiling / fastest raw, per round", "x", bench.paired("ceiling.rate", "raw_best.rate")
        )
        bench.add("ceiling / cheapest raw, per CPU second", "x", "ceiling_cpu_ratio")
    for name in (*raws, *mine):
        bench.add(f"{name}: CPU of this process", "us/rec", f"{name}.cpu_us")
        bench.add(f"{name}: CPU of the 3 servers", "us/rec", f"{name}.server_cpu_us")
    bench.add("member: reads answered by its ordered consumers", "reads", "member.served")
    bench.add("member: reads answered by direct gets", "reads", "member.direct")
    bench.add("member: consumers stopped at the buffer's bound", "times", "member.pauses")
    bench.add("member / fastest raw, per round", "x", ratio, target=Target(">=", 0.8))
    bench.add("free consumer / fastest raw, per round", "x", free_ratio)
    bench.add(
        "member / cheapest raw, records per CPU second of client + servers, per round",
        "x",
        "cpu_ratio",
        target=Target(">=", 0.8),
    )
    bench.notes.append(
        f"{total} records of {len(VALUE)} B in {PARTITIONS} partitions; cluster: 3 local"
        " nats-server nodes, replicas 3, sync always; the machine is shared (2 cores)"
    )
    bench.finish()


if __name__ == "__main__":
    main()

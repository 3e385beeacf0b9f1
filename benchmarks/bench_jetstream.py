"""JetStreamLog on a real local 3-node R=3 cluster vs raw nats-py doing the same, same run.

The bench starts its own cluster (``LocalCluster``: 127.0.0.1 ports, ``sync_interval:
always``), then per round, interleaved, measures each operation three ways: through
``JetStreamLog`` (the subject), through raw nats-py calls on their own connection and event
loop (the baseline: the least the adapter must do), and on the embedded ``LogStore`` (beside
them, so a user sees what replication costs). Operations:

* ``append.1``     single-record appends, one at a time (``js.publish`` and its ack, with the
                   headers ``JetStreamLog`` sends: a timestamp and a ``Nats-Msg-Id``)
* ``append.batch`` appends of 100 records (an atomic batch; raw: 100 ``publish_async``
                   in flight, then their acks)
* ``read``         reading a 5,000-record partition from offset 0 (raw: an ordered
                   consumer delivering the same records)
* ``cas.1`` / ``cas.8``  conditional appends (``Expect(key, last)``; raw: publish with
                   ``Nats-Expected-Last-Subject-Sequence`` and the same headers) by 1 and by
                   8 concurrent writers (threads sharing one ``JetStreamLog``; raw: 8
                   tasks on the client's loop, and, the same concurrency as the subject,
                   8 threads each running its publish on that loop and waiting), one key
                   each. Writer threads are started before the clock starts: the timed
                   span is the appends alone (tasks cost nothing like a thread start).
* ``cas.1.aio`` / ``cas.8.aio``  the same conditional appends through
                   ``AsyncJetStreamLog`` (the asyncio face: the same append plan awaited on
                   the caller's loop; 1 and 8 tasks on a loop of its own), and
                   ``cas.8.pool``: 8 tasks each awaiting ``JetStreamLog.append`` in a thread
                   pool (what an async runtime did before the asyncio face: loop -> pool
                   thread -> the log's bridge)
* ``load``         loading one 20-event aggregate: key head + the key's records (raw: a
                   last-by-subject get and a batched direct get filtered by subject); ms

The ``ratio`` rows are per-round subject/baseline ratios (throughput: >= 0.8 wanted;
latency: baseline/subject). The machine is shared; compare ratios, not absolute figures.

    .venv/bin/python benchmarks/bench_jetstream.py [--quick] [--runs 5] [--json]
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import nats
import orjson
from _harness import Target, bench_from_args, parser, percentile, quiet_logs, scratch_dir
from nats.js.api import DeliverPolicy

from eventlane.errors import PreconditionFailedError
from eventlane.log.embedded.store import LogStore
from eventlane.log.jetstream import mapping
from eventlane.log.jetstream.aio import AsyncJetStreamLog
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import Expect, JetStreamLog

VALUE = b"v" * 100


class Raw:
    """A raw nats-py client on its own loop thread; coroutines time themselves."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        servers = [f"nats://{h}" for h in url.removeprefix("nats://").split(",")]
        self.nc = self.run(nats.connect(servers=servers))
        self.js = self.nc.jetstream()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.run(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)


class Aio:
    """An ``AsyncJetStreamLog`` opened on its own loop thread (an asyncio application's
    loop); coroutines time themselves. ``pool``: the thread pool of the "before" path."""

    def __init__(self, url: str, namespace: str) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.log = AsyncJetStreamLog.from_url(url, namespace=namespace)
        self.run(self.log.open())
        self.pool = ThreadPoolExecutor(64, thread_name_prefix="bench-pool")

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.run(self.log.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.pool.shutdown()


def rate(count: int, t0: float) -> float:
    return count / (time.perf_counter() - t0)


def in_threads(writers: int, writer: Callable[[int], None]) -> float:
    """Seconds for ``writer(0..writers-1)`` in as many threads, timed from the moment all
    of them are running (creating and starting threads is the bench's cost, not the log's:
    the raw tasks pay nothing like it) until the last one ends."""
    start: list[float] = []
    go = threading.Barrier(writers + 1, action=lambda: start.append(time.perf_counter()))

    def body(w: int) -> None:
        go.wait()
        writer(w)

    threads = [threading.Thread(target=body, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    go.wait()
    for t in threads:
        t.join()
    return time.perf_counter() - start[0]


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    bench = bench_from_args(__file__, args)
    quiet_logs()
    n1, nbatch, nread, ncas = (100, 5, 1000, 160) if args.quick else (400, 20, 5000, 640)
    with scratch_dir(args.tmp, "jetstream") as tmp, LocalCluster.create(tmp / "nats") as cl:
        js = JetStreamLog.from_url(cl.url, namespace="bench")
        raw = Raw(cl.url)
        emb = LogStore(tmp / "embedded")
        measures = build(js, raw, emb, n1, nbatch, nread, ncas)
        aio = Aio(cl.url, "bench")
        measures.update(build_async(js, aio, ncas))
        try:
            bench.rounds(measures, warmup=True)
        finally:
            aio.close()
            raw.close()
            js.close()
            emb.close()
        for name in ("append.1", "append.batch", "read", "cas.1", "cas.8"):
            bench.series[f"{name}.ratio"] = [
                s / b
                for s, b in zip(
                    bench.series[f"{name}.js"], bench.series[f"{name}.raw"], strict=True
                )
            ]
            unit = "records/s" if name in ("append.batch", "read") else "ops/s"
            bench.add(f"{name} JetStreamLog", unit, f"{name}.js", baseline=f"{name}.raw")
            bench.add(f"{name} raw nats-py", unit, f"{name}.raw")
            bench.add(f"{name} embedded LogStore", unit, f"{name}.emb")
            bench.add(f"{name} ratio js/raw", "x", f"{name}.ratio", target=Target(">=", 0.8))
        bench.series["cas.8.ratio.thr"] = [
            s / b
            for s, b in zip(bench.series["cas.8.js"], bench.series["cas.8.rawthr"], strict=True)
        ]
        bench.add("cas.8 raw nats-py from 8 threads", "ops/s", "cas.8.rawthr")
        bench.add("cas.8 ratio js/raw-threads", "x", "cas.8.ratio.thr", target=Target(">=", 0.8))
        for name, subject, base in (
            ("cas.1 ratio aio/raw", "cas.1.aio", "cas.1.raw"),
            ("cas.8 ratio aio/raw", "cas.8.aio", "cas.8.raw"),
            ("cas.8 ratio aio/pool", "cas.8.aio", "cas.8.pool"),
        ):
            bench.series[name] = [
                s / b for s, b in zip(bench.series[subject], bench.series[base], strict=True)
            ]
        bench.add("cas.1 AsyncJetStreamLog, 1 task", "ops/s", "cas.1.aio", baseline="cas.1.raw")
        bench.add("cas.8 AsyncJetStreamLog, 8 tasks", "ops/s", "cas.8.aio", baseline="cas.8.raw")
        bench.add("cas.8 8 tasks via a thread pool (before)", "ops/s", "cas.8.pool")
        bench.add("cas.1 ratio aio/raw", "x", "cas.1 ratio aio/raw", target=Target(">=", 0.9))
        bench.add("cas.8 ratio aio/raw", "x", "cas.8 ratio aio/raw", target=Target(">=", 0.9))
        bench.add("cas.8 ratio aio/pool", "x", "cas.8 ratio aio/pool", target=Target(">=", 1.0))
        for q in ("p50", "p99"):
            bench.series[f"load.ratio.{q}"] = [
                b / s
                for s, b in zip(
                    bench.series[f"load.js.{q}"], bench.series[f"load.raw.{q}"], strict=True
                )
            ]
            bench.add(f"load {q} JetStreamLog", "ms", f"load.js.{q}", baseline=f"load.raw.{q}")
            bench.add(f"load {q} raw nats-py", "ms", f"load.raw.{q}")
            bench.add(f"load {q} embedded LogStore", "ms", f"load.emb.{q}")
            bench.add(f"load {q} ratio raw/js", "x", f"load.ratio.{q}", target=Target(">=", 0.8))
        bench.notes.append(
            "3-node R=3 cluster on 127.0.0.1 of one shared 2-core machine (sync_interval:"
            " always); embedded LogStore with flush_policy=always on the same disk"
        )
    bench.finish()


def build(
    js: JetStreamLog, raw: Raw, emb: LogStore, n1: int, nbatch: int, nread: int, ncas: int
) -> dict[str, Callable[[], Any]]:
    for log in (js, emb):
        for topic in ("a1", "ab", "rd", "cas", "agg"):
            log.create_topic(topic, 1)
    for _ in range(nread // 100):
        js.append("rd", 0, [(b"x", VALUE, (), None)] * 100)
        emb.append("rd", 0, [(b"x", VALUE, (), None)] * 100)
    agg_key = b"order-42"
    js.append("agg", 0, [(agg_key, VALUE, (), None)] * 20)
    emb.append("agg", 0, [(agg_key, VALUE, (), None)] * 20)
    js.append("agg", 0, [(b"other", VALUE, (), None)] * 200)
    emb.append("agg", 0, [(b"other", VALUE, (), None)] * 200)
    raw_topic = f"raw{uuid.uuid4().hex[:6]}"
    raw.run(
        raw.js.add_stream(
            name=raw_topic, subjects=[f"{raw_topic}.>"], num_replicas=3, allow_direct=True
        )
    )
    raw_agg_subject = f"{raw_topic}.agg.order42"

    async def raw_fill() -> None:
        for _ in range(20):
            await raw.js.publish(raw_agg_subject, VALUE)
        for _ in range(200):
            await raw.js.publish(f"{raw_topic}.agg.other", VALUE)

    raw.run(raw_fill())
    heads = {k: dict.fromkeys(range(8)) for k in ("js", "raw", "rawthr")}
    msg_ids = itertools.count()

    def raw_headers(**extra: str) -> dict[str, str]:
        """What ``JetStreamLog`` sends with a single-record append: the timestamp and a
        de-duplication id (plus, for a conditional append, the expected sequence)."""
        stamp = str(time.time_ns() // 1_000_000)
        return {mapping.H_TS: stamp, **extra, "Nats-Msg-Id": f"raw{next(msg_ids)}"}

    def js_append1() -> float:
        t0 = time.perf_counter()
        for _ in range(n1):
            js.append("a1", 0, [(b"k", VALUE, (), None)])
        return rate(n1, t0)

    def raw_append1() -> float:
        async def go() -> float:
            t0 = time.perf_counter()
            for _ in range(n1):
                await raw.js.publish(f"{raw_topic}.a1.k", VALUE, headers=raw_headers())
            return rate(n1, t0)

        return float(raw.run(go()))

    def emb_append1() -> float:
        t0 = time.perf_counter()
        for _ in range(n1):
            emb.append("a1", 0, [(b"k", VALUE, (), None)])
        return rate(n1, t0)

    def js_batch() -> float:
        t0 = time.perf_counter()
        for _ in range(nbatch):
            js.append("ab", 0, [(b"k", VALUE, (), None)] * 100)
        return rate(nbatch * 100, t0)

    def raw_batch() -> float:
        async def go() -> float:
            t0 = time.perf_counter()
            for _ in range(nbatch):
                futs = [await raw.js.publish_async(f"{raw_topic}.ab.k", VALUE) for _ in range(100)]
                await asyncio.gather(*futs)
            return rate(nbatch * 100, t0)

        return float(raw.run(go()))

    def emb_batch() -> float:
        t0 = time.perf_counter()
        for _ in range(nbatch):
            emb.append("ab", 0, [(b"k", VALUE, (), None)] * 100)
        return rate(nbatch * 100, t0)

    def read_all(log: JetStreamLog | LogStore) -> float:
        t0 = time.perf_counter()
        offset, seen = 0, 0
        while seen < nread:
            records, _ = log.read("rd", 0, offset)
            seen += len(records)
            offset = records[-1].offset + 1
        return rate(nread, t0)

    def raw_read() -> float:
        stream = mapping.stream_name("bench", "rd", 0)

        async def go() -> float:
            t0 = time.perf_counter()
            sub = await raw.js.subscribe(
                mapping.subject_prefix("bench", "rd", 0) + ".*",
                stream=stream,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
            )
            for _ in range(nread):
                await sub.next_msg(timeout=10)
            await sub.unsubscribe()
            return rate(nread, t0)

        return float(raw.run(go()))

    def js_cas(writers: int) -> Callable[[], float]:
        def run() -> float:
            per = ncas // writers

            def writer(w: int) -> None:
                key = b"agg-%d" % w
                for _ in range(per):
                    res = js.append(
                        "cas", 0, [(key, VALUE, (), None)], expect=Expect(key, heads["js"][w])
                    )
                    heads["js"][w] = res.base_offset

            return per * writers / in_threads(writers, writer)

        return run

    def raw_cas(writers: int) -> Callable[[], float]:
        def run() -> float:
            per = ncas // writers

            async def writer(w: int) -> None:
                subject = f"{raw_topic}.cas.agg{w}"
                for _ in range(per):
                    last = heads["raw"][w] or 0
                    expected = {"Nats-Expected-Last-Subject-Sequence": str(last)}
                    ack = await raw.js.publish(subject, VALUE, headers=raw_headers(**expected))
                    heads["raw"][w] = ack.seq

            async def go() -> float:
                t0 = time.perf_counter()
                await asyncio.gather(*(writer(w) for w in range(writers)))
                return rate(per * writers, t0)

            return float(raw.run(go()))

        return run

    def raw_cas_threads(writers: int) -> Callable[[], float]:
        """Raw nats-py called the way a threaded application calls it: each thread runs
        the same publish on the client's loop and waits (``run_coroutine_threadsafe``)."""

        def run() -> float:
            per = ncas // writers

            def writer(w: int) -> None:
                subject = f"{raw_topic}.cas.thr{w}"
                for _ in range(per):
                    expected = {"Nats-Expected-Last-Subject-Sequence": str(heads["rawthr"][w] or 0)}
                    publish = raw.js.publish(subject, VALUE, headers=raw_headers(**expected))
                    heads["rawthr"][w] = raw.run(publish).seq

            return per * writers / in_threads(writers, writer)

        return run

    def emb_cas(writers: int) -> Callable[[], float]:
        def run() -> float:
            per = ncas // writers

            def writer(w: int) -> None:
                key = b"agg-%d" % w
                for _ in range(per):
                    while True:
                        leo = emb.offsets("cas", 0).leo

                        def check(end: int, seen: int = leo) -> None:
                            if end != seen:
                                raise PreconditionFailedError("moved", topic="cas", partition=0)

                        try:
                            emb.append("cas", 0, [(key, VALUE, (), None)], precondition=check)
                            break
                        except PreconditionFailedError:
                            continue

            return per * writers / in_threads(writers, writer)

        return run

    def latencies(samples: list[float]) -> dict[str, float]:
        samples.sort()
        return {"p50": percentile(samples, 0.5) * 1e3, "p99": percentile(samples, 0.99) * 1e3}

    def js_load() -> dict[str, float]:
        samples = []
        for _ in range(50):
            t0 = time.perf_counter()
            records = js.read_key("agg", 0, agg_key)
            samples.append(time.perf_counter() - t0)
            assert len(records) == 20
        return latencies(samples)

    def raw_load() -> dict[str, float]:
        async def go() -> list[float]:
            samples = []
            for _ in range(50):
                t0 = time.perf_counter()
                last = await raw.js.get_msg(raw_topic, subject=raw_agg_subject)
                inbox = raw.nc.new_inbox()
                sub = await raw.nc.subscribe(inbox)
                body = {"seq": 1, "batch": 1000, "next_by_subj": raw_agg_subject}
                await raw.nc.publish(
                    f"$JS.API.DIRECT.GET.{raw_topic}", orjson.dumps(body), reply=inbox
                )
                got = 0
                while True:
                    msg = await sub.next_msg(timeout=5)
                    if (msg.headers or {}).get("Status"):
                        break
                    got += 1
                await sub.unsubscribe()
                samples.append(time.perf_counter() - t0)
                assert got == 20 and last.seq
            return samples

        return latencies(raw.run(go()))

    def emb_load() -> dict[str, float]:
        samples = []
        for _ in range(50):
            t0 = time.perf_counter()
            records = [r for r in emb.read("agg", 0, 0, max_bytes=1 << 22)[0] if r.key == agg_key]
            samples.append(time.perf_counter() - t0)
            assert len(records) == 20
        return latencies(samples)

    return {
        "append.1.raw": raw_append1,
        "append.1.js": js_append1,
        "append.1.emb": emb_append1,
        "append.batch.raw": raw_batch,
        "append.batch.js": js_batch,
        "append.batch.emb": emb_batch,
        "read.raw": raw_read,
        "read.js": lambda: read_all(js),
        "read.emb": lambda: read_all(emb),
        "cas.1.raw": raw_cas(1),
        "cas.1.js": js_cas(1),
        "cas.1.emb": emb_cas(1),
        "cas.8.raw": raw_cas(8),
        "cas.8.js": js_cas(8),
        "cas.8.rawthr": raw_cas_threads(8),
        "cas.8.emb": emb_cas(8),
        "load.raw": raw_load,
        "load.js": js_load,
        "load.emb": emb_load,
    }


def build_async(js: JetStreamLog, aio: Aio, ncas: int) -> dict[str, Callable[[], Any]]:
    """The asyncio rows: conditional appends by tasks through ``AsyncJetStreamLog``, and
    the same tasks awaiting the sync log in a thread pool (the path before it)."""
    heads: dict[str, dict[int, int | None]] = {k: dict.fromkeys(range(8)) for k in ("a", "p")}

    def aio_cas(writers: int) -> Callable[[], float]:
        def run() -> float:
            per = ncas // writers

            async def writer(w: int) -> None:
                key = b"aio-%d" % w
                for _ in range(per):
                    expect = Expect(key, heads["a"][w])
                    res = await aio.log.append("cas", 0, [(key, VALUE, (), None)], expect=expect)
                    heads["a"][w] = res.base_offset

            async def go() -> float:
                t0 = time.perf_counter()
                await asyncio.gather(*(writer(w) for w in range(writers)))
                return rate(per * writers, t0)

            return float(aio.run(go()))

        return run

    def pool_cas(writers: int) -> Callable[[], float]:
        def run() -> float:
            per = ncas // writers

            async def writer(w: int) -> None:
                key = b"pool-%d" % w
                loop = asyncio.get_running_loop()
                for _ in range(per):
                    expect = Expect(key, heads["p"][w])
                    append = functools.partial(
                        js.append, "cas", 0, [(key, VALUE, (), None)], expect=expect
                    )
                    res = await loop.run_in_executor(aio.pool, append)
                    heads["p"][w] = res.base_offset

            async def go() -> float:
                t0 = time.perf_counter()
                await asyncio.gather(*(writer(w) for w in range(writers)))
                return rate(per * writers, t0)

            return float(aio.run(go()))

        return run

    return {"cas.1.aio": aio_cas(1), "cas.8.aio": aio_cas(8), "cas.8.pool": pool_cas(8)}


if __name__ == "__main__":
    main()

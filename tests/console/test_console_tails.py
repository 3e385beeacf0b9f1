"""Live tails cost the console nothing while idle: 600 open server-sent-event tails (raw
asyncio sockets, as 600 browser tabs would hold them) and other pages still answer.

The figure (page latency idle vs with 600 tails, median of rounds, ratio) is
``benchmarks/bench_console.py``'s; this test asserts only with generous slack.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_helpers import Console, console_process

from eventlane.console.wake import Waker
from eventlane.log import LogStore, Producer, ProducerRecord

TAILS = 600
SLACK_S = 5.0
"""A page must answer within this with every tail open (idle: tens of ms)."""


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    data = tmp_path_factory.mktemp("console-tails") / "data"
    log = LogStore(data)
    log.create_topic("notes", 3)
    with Producer(log) as producer:
        producer.send_batch("notes", [ProducerRecord(b"k%d" % i, b"v") for i in range(30)])
    log.close()
    with console_process(data) as c:
        yield c


def page_seconds(console: Console, path: str = "/api/topics") -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(console.url + path, timeout=120) as resp:
        resp.read()
        assert resp.status == 200
    return time.perf_counter() - started


async def open_tail(port: int, gate: asyncio.Semaphore) -> asyncio.StreamWriter:
    """One SSE client: the request sent and the 200 answer's headers read; then idle."""
    async with gate:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /topics/notes/tail/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:300]
        return writer


async def with_tails(console: Console) -> tuple[float, list[float]]:
    gate = asyncio.Semaphore(50)  # at most 50 connections being opened at once
    opened = time.perf_counter()
    writers = await asyncio.gather(*(open_tail(console.port, gate) for _ in range(TAILS)))
    open_s = time.perf_counter() - opened
    try:
        await asyncio.sleep(2.0)  # every tail is past its first read, waiting
        rounds = [await asyncio.to_thread(page_seconds, console) for _ in range(3)]
    finally:
        for w in writers:
            w.close()
    return open_s, rounds


def test_600_idle_tails_leave_other_pages_answering(console: Console) -> None:
    idle = statistics.median(page_seconds(console) for _ in range(3))
    open_s, rounds = asyncio.run(asyncio.wait_for(with_tails(console), timeout=240))
    loaded = statistics.median(rounds)
    print(
        f"\n{TAILS} tails opened in {open_s:.1f} s; page idle {idle * 1000:.0f} ms,"
        f" with the tails {loaded * 1000:.0f} ms (rounds {[round(r, 3) for r in rounds]})"
    )
    assert loaded < SLACK_S, f"with {TAILS} idle tails a page took {loaded:.1f} s"
    assert page_seconds(console) < SLACK_S  # and after they closed


def test_a_tail_still_delivers_new_records(console: Console) -> None:
    """The async wait wakes on an append by another process's producer (here: this one)."""
    data = Path(console.log_path).parent / "data"
    url = console.url + "/topics/notes/tail/stream?partition=0&format=json"
    with urllib.request.urlopen(url, timeout=30) as stream:
        log = LogStore(data)
        try:
            with Producer(log) as producer:
                producer.send("notes", b"fresh-record", key=b"x", partition=0).result(timeout=10)
            started = time.monotonic()
            for line in stream:
                if b"fresh-record" in line:
                    break
                assert time.monotonic() - started < 10, "the tail never showed the record"
        finally:
            log.close()


def test_the_waker_never_loses_a_wake_up(tmp_path: Path) -> None:
    """A seeded generator of interleavings against the model "every waiter parked before an
    append returns after it": waiters are parked at random moments, appends come from
    another thread through the real log's wake-up word (a futex shared by processes), and
    some land between a waiter's first look at the word and its registration (the waker's
    own start included: it starts lazily, on the first wait)."""
    log = LogStore(tmp_path / "data")
    log.create_topic("w", 1)
    waker = Waker(log.wait_seq, log.wait)
    rng = random.Random(28)

    async def run() -> int:
        checked = 0
        try:
            for _step in range(150):
                seen = log.wait_seq()
                waiters = [asyncio.create_task(waker.wait(seen)) for _ in range(rng.randint(1, 8))]
                await asyncio.sleep(rng.choice([0, 0, 0.0005, 0.002]))  # some reach await
                delay = rng.choice([0, 0, 0.001])

                def append(delay: float = delay) -> None:
                    time.sleep(delay)
                    log.append("w", 0, [(b"k", b"v", [], None)])

                appender = threading.Thread(target=append)
                appender.start()
                done, pending = await asyncio.wait(waiters, timeout=5.0)
                appender.join()
                assert not pending, f"{len(pending)} waiters never woke"
                checked += len(done)
        finally:
            waker.stop()
        return checked

    try:
        assert asyncio.run(asyncio.wait_for(run(), timeout=120)) >= 150
    finally:
        log.close()

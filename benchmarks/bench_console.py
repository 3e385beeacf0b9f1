"""The web console: page latency on a big log, and the CPU of an idle live tail.

Figures (median of ``--runs`` >= 5 rounds; a real ``eventlane console`` process, requests
over loopback HTTP from this process, page cache warm):

* **topics page**: ``GET /topics`` (HTML) and ``GET /api/topics`` on a log of ``--records``
  records (default 10M, ``--quick`` 200k) in ``--partitions`` partitions. Target < 100 ms.
* **100-record page**: ``GET /topics/T/records?partition=0&start=offset&value=MID&limit=100``
  (HTML, every record rendered) and its ``/api`` twin, starting in the middle of a
  partition. Target < 100 ms.
* Baselines, "the CLI's consume of the same records": ``eventlane consume T --partition 0
  --offset MID --max 100`` as a process (what a user would otherwise run: includes the
  interpreter's start), and the same work in-process (a free consumer seeks and polls the
  100 records and renders the same JSON lines), so the ratio shows the console's own cost.
* **idle live tail**: CPU of the console process (user + system, % of one core) over
  ``--idle-seconds`` with one SSE client connected to a tail of the topic and nothing
  appended (the console's lag sampler runs meanwhile, as it always does). Target < 2 %.
  Baseline: the same process with no client connected.
* **pages under ``--tails`` idle live tails** (default 600): each round measures the topics
  page and the 100-record page (median of 5 requests each) with no tail open, then opens
  the tails (raw asyncio sockets on one loop in a thread of this process, each past its
  ``200`` headers, nothing appended), waits 2 s, measures the same pages again, counts the
  console's threads, and closes the tails. Figure: the paired ratio (with tails / idle,
  round by round), target < 2x. ``--only-tails`` measures just this.

The big topic is built once and cached in ``--tmp`` under
``eventlane-bench-console-<records>x<partitions>`` (``--rebuild`` discards it): values are
~200-byte JSON documents with an ``event-type`` header, appended with ``LogStore.append``.

    .venv/bin/python benchmarks/bench_console.py [--quick] [--records N] [--runs 7] [--json]
                                                  [--tails 600] [--only-tails]
"""

from __future__ import annotations

import asyncio
import http.client
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import psutil
from _harness import Target, bench_from_args, parser, quiet_logs

from eventlane.cli.records import record_json
from eventlane.consumer import Consumer
from eventlane.log import LogStore, TopicPartition

TOPIC = "bench-console"
BULK = 20_000


def build(path: Path, records: int, partitions: int) -> None:
    if (path / "complete").exists():
        return
    shutil.rmtree(path, ignore_errors=True)
    log = LogStore(path)
    log.create_topic(TOPIC, partitions, {"retention_ms": -1})
    per = records // partitions
    for p in range(partitions):
        done = 0
        while done < per:
            n = min(BULK, per - done)
            batch = [
                (
                    f"order-{(done + i) % 50_000:06d}".encode(),
                    orjson.dumps(
                        {
                            "type": "OrderPlaced",
                            "aggregate_id": f"order-{(done + i) % 50_000:06d}",
                            "seq": done + i,
                            "data": {"customer": f"c-{i % 977}", "amount_cents": i % 10_000},
                            "pad": "x" * 60,
                        }
                    ),
                    [("event-type", b"OrderPlaced")],
                    None,
                )
                for i in range(n)
            ]
            log.append(TOPIC, p, batch)
            done += n
        print(f"  built partition {p}: {per:,} records", file=sys.stderr, flush=True)
    log.close()
    (path / "complete").write_text("ok\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> float:
    """Seconds for one GET on a fresh connection (body read fully; status checked)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    elapsed = time.perf_counter() - t0
    assert resp.status == 200, (path, resp.status, body[:300])
    return elapsed


def consume_cli(data: Path, offset: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from eventlane.cli import main; main()",
            "consume",
            TOPIC,
            "--data",
            str(data),
            "--partition",
            "0",
            "--offset",
            str(offset),
            "--max",
            "100",
        ],
        capture_output=True,
        check=True,
    )
    elapsed = time.perf_counter() - t0
    assert out.stdout.count(b"\n") == 100, out.stderr[-500:]
    return elapsed


def consume_inprocess(log: LogStore, offset: int) -> float:
    t0 = time.perf_counter()
    consumer = Consumer(log)
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek(tp, offset)
    got = 0
    lines = []
    while got < 100:
        records = consumer.poll(timeout=1.0, max_records=100 - got)
        lines += [record_json(r) for r in records]
        got += len(records)
    consumer.close()
    elapsed = time.perf_counter() - t0
    assert len(lines) == 100
    return elapsed


def cpu_percent(proc: psutil.Process, seconds: float) -> float:
    before = proc.cpu_times()
    time.sleep(seconds)
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / seconds


class TailClient:
    """One SSE client reading a live tail in a thread (what an open browser tab does)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        self.conn.request("GET", f"/topics/{TOPIC}/tail/stream")
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while self.resp.read1(4096):
                pass
        except Exception:  # the socket closed under the reader: the client is done
            return

    def close(self) -> None:
        self.conn.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
        self.conn.close()


class IdleTails:
    """``count`` SSE clients holding live tails open and idle: raw sockets on one asyncio
    loop in a thread (what ``count`` browser tabs on the tail page hold)."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.writers: list[asyncio.StreamWriter] = asyncio.run_coroutine_threadsafe(
            self._open(count), self.loop
        ).result(timeout=300)

    async def _one(self, gate: asyncio.Semaphore) -> asyncio.StreamWriter:
        async with gate:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(
                f"GET /topics/{TOPIC}/tail/stream HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                "Accept: text/event-stream\r\n\r\n".encode()
            )
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            return writer

    async def _open(self, count: int) -> list[asyncio.StreamWriter]:
        gate = asyncio.Semaphore(50)
        return list(await asyncio.gather(*(self._one(gate) for _ in range(count))))

    async def _close(self) -> None:
        for w in self.writers:
            w.close()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


def pages_with_tails(
    port: int, proc: psutil.Process, pages: dict[str, str], tails: int
) -> dict[str, float]:
    """One round: each page's median of 5 GETs (ms) idle, then with ``tails`` open."""
    out: dict[str, float] = {}
    for name, path in pages.items():
        out[f"{name}_idle"] = statistics.median(get(port, path) * 1000 for _ in range(5))
    out["threads_idle"] = proc.num_threads()
    opened = time.perf_counter()
    held = IdleTails(port, tails)
    out["open_s"] = time.perf_counter() - opened
    try:
        time.sleep(2.0)
        out["threads_tails"] = proc.num_threads()
        for name, path in pages.items():
            out[f"{name}_tails"] = statistics.median(get(port, path) * 1000 for _ in range(5))
    finally:
        held.close()
    time.sleep(1.0)  # the console notices the closed tails
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=None, help="records in the topic (10M)")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--idle-seconds", type=float, default=None, help="idle CPU window (20)")
    p.add_argument("--rebuild", action="store_true", help="discard the cached topic")
    p.add_argument("--tails", type=int, default=600, help="idle live tails held open (600)")
    p.add_argument(
        "--only-tails", action="store_true", help="measure only the pages under idle tails"
    )
    args = p.parse_args()
    quiet_logs()
    bench = bench_from_args(__file__, args)
    records = args.records or (200_000 if args.quick else 10_000_000)
    idle = args.idle_seconds or (5.0 if args.quick else 20.0)
    data = Path(args.tmp) / f"eventlane-bench-console-{records}x{args.partitions}"
    if args.rebuild:
        shutil.rmtree(data, ignore_errors=True)
    t0 = time.perf_counter()
    build(data, records, args.partitions)
    print(f"  topic ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    log = LogStore(data)
    marks = log.offsets(TOPIC, 0)
    mid = (marks.lwm + marks.hwm) // 2
    port = free_port()
    console = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from eventlane.cli import main; main()",
            "console",
            "--data",
            str(data),
            "--port",
            str(port),
        ],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                get(port, "/api/overview")
                break
            except OSError:
                assert console.poll() is None, console.stderr.read() if console.stderr else ""
                assert time.monotonic() < deadline
                time.sleep(0.2)
        page = f"/topics/{TOPIC}/records?partition=0&start=offset&value={mid}&limit=100"
        proc = psutil.Process(console.pid)
        pages = {"topics": "/topics", "page": page}
        bench.rounds(
            {"tails": lambda: pages_with_tails(port, proc, pages, args.tails)}, warmup=True
        )
        if not args.only_tails:
            bench.rounds(
                {
                    "topics_html": lambda: get(port, "/topics") * 1000,
                    "topics_api": lambda: get(port, "/api/topics") * 1000,
                    "page_html": lambda: get(port, page) * 1000,
                    "page_api": lambda: get(port, "/api" + page) * 1000,
                    "consume_cli": lambda: consume_cli(data, mid) * 1000,
                    "consume_inproc": lambda: consume_inprocess(log, mid) * 1000,
                },
                warmup=True,
            )
            bench.record("idle_no_client", cpu_percent(proc, idle))
            client = TailClient(port)
            time.sleep(1.0)
            bench.record("idle_tail", cpu_percent(proc, idle))
            client.close()
    finally:
        console.send_signal(signal.SIGTERM)
        try:
            console.wait(timeout=30)
        except subprocess.TimeoutExpired:
            console.kill()
            console.wait()
        log.close()
    tails = f"{args.tails} idle tails"
    for name, label in (("topics", "topics page (HTML)"), ("page", "100-record page (HTML)")):
        bench.add(
            f"{label}, {tails} open",
            "ms",
            f"tails.{name}_tails",
            baseline=f"tails.{name}_idle",
        )
        bench.add(
            f"{label}: with {tails} / idle, paired by round",
            "x",
            bench.paired(f"tails.{name}_tails", f"tails.{name}_idle"),
            target=Target("<", 2.0),
        )
    bench.add(
        f"console threads, {tails} open",
        "threads",
        "tails.threads_tails",
        baseline="tails.threads_idle",
    )
    bench.add(f"opening {tails}", "s", "tails.open_s")
    bench.notes.append(
        f"{records:,} records in {args.partitions} partitions; pages start at offset {mid:,} of"
        f" partition 0; each tails figure is per round the median of 5 requests"
    )
    if args.only_tails:
        bench.finish()
        return
    under = Target("<", 100.0)
    bench.add("topics page (HTML)", "ms", "topics_html", baseline="consume_cli", target=under)
    bench.add("GET /api/topics", "ms", "topics_api", baseline="consume_cli", target=under)
    bench.add("100-record page (HTML)", "ms", "page_html", baseline="consume_cli", target=under)
    bench.add("100-record page (API)", "ms", "page_api", baseline="consume_cli", target=under)
    bench.add(
        "100-record page (HTML) vs in-process consume",
        "ms",
        "page_html",
        baseline="consume_inproc",
    )
    bench.add("eventlane consume --max 100 (process)", "ms", "consume_cli")
    bench.add("consume 100 records in-process", "ms", "consume_inproc")
    bench.add(
        "idle live tail, console CPU",
        "% core",
        "idle_tail",
        baseline="idle_no_client",
        target=Target("<", 2.0),
    )
    bench.notes.append(f"idle window {idle:.0f} s (one sample)")
    bench.finish()


if __name__ == "__main__":
    main()

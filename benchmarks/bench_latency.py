"""Append → visible latency across processes (figure 4) and idle tail CPU (figure 5).

Figure 4. One writer process, paced at ``--rate`` records/s (default 1,000), sends every
record two ways, alternating which goes first: it appends it to the log (one record per
``LogStore.append``) and it sends it by the raw baseline path. Each copy carries
``time.monotonic_ns()`` (CLOCK_MONOTONIC: one clock for every process of a Linux machine),
stamped just before that copy is sent, in the first 8 bytes of a 100-byte value. Two reader
processes, started first: a free consumer at the end of the partition notes
``time.monotonic_ns()`` as each record comes out of ``poll``; a pipe reader does the same as
each stamp arrives. Sending both copies from one loop puts the subject and its baseline
under the same disk and CPU conditions record by record (fsync latency on this machine
drifts by 10x within minutes, too fast for round-by-round interleaving). Per run:
``--seconds`` of records, the first 100 dropped as warm-up; p50/p99/p99.9/max in ms. Pairs:

* ``os``        the log with ``flush_policy="os"`` (Kafka's default: acked once in the page
                cache) vs the stamp sent over a pipe (``multiprocessing.Pipe``): the floor
                of a cross-process wake-up
* ``always``    the log with ``flush_policy="always"`` (the default: visible only once
                fsynced) vs the 100-byte record written to a file + ``fdatasync``, then the
                stamp sent over the pipe: the floor of a *durable* append seen by another
                process

Figure 5. A consumer process assigned to an idle partition calls ``poll(timeout=0.1)`` for
``--idle-seconds`` (default 10); its CPU time (user + system, all threads) as % of one core.
Baseline, run at the same time: a process waking on the same 0.1 s timeout in
``select()`` on a pipe nobody writes to.

    .venv/bin/python benchmarks/bench_latency.py [--quick] [--runs 5] [--json]
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import select
import time
from array import array
from collections.abc import Mapping, Sequence
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from _harness import Bench, Target, bench_from_args, parser, percentile, quiet_logs, scratch_dir

from eventlane.consumer.free import Consumer
from eventlane.log.embedded.store import LogStore
from eventlane.log.record import TopicPartition

VALUE_SIZE = 100
WARMUP = 100
IDLE_POLL_S = 0.1
CTX = multiprocessing.get_context("spawn")


# ------------------------------------------------------------------------------ children
def _stamp_value() -> bytes:
    return time.monotonic_ns().to_bytes(8, "big") + bytes(VALUE_SIZE - 8)


def _pace(index: int, start: float, rate: float) -> None:
    delay = start + index / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def paired_writer(
    data: str,
    topic: str,
    conn: multiprocessing.connection.Connection,
    durable_path: str | None,
    count: int,
    rate: float,
) -> None:
    """Send each record to the log and by the raw path (see the module docstring)."""
    quiet_logs()
    store = LogStore(data)
    store.partition(topic, 0)  # open (and recover) before the clock starts
    fd = -1
    if durable_path is not None:
        fd = os.open(durable_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def to_log() -> None:
        store.append(topic, 0, [(b"key-000001", _stamp_value(), (), None)])

    def raw() -> None:
        value = _stamp_value()
        if fd >= 0:
            os.write(fd, value)
            os.fdatasync(fd)
        conn.send_bytes(value[:8])

    start = time.monotonic()
    for i in range(count):
        _pace(i, start, rate)
        first, second = (to_log, raw) if i % 2 == 0 else (raw, to_log)
        first()
        second()
    if fd >= 0:
        os.close(fd)
    conn.close()
    store.close()


def log_reader(data: str, topic: str, count: int, ready: Event, out: str) -> None:
    quiet_logs()
    store = LogStore(data)
    consumer = Consumer(store, auto_offset_reset="latest")
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_end()
    consumer.poll(0.0)
    latencies = array("q")
    deadline = time.monotonic() + 60 + count / 100
    ready.set()
    while len(latencies) < count and time.monotonic() < deadline:
        records = consumer.poll(timeout=0.5)
        now = time.monotonic_ns()
        for record in records:
            assert record.value is not None
            latencies.append(now - int.from_bytes(record.value[:8], "big"))
    Path(out).write_bytes(latencies.tobytes())
    store.close()


def pipe_reader(
    conn: multiprocessing.connection.Connection, count: int, ready: Event, out: str
) -> None:
    latencies = array("q")
    ready.set()
    while len(latencies) < count:
        try:
            stamp = conn.recv_bytes()
        except EOFError:
            break
        latencies.append(time.monotonic_ns() - int.from_bytes(stamp, "big"))
    Path(out).write_bytes(latencies.tobytes())


def idle_consumer(data: str, topic: str, seconds: float, ready: Event, out: str) -> None:
    quiet_logs()
    store = LogStore(data)
    consumer = Consumer(store, auto_offset_reset="latest")
    consumer.assign([TopicPartition(topic, 0)])
    consumer.poll(0.0)
    ready.set()
    cpu0, wall0 = time.process_time(), time.monotonic()
    got = 0
    while time.monotonic() - wall0 < seconds:
        got += len(consumer.poll(timeout=IDLE_POLL_S))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    Path(out).write_text(f"{100.0 * cpu / wall} {got}")
    store.close()


def idle_select(seconds: float, ready: Event, out: str) -> None:
    r, w = os.pipe()
    ready.set()
    cpu0, wall0 = time.process_time(), time.monotonic()
    while time.monotonic() - wall0 < seconds:
        select.select([r], [], [], IDLE_POLL_S)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    Path(out).write_text(f"{100.0 * cpu / wall} 0")
    os.close(r)
    os.close(w)


# ------------------------------------------------------------------------------ parent
def _start(target: Any, *args: Any) -> multiprocessing.process.BaseProcess:
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _join(*procs: multiprocessing.process.BaseProcess, timeout: float) -> None:
    for proc in procs:
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise RuntimeError(f"{proc.name} did not finish in {timeout} s")
        if proc.exitcode != 0:
            raise RuntimeError(f"{proc.name} failed with exit code {proc.exitcode}")


def _summary(raw: bytes) -> Mapping[str, float]:
    values = array("q")
    values.frombytes(raw)
    ms = sorted(v / 1e6 for v in values[WARMUP:])
    if not ms:
        raise RuntimeError("no latency samples")
    return {
        "p50": percentile(ms, 0.5),
        "p99": percentile(ms, 0.99),
        "p999": percentile(ms, 0.999),
        "max": ms[-1],
        "samples": len(ms),
    }


class Latency:
    def __init__(self, root: Path, count: int, rate: float) -> None:
        self.root, self.count, self.rate = root, count, rate
        self.data = root / "data"
        self.store = LogStore(self.data)
        self.n = 0
        self.timeout = 120 + 4 * count / rate

    def paired(self, policy: str) -> Mapping[str, float]:
        """One run: the log with ``policy`` and its raw baseline, record by record."""
        self.n += 1
        topic = f"lat-{self.n}"
        self.store.create_topic(topic, 1, {"flush_policy": policy})
        log_out, pipe_out = self.root / f"{topic}.log.lat", self.root / f"{topic}.pipe.lat"
        durable_path = str(self.root / f"{topic}.raw") if policy == "always" else None
        recv, send = CTX.Pipe(duplex=False)
        log_ready, pipe_ready = CTX.Event(), CTX.Event()
        log_reader_p = _start(
            log_reader, str(self.data), topic, self.count, log_ready, str(log_out)
        )
        pipe_reader_p = _start(pipe_reader, recv, self.count, pipe_ready, str(pipe_out))
        if not (log_ready.wait(120) and pipe_ready.wait(120)):
            raise RuntimeError("readers did not start")
        writer = _start(
            paired_writer, str(self.data), topic, send, durable_path, self.count, self.rate
        )
        send.close()
        recv.close()
        _join(writer, log_reader_p, pipe_reader_p, timeout=self.timeout)
        result = {f"log_{k}": v for k, v in _summary(log_out.read_bytes()).items()}
        result.update({f"raw_{k}": v for k, v in _summary(pipe_out.read_bytes()).items()})
        self.store.delete_topic(topic)
        if durable_path is not None:
            Path(durable_path).unlink()
        return result


def figure4(bench: Bench, root: Path, seconds: float, rate: float) -> None:
    lat = Latency(root, int(seconds * rate) + WARMUP, rate)
    bench.rounds({"os": lambda: lat.paired("os"), "always": lambda: lat.paired("always")})
    lat.store.close()
    p50, p99 = Target("<", 2.0), Target("<", 10.0)
    for pair, label, base in (
        ("os", "flush_policy=os", "pipe"),
        ("always", "flush_policy=always", "write+fdatasync+pipe"),
    ):
        for q, name, target in (
            ("p50", "p50", p50),
            ("p99", "p99", p99),
            ("p999", "p99.9", None),
            ("max", "max", None),
        ):
            bench.add(f"4. baseline: {base} {name}", "ms", f"{pair}.raw_{q}")
            bench.add(
                f"4. append->visible {name}, {label}",
                "ms",
                f"{pair}.log_{q}",
                baseline=f"{pair}.raw_{q}",
                target=target,
            )


def figure5(bench: Bench, root: Path, seconds: float) -> None:
    data = root / "idle-data"
    store = LogStore(data)
    store.create_topic("idle", 1)
    store.append("idle", 0, [(b"k", b"v", (), None)])
    store.close()
    n = 0

    def both() -> Mapping[str, float]:
        nonlocal n
        n += 1
        out_c, out_s = root / f"idle-{n}.consumer", root / f"idle-{n}.select"
        ready_c, ready_s = CTX.Event(), CTX.Event()
        consumer = _start(idle_consumer, str(data), "idle", seconds, ready_c, str(out_c))
        selector = _start(idle_select, seconds, ready_s, str(out_s))
        _join(consumer, selector, timeout=120 + seconds)
        cpu_c, got = out_c.read_text().split()
        if int(got):
            raise RuntimeError("the idle consumer received records")
        return {"consumer": float(cpu_c), "select": float(out_s.read_text().split()[0])}

    bench.rounds({"idle": both})
    bench.add("5. baseline: select() on a silent pipe, 0.1 s timeout", "% core", "idle.select")
    bench.add(
        f"5. idle consumer poll(timeout={IDLE_POLL_S}) CPU",
        "% core",
        "idle.consumer",
        baseline="idle.select",
        target=Target("<", 2.0),
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=1000.0, help="figure 4 records/s")
    p.add_argument("--seconds", type=float, default=None, help="figure 4 seconds per run")
    p.add_argument("--idle-seconds", type=float, default=None, help="figure 5 seconds per run")
    p.add_argument("--only", choices=("4", "5"), default=None, help="one figure only")
    args = p.parse_args(argv)
    seconds = args.seconds or (1.0 if args.quick else 4.0)
    idle = args.idle_seconds or (2.0 if args.quick else 10.0)
    quiet_logs()
    bench = bench_from_args(__file__, args)
    bench.notes.append(
        f"figure 4: {args.rate:.0f} rec/s for {seconds:.0f} s per run (first"
        f" {WARMUP} dropped); figure 5: {idle:.0f} s per run"
    )
    with scratch_dir(args.tmp, "latency") as root:
        if args.only in (None, "4"):
            figure4(bench, root, seconds, args.rate)
        if args.only in (None, "5"):
            figure5(bench, root, idle)
    bench.finish()


if __name__ == "__main__":
    main()

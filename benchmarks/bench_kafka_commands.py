"""Commands on the Kafka event store beside JetStream and the embedded log (issue 35;
report-only): commands/s and p50/p99 latency of ``Runtime.execute``, 1 and 8 concurrent
callers (threads of one runtime, each on its own aggregate), the engines interleaved round
by round, the median of ``--rounds`` rounds (>= 5).

``kafka-1`` is KafkaLog with ``appends_in_flight=1`` (one append in flight per log, the
design before appends of concurrent callers were pipelined): the same-run baseline of
``kafka``.

The bench starts a 3-broker Kafka cluster and a 3-server JetStream cluster on 127.0.0.1
(``--kafka DIR`` reuses one started by ``eventlane kafka up --dir DIR``; ``--no-jetstream``
leaves JetStream out). Everything shares this machine: compare engines in one run, and
print ``uptime``'s load beside the figures.

    .venv/bin/python benchmarks/bench_kafka_commands.py [--rounds 5] [--commands 40]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "store"))
from store_domain import Counter, make_app

from eventlane.app import Runtime
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.observability import configure_logging


def run_round(app: Runtime, callers: int, commands: int, tag: str) -> tuple[float, list[float]]:
    """``callers`` threads x ``commands`` executes; (commands/s, latencies in seconds)."""
    latencies: list[float] = []
    lock = threading.Lock()

    def caller(i: int) -> None:
        mine: list[float] = []
        agg = f"{tag}-{i}"
        for _ in range(commands):
            t0 = time.perf_counter()
            app.execute(Counter, agg, lambda c: c.increment(1), create=True)
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return callers * commands / (time.perf_counter() - started), sorted(latencies)


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--commands", type=int, default=40, help="per caller per round")
    p.add_argument("--kafka", help="a cluster directory of `eventlane kafka up`")
    p.add_argument("--no-jetstream", action="store_true")
    args = p.parse_args()
    configure_logging(level="error")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the clusters stop in `finally`
    tmp = Path(tempfile.mkdtemp(prefix="bench-kafka-commands-"))
    stops: list[Callable[[], None]] = []
    apps: dict[str, Runtime] = {}
    try:
        if args.kafka:
            kc = LocalKafkaCluster.load(args.kafka)
        else:
            kc = LocalKafkaCluster.create(tmp / "kafka", 3)
            kc.start()
            stops.append(kc.stop)
        apps["kafka"] = make_app(KafkaLog(kc.bootstrap, namespace=f"b{uuid.uuid4().hex[:8]}"))
        # the former design, as the same-run baseline: one append in flight per KafkaLog
        apps["kafka-1"] = make_app(
            KafkaLog(kc.bootstrap, namespace=f"b{uuid.uuid4().hex[:8]}", appends_in_flight=1)
        )
        if not args.no_jetstream:
            jc = LocalCluster.create(tmp / "nats")
            jc.start()
            stops.append(jc.stop)
            apps["jetstream"] = make_app(JetStreamLog.from_url(jc.url, namespace="bench"))
        apps["embedded"] = make_app(tmp / "embedded")
        results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for r in range(args.rounds + 1):  # round 0 warms up
            for callers in (1, 8):
                for name, app in apps.items():
                    rate, lat = run_round(app, callers, args.commands, f"r{r}c{callers}")
                    if r:
                        results.setdefault((name, callers), []).append(
                            (rate, pct(lat, 0.5), pct(lat, 0.99))
                        )
        load = os.getloadavg()
        print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; median of {args.rounds}")
        print(f"{'engine':<10} {'callers':>7} {'cmds/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
        for (name, callers), rows in sorted(results.items(), key=lambda x: (x[0][1], x[0][0])):
            rate = statistics.median(x[0] for x in rows)
            p50 = statistics.median(x[1] for x in rows) * 1000
            p99 = statistics.median(x[2] for x in rows) * 1000
            print(f"{name:<10} {callers:>7} {rate:>8.1f} {p50:>8.1f} {p99:>8.1f}")
    finally:
        for app in apps.values():
            app.close()
        for stop in reversed(stops):
            stop()


if __name__ == "__main__":
    main()

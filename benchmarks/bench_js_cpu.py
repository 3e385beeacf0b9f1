"""Client CPU per conditional append on JetStream: the adapter's own cost, by one process.

Starts a fresh local 3-node cluster, then appends ``--appends`` single records
conditionally (``Expect(key, last)``) from 1 and from 8 threads (one key per thread), once to
warm up and once measured, and prints one line: the process's CPU time per append
(``time.process_time``: the nats-server processes are not counted) and the wall rate. CPU
per operation is what a shared machine's neighbours move least; compare two trees by running
this script in each, alternating which goes first (docs/performance.md).

    PYTHONPATH=<tree> .venv/bin/python benchmarks/bench_js_cpu.py [--appends 400]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog
from eventlane.log.types import Expect


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--appends", type=int, default=400)
    n = p.parse_args().appends
    with tempfile.TemporaryDirectory() as d, LocalCluster.create(d) as cl:
        js = JetStreamLog.from_url(cl.url, namespace="cpu")
        js.create_topic("cas", 1)
        out = []
        for writers in (1, 8):
            heads: list[int | None] = [None] * writers
            per = n // writers

            def write(
                i: int, writers: int = writers, per: int = per, heads: list[int | None] = heads
            ) -> None:
                key = b"w%d-k%d" % (writers, i)  # (a key of its own per phase and thread)
                for _ in range(per):
                    record = [(key, b"v" * 100, (), None)]
                    last = heads[i]
                    heads[i] = js.append("cas", 0, record, expect=Expect(key, last)).base_offset

            for _ in range(2):  # warm up, then measured
                c0, t0 = time.process_time(), time.perf_counter()
                threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            count = per * writers
            out.append(f"w{writers} cpu_us {cpu / count * 1e6:.0f} wall_ops {count / wall:.0f}")
        js.close()
        print(" ".join(out))


if __name__ == "__main__":
    main()

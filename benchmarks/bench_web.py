"""HTTP commands per second with 64 concurrent clients: async endpoints vs the same
endpoints sync in FastAPI's thread pool (issue 30).

    python benchmarks/bench_web.py --requests 1000 --runs 5 --clients 64

One uvicorn server process (started by this script, loopback) serves both kinds of
endpoint on one embedded log: ``POST /async/{id}`` (``async def``: ``await
runtime.execute(...)`` on ``app.open_async``) and ``POST /sync/{id}`` (``def``, run by
FastAPI in its thread pool: the sync ``Runtime.execute``). Each request places a new order
(a conditional, durable append). Rounds alternate (sync, async, sync, ...) so a noisy
minute hurts both; each round sends ``--requests`` requests from ``--clients`` concurrent
httpx clients. Prints per kind the median commands/s and p99 latency of the rounds, and the
ratios async/sync (throughput: above 1 is faster; p99: below 1 is better).

``--jetstream``: the same on a real local 3-node JetStream cluster (started by this script on
loopback, stopped by PID) instead of the embedded log: the async endpoints await the log's
asyncio face on uvicorn's loop, the sync ones cross the sync log's bridge from the pool.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def serve(port: int, data: str) -> None:
    """The server process: both kinds of endpoint on one runtime."""
    from contextlib import asynccontextmanager  # noqa: PLC0415

    import uvicorn  # noqa: PLC0415
    from fastapi import FastAPI  # noqa: PLC0415

    from example_apps.invoicing.app import app  # noqa: PLC0415
    from example_apps.invoicing.domain import Order  # noqa: PLC0415
    from example_apps.invoicing.events import Address, OrderLine  # noqa: PLC0415

    line, home = OrderLine("sku-1", 1, 100), Address("1 Main St", "Oslo", "NO")

    def place(order: Order) -> None:
        order.place("cust-1", [line], home)

    @asynccontextmanager
    async def lifespan(api: FastAPI):  # type: ignore[no-untyped-def]
        async with app.open_async(data) as runtime:
            api.state.runtime = runtime
            yield

    api = FastAPI(lifespan=lifespan)

    @api.post("/async/{order_id}")
    async def place_async(order_id: str) -> dict[str, str]:
        order = await api.state.runtime.execute(Order, order_id, place, create=True)
        return {"position": order.stored_position.token}

    @api.post("/sync/{order_id}")
    def place_sync(order_id: str) -> dict[str, str]:
        order = api.state.runtime.sync.execute(Order, order_id, place, create=True)
        return {"position": order.stored_position.token}

    uvicorn.run(api, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=75)


async def round_(url: str, kind: str, requests: int, clients: int, tag: str) -> tuple[float, float]:
    import httpx  # noqa: PLC0415

    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, keepalive_expiry=30)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await http.post(f"/{kind}/{tag}-{kind}-warm")
        todo = iter(range(requests))

        async def client() -> None:
            for i in todo:
                t0 = time.perf_counter()
                answer = await http.post(f"/{kind}/{tag}-{kind}-{i}")
                latencies.append(time.perf_counter() - t0)
                assert answer.status_code == 200, answer.text

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    latencies.sort()
    return requests / elapsed, latencies[int(0.99 * (len(latencies) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument(
        "--jetstream", action="store_true", help="on a local 3-node JetStream cluster"
    )
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "DATA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return
    import httpx  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        data, cluster = str(Path(tmp) / "data"), None
        if args.jetstream:
            from framework.log.jetstream.cluster import LocalCluster  # noqa: PLC0415

            cluster = LocalCluster.create(Path(tmp) / "nats", nodes=3)
            cluster.start()
            data = cluster.url
        cmd = [sys.executable, __file__, "--serve", str(port), data]
        server = subprocess.Popen(cmd)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/openapi.json", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not start")
            figures: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}
            for r in range(args.runs):
                for kind in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
                    figures[kind].append(
                        asyncio.run(round_(url, kind, args.requests, args.clients, f"r{r}"))
                    )
        finally:
            os.kill(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
            if cluster is not None:
                cluster.stop()
    med = {
        kind: (
            statistics.median(f[0] for f in rounds),
            statistics.median(f[1] for f in rounds),
        )
        for kind, rounds in figures.items()
    }
    for kind, rounds in figures.items():
        rates = ", ".join(f"{f[0]:,.0f}" for f in rounds)
        print(
            f"{kind:>5} endpoints: {med[kind][0]:,.0f} commands/s, p99 {med[kind][1] * 1000:.1f} ms"
            f" (median of {args.runs} rounds of {args.requests}, {args.clients} clients: {rates})"
        )
    print(
        f"ratio async/sync: throughput {med['async'][0] / med['sync'][0]:.2f}x,"
        f" p99 {med['async'][1] / med['sync'][1]:.2f}x"
    )


if __name__ == "__main__":
    main()
